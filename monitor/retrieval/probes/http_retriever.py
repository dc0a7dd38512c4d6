"""The golden probe's HTTP retriever: one JSON request per query to a search endpoint.

The request is built from the configured :class:`~monitor.retrieval.probes.request_template.RequestTemplate`
and URL, the ranked ids are read from the response with the configured ids path. Standard library
the shared client (:mod:`monitor.outbound`: one deadline for the whole call, the answer capped by
``k``, no redirects). A failed, oversized or unreadable response raises ``ProbeError`` and is counted
by reason in ``errors``; the golden probe decides how many of those a run may absorb.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from monitor import outbound
from monitor.deadline import Deadline
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.ids_path import extract_ids, parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate, fill_url

if TYPE_CHECKING:
    from monitor.retrieval.settings import HttpRetrieverSettings

# why one request failed (embmon_probe_request_errors_total{probe, reason}); bounded
ERROR_REASONS = ("connect", "timeout", "oversized", "redirect", "protocol", "http_error", "not_json", "bad_response")
# an answer is bounded by what was asked: k results of at most RESULT_BYTES (an id, a score, a
# payload) and VALUES_PER_RESULT JSON values each, and a floor
RESULT_BYTES = 64 * 1024
VALUES_PER_RESULT = 4096
ANSWER_FLOOR_BYTES = 64 * 1024
VALUES_FLOOR = 4096


class HttpRetriever:
    """One request per query to a search endpoint (:mod:`monitor.outbound`; no connection reuse)."""

    def __init__(self, settings: HttpRetrieverSettings):
        self.settings = settings
        self.template = None if settings.request_template is None else RequestTemplate(settings.request_template)
        self.steps = parse_ids_path(settings.ids_path)
        parts = urllib.parse.urlsplit(settings.url)
        self.where = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"  # never the query
        self.errors: Counter[str] = Counter()  # failed requests by reason (ERROR_REASONS)
        self._lock = threading.Lock()
        self.needs_vector = (self.template is not None and "vector" in self.template.names) or (
            "{{vector}}" in settings.url.replace(" ", "")
        )

    def search(
        self, query_id: str, text: str | None, vector: Iterable[float] | None, k: int, deadline: Deadline
    ) -> list[str]:
        """The top ``k`` ids the endpoint returns for one query."""
        values = {
            "text": text if text is not None else "",
            "vector": None if vector is None else [float(x) for x in vector],
            "k": k,
            "query_id": query_id,
        }
        url = fill_url(self.settings.url, values)
        body = None if self.settings.method == "GET" or self.template is None else self.template.render(values)
        headers = {"Accept": "application/json", **self.settings.headers}
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        cap = ANSWER_FLOOR_BYTES + k * RESULT_BYTES
        if deadline.remaining() <= 0:  # the run's time is up: no request, none counted
            deadline.check()
        try:
            response = outbound.request(
                url, method=self.settings.method, body=body, headers=headers, max_body=cap,
                timeout=min(self.settings.request_timeout_seconds, deadline.remaining()),
            )
            if not 200 <= response.status < 300:
                self._count("http_error")
                raise ProbeError(f"HTTP {response.status} from {self.where}")
            document = outbound.parse_json(response.body, VALUES_FLOOR + k * VALUES_PER_RESULT)
        except outbound.OutboundError as exc:
            self._count(exc.reason)
            if exc.reason == "timeout" and deadline.remaining() <= 0:
                deadline.check()
            raise ProbeError(f"request to {self.where} failed ({exc.reason}): {exc}") from None
        except ValueError:
            self._count("not_json")
            raise ProbeError(f"the answer of {self.where} is not JSON") from None
        try:
            return extract_ids(document, self.steps)[:k]
        except ProbeError:
            self._count("bad_response")
            raise

    def _count(self, reason: str) -> None:
        with self._lock:
            self.errors[reason] += 1

    def error_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.errors)
