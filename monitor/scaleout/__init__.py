"""Past one process: replicas publish their exact partial state to Kafka, reducers merge it.

A daemon runs in one of three roles (``scale_out.role``, docs/deployment.md "Scaling out"):

* ``single`` (the default): one process consumes, computes and exports everything; nothing here
  is used;
* ``replica``: one of N consumers in the group. It ingests its partitions and checkpoints as
  usual, and publishes the state of each checkpoint (its sub-windows' exact sums and reservoir
  shares, plus a manifest of what it holds and the offsets that reflects) to the partials topic
  (:mod:`monitor.scaleout.publisher`) before those offsets are committed
  (:mod:`monitor.scaleout.replica`). It exports its own ingest health only;
* ``reducer``: reads the partials topic (:mod:`monitor.scaleout.intake`), keeps per replica the
  newest complete publication (:mod:`monitor.scaleout.table`), merges them exactly per
  sub-window, and runs the refresh, drift cycles and probes on the merged windows
  (:mod:`monitor.scaleout.reducer`): the only exporter of global gauges. One reducer reads every
  partition; several form a consumer group (``scale_out.reducer_group``) and each merges and
  exports the streams of its partitions (a stream's partials all go to one partition), so every
  global gauge is exported by exactly one reducer (:class:`monitor.scaleout.export.OwnedOnly`).

Wire format of the partials topic: :mod:`monitor.scaleout.partials`.
"""
