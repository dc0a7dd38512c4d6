from tests.support.logs import tracebacks

OURS = """2026-11-24 20:06:07,177 INFO monitor.daemon.lifecycle: received SIGTERM
2026-11-24 20:06:08,817 ERROR monitor.daemon.ingest: source poll failed
Traceback (most recent call last):
  File "x.py", line 1, in poll
ValueError: boom
2026-11-24 20:06:08,852 INFO monitor.daemon.service: embedding-monitor stopped
"""
CLIENT_RACE = """2026-11-24 20:06:08,817 ERROR kafka.net.transport: <KafkaTCPTransport [none] (closed)>: Error receiving
Traceback (most recent call last):
  File "transport.py", line 110, in _sock_recv
AttributeError: 'NoneType' object has no attribute 'recv'
2026-11-24 20:06:08,818 ERROR kafka.cluster: Metadata refresh: failed Cancelled
"""


def test_our_tracebacks_are_found_and_the_client_close_race_is_not():
    found = tracebacks(OURS + CLIENT_RACE)
    assert len(found) == 1 and "ValueError: boom" in found[0] and "stopped" not in found[0]
    assert tracebacks(CLIENT_RACE) == []
    assert tracebacks("Traceback (most recent call last):\n  raise SystemExit") != []


def _selector_task_error(error: str, frame: str = "_read_from_sock") -> str:
    return f"""2026-11-26 10:58:00,509 ERROR kafka.net.selector: Unhandled exception in task <kafka.net.selector.Task>
Traceback (most recent call last):
  File "kafka/net/selector.py", line 95, in run
  File "kafka/net/transport.py", line 101, in {frame}
    self._protocol.data_received(recvd_data)
{error}
"""


def test_the_read_task_waking_after_close_is_client_noise_and_nothing_else_from_the_selector_is():
    assert tracebacks(_selector_task_error("ValueError: Invalid file descriptor: -1")) == []
    assert tracebacks(_selector_task_error(
        "AttributeError: 'NoneType' object has no attribute 'data_received'")) == []
    assert tracebacks(_selector_task_error("KeyError: 3")) != []
    assert tracebacks(_selector_task_error(
        "AttributeError: 'NoneType' object has no attribute 'data_received'", frame="_write_to_sock")) != []
