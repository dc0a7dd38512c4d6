"""How the serving probe reaches an embedding endpoint: HTTP (OpenAI-compatible or a request
template) or an in-process sentence-transformers encoder.

Every backend's ``embed(texts, timeout)`` returns one row per text (``None`` for an unusable one)
and the reasons of the unusable rows, or raises :class:`~monitor.serving.responses.ServingError`.
The API key is read once, sent as ``Authorization: Bearer``, and never appears in a message,
a log line or a metric (tests/serving/test_faults.py checks the log).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from monitor import outbound
from monitor.retrieval.probes.ids_path import parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate
from monitor.serving.responses import MAX_DIM, ServingError, check_rows, parse_embeddings
from monitor.serving.settings import TEMPLATE_PLACEHOLDERS, EndpointSettings

Rows = tuple[list[np.ndarray | None], Counter[str]]
# an answer's size is bounded by what was asked: texts x dimension numbers of at most BYTES_PER_NUMBER
# bytes each ("-1.2345678901234567e-308, " is 26), ROW_OVERHEAD_BYTES of wrapping per row, and a floor
BYTES_PER_NUMBER = 32
ROW_OVERHEAD_BYTES = 1024
ANSWER_FLOOR_BYTES = 64 * 1024
VALUES_PER_ROW = 64  # JSON values besides the numbers a row may bring (its object, index, ...)
VALUES_FLOOR = 4096
# the shared client's reasons as embmon_serving_errors_total's
_REASONS = {"connect": "connect", "timeout": "timeout", "oversized": "oversized", "redirect": "redirect",
            "protocol": "bad_response"}


class Backend(Protocol):
    dim: int | None  # the dimension every row must have (None: any); the probe sets it once known

    def embed(self, texts: Sequence[str], timeout: float) -> Rows: ...

    def close(self) -> None: ...


def make_backend(endpoint: EndpointSettings, device: str | None = None) -> Backend:
    if endpoint.kind == "encoder":
        return EncoderBackend(endpoint, device)
    return HttpBackend(endpoint)


def read_api_key(endpoint: EndpointSettings) -> str | None:
    """The key from ``api_key_file`` (its first line) or ``api_key_env``; a ``ValueError`` that names
    the setting, never the key, when it cannot be read or cannot be sent in a header."""
    key = _read_key(endpoint)
    if key is not None and not (key.isascii() and key.isprintable()):
        raise ValueError(f"serving: model {endpoint.model}: the API key holds characters a header cannot carry")
    return key


def _read_key(endpoint: EndpointSettings) -> str | None:
    if endpoint.api_key_file is not None:
        try:
            text = endpoint.api_key_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise ValueError(f"serving: model {endpoint.model}: api_key_file cannot be read") from None
        key = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not key:
            raise ValueError(f"serving: model {endpoint.model}: api_key_file is empty")
        return key
    if endpoint.api_key_env is not None:
        key = os.environ.get(endpoint.api_key_env, "").strip()
        if not key:
            raise ValueError(f"serving: model {endpoint.model}: the variable named by api_key_env is empty")
        return key
    return None


class HttpBackend:
    """One POST per call (:mod:`monitor.outbound`: one deadline, answers capped by what was asked, no
    redirects); OpenAI's body or the template's."""

    def __init__(self, endpoint: EndpointSettings):
        self.endpoint = endpoint
        assert endpoint.url is not None
        self.url = endpoint.url
        self._key = read_api_key(endpoint)
        self.template = (RequestTemplate(endpoint.request_template, placeholders=TEMPLATE_PLACEHOLDERS)
                         if endpoint.kind == "template" and endpoint.request_template is not None else None)
        self.steps = parse_ids_path(endpoint.vectors_path)
        self.dim = endpoint.dim

    def body(self, texts: Sequence[str]) -> bytes:
        if self.template is not None:
            return self.template.render({"texts": list(texts), "model": self.endpoint.api_model or ""})
        payload: dict[str, object] = {"input": list(texts)}
        if self.endpoint.api_model is not None:
            payload["model"] = self.endpoint.api_model
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()

    def max_body(self, count: int) -> int:
        """The most answer bytes ``count`` texts can need: their numbers (the dimension when known,
        :data:`MAX_DIM` before) at :data:`BYTES_PER_NUMBER` each, a row's wrapping, and a floor."""
        dim = self.dim if self.dim is not None else MAX_DIM
        return ANSWER_FLOOR_BYTES + count * (dim * BYTES_PER_NUMBER + ROW_OVERHEAD_BYTES)

    def embed(self, texts: Sequence[str], timeout: float) -> Rows:
        headers = {"Content-Type": "application/json", "Accept": "application/json", **self.endpoint.headers}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        cap = self.max_body(len(texts))
        try:
            response = outbound.request(self.url, method="POST", body=self.body(texts), headers=headers,
                                        timeout=timeout, max_body=cap)
        except outbound.OutboundError as exc:
            raise ServingError(_REASONS[exc.reason], str(exc)) from None
        content_type = response.headers.get("content-type", "")
        if response.status >= 400:
            retry_after = _seconds(response.headers.get("retry-after"))
            head = response.body[:256].lstrip().lower()
            code = response.status
            if code not in (401, 403, 429) and ("html" in content_type.lower() or head.startswith(b"<")):
                raise ServingError("html", f"HTTP {code} with an HTML page (a proxy's?)", retry_after)
            if code == 429:
                raise ServingError("rate_limited", "HTTP 429 (rate limited)", retry_after)
            if code in (401, 403):
                raise ServingError("auth", f"HTTP {code}: the endpoint refused the credentials")
            raise ServingError("http_error", f"HTTP {code}", retry_after)
        if not 200 <= response.status < 300:
            raise ServingError("http_error", f"HTTP {response.status}")
        dim = self.dim if self.dim is not None else MAX_DIM
        return parse_embeddings(response.body, len(texts), self.dim, self.steps, content_type,
                                max_values=len(texts) * (dim + VALUES_PER_ROW) + VALUES_FLOOR)

    def close(self) -> None:
        pass


class EncoderBackend:
    """A sentence-transformers model in this process (the ``encoder`` extra), loaded at the first call."""

    def __init__(self, endpoint: EndpointSettings, device: str | None):
        self.endpoint = endpoint
        self.device = device
        self.dim = endpoint.dim
        self._model: object | None = None
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str], timeout: float) -> Rows:
        with self._lock:
            try:
                if self._model is None:
                    from sentence_transformers import SentenceTransformer

                    self._model = SentenceTransformer(str(self.endpoint.encoder_path), device=self.device or "cpu")
                vectors = self._model.encode(  # type: ignore[attr-defined]
                    list(texts), batch_size=max(1, len(texts)), convert_to_numpy=True, show_progress_bar=False,
                )
            except Exception as exc:  # noqa: BLE001 - a model that cannot run is an endpoint error, counted
                raise ServingError("encoder", f"the encoder failed: {type(exc).__name__}") from None
        return check_rows(np.asarray(vectors), self.dim)

    def close(self) -> None:
        self._model = None


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or not 0 <= seconds <= 86_400 else seconds
