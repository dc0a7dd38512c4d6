from tests.support.logs import tracebacks

OURS = """2026-11-24 20:06:07,177 INFO monitor.lifecycle: received SIGTERM
2026-11-24 20:06:08,817 ERROR monitor.ingest: source poll failed
Traceback (most recent call last):
  File "x.py", line 1, in poll
ValueError: boom
2026-11-24 20:06:08,852 INFO monitor.service: embedding-monitor stopped
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
