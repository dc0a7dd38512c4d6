"""Everything the monitor knows about Kafka, in one place: the two sources (kafka-python's,
:mod:`~monitor.sources.kafka.source`, and librdkafka's, :mod:`~monitor.sources.kafka.confluent`),
the clients the scale-out roles build (:mod:`~monitor.sources.kafka.clients`), the option names the
settings may pass through (:mod:`~monitor.sources.kafka.options`, light), the policy both clients
follow (:mod:`~monitor.sources.kafka.policy`, imports neither), a partition's position checked
against its log (:mod:`~monitor.sources.kafka.positions`), broker backoff and lag reading
(:mod:`~monitor.sources.kafka.reconnect`) and every use of kafka-python internals
(:mod:`~monitor.sources.kafka.internals`).

Nothing is imported here: validating settings imports ``options`` without paying for a client.
"""
