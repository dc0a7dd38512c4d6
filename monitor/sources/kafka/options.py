"""Which kafka-python consumer settings ``kafka.options`` (``--kafka-option``) may pass through.

A static copy of ``kafka.KafkaConsumer.DEFAULT_CONFIG``'s keys, so validating settings never
imports kafka (seconds at start-up, and ``--help`` should not pay for it).
``tests/package/test_config.py`` asserts it equals the installed kafka-python's, so an upgrade that adds
or renames a setting is noticed.
"""

from __future__ import annotations

CONSUMER_OPTIONS: frozenset[str] = frozenset({
    "allow_auto_create_topics", "api_version", "auto_commit_interval_ms", "auto_offset_reset",
    "bootstrap_servers", "bootstrap_timeout_ms", "check_crcs", "client_dns_lookup", "client_id",
    "client_rack", "connections_max_idle_ms", "consumer_timeout_ms", "default_offset_commit_callback",
    "enable_auto_commit", "enable_incremental_fetch_sessions", "exclude_internal_topics", "fetch_max_bytes",
    "fetch_max_wait_ms", "fetch_min_bytes", "group_id", "group_instance_id", "heartbeat_interval_ms",
    "isolation_level", "kafka_client", "key_deserializer", "max_in_flight_requests_per_connection",
    "max_partition_fetch_bytes", "max_poll_interval_ms", "max_poll_records", "metadata_max_age_ms",
    "metric_group_prefix", "metric_reporters", "metrics_enabled", "metrics_num_samples",
    "metrics_sample_window_ms", "partition_assignment_strategy", "proxy_url", "receive_buffer_bytes",
    "receive_message_max_bytes", "reconnect_backoff_max_ms", "reconnect_backoff_ms", "request_timeout_ms",
    "retry_backoff_ms", "sasl_kerberos_domain_name", "sasl_kerberos_name", "sasl_kerberos_service_name",
    "sasl_mechanism", "sasl_oauth_token_provider", "sasl_plain_password", "sasl_plain_username",
    "security_protocol", "selector", "send_buffer_bytes", "session_timeout_ms", "socket_options",
    "socks5_proxy", "ssl_cafile", "ssl_certfile", "ssl_check_hostname", "ssl_ciphers", "ssl_context",
    "ssl_crlfile", "ssl_keyfile", "ssl_password", "value_deserializer",
})

# Settings the daemon owns itself; passing them as --kafka-option would break offset handling.
RESERVED_OPTIONS: frozenset[str] = frozenset(
    {"enable_auto_commit", "group_id", "bootstrap_servers", "key_deserializer", "value_deserializer"}
)

# ``kafka.client: confluent``: the kafka-python names ``kafka.options`` may hold, as librdkafka
# properties (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md), so one set of
# options (security above all) serves either client. A value is passed as is, except the two below
# that librdkafka spells differently. An option with no equivalent is refused with the client set
# to confluent; ``kafka.librdkafka`` passes any librdkafka property through, on top.
LIBRDKAFKA_NAMES: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
    "ssl_ciphers": "ssl.cipher.suites",
    "ssl_check_hostname": "ssl.endpoint.identification.algorithm",  # True: https, False: none
    "isolation_level": "isolation.level",
    "session_timeout_ms": "session.timeout.ms",
    "heartbeat_interval_ms": "heartbeat.interval.ms",
    "max_poll_interval_ms": "max.poll.interval.ms",
    "fetch_max_bytes": "fetch.max.bytes",
    "fetch_min_bytes": "fetch.min.bytes",
    "fetch_max_wait_ms": "fetch.wait.max.ms",
    "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "check_crcs": "check.crcs",
    "client_rack": "client.rack",
    "group_instance_id": "group.instance.id",
    "metadata_max_age_ms": "metadata.max.age.ms",
    "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "retry_backoff_ms": "retry.backoff.ms",
    "request_timeout_ms": "socket.timeout.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
    "receive_message_max_bytes": "receive.message.max.bytes",
    "allow_auto_create_topics": "allow.auto.create.topics",
    "auto_offset_reset": "auto.offset.reset",  # read by the source itself, as with kafka-python
    "api_version": "broker.version.fallback",  # librdkafka asks the broker; only a fallback
    "client_dns_lookup": "client.dns.lookup",
}

# librdkafka properties the confluent source sets itself (offsets, group, callbacks).
RESERVED_LIBRDKAFKA: frozenset[str] = frozenset({
    "bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
    "on_commit", "error_cb", "stats_cb", "logger", "enable.partition.eof",
})
