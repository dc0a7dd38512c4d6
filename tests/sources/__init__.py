"""Sources and the decoding of what they deliver (monitor/sources, monitor/decoding.py, monitor/json_*)."""
