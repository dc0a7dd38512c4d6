"""The golden probe's HTTP retriever: one JSON request per query to a search endpoint.

The request is built from the configured :class:`~monitor.retrieval.probes.request_template.RequestTemplate`
and URL, the ranked ids are read from the response with the configured ids path. Standard library
only (``urllib``; no connection reuse). A failed, oversized or unreadable response raises
``ProbeError``; the golden probe decides how many of those a run may absorb.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import TYPE_CHECKING

from monitor.deadline import Deadline
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.ids_path import extract_ids, parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate, fill_url

if TYPE_CHECKING:
    from monitor.retrieval.settings import HttpRetrieverSettings

MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class HttpRetriever:
    """One request per query to a search endpoint (stdlib ``urllib``; no connection reuse)."""

    def __init__(self, settings: HttpRetrieverSettings):
        self.settings = settings
        self.template = None if settings.request_template is None else RequestTemplate(settings.request_template)
        self.steps = parse_ids_path(settings.ids_path)
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
        request = urllib.request.Request(url, data=body, headers=headers, method=self.settings.method)  # noqa: S310 - below
        timeout = min(self.settings.request_timeout_seconds, deadline.remaining())
        if timeout <= 0:
            deadline.check()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - settings allow http(s) only
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise ProbeError(f"HTTP {exc.code} from {self.settings.url}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            raise ProbeError(f"request to {self.settings.url} failed: {reason}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ProbeError("response larger than 64 MiB")
        try:
            document = json.loads(raw)
        except ValueError:
            raise ProbeError(f"response is not JSON: {raw[:60]!r}") from None
        return extract_ids(document, self.steps)[:k]
