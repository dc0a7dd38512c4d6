"""Online retrieval probes: golden sets, ANN recall, click feedback, reference-model agreement.

One module per probe kind; ``component`` schedules them as daemon jobs and ``export`` turns their
published results into metric families. The metric arithmetic is the engine's
(:mod:`monitor.retrieval.metrics`, :mod:`monitor.retrieval.stats`); see docs/retrieval.md,
"Retrieval probes". ``request_template``, ``ids_path``, ``http_retriever`` and ``deadline`` use the
standard library only, so the settings can validate with them without loading numpy or torch.
"""
