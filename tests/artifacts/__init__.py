"""Generated alerts, dashboards and the metric catalog (monitor/artifacts, monitor/catalog/)."""
