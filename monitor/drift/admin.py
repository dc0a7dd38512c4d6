"""The drift admin endpoints: re-pin a reference (``POST /admin/baseline``), explain the last cycle.

Both need the bearer token ``http.admin_token`` (without one configured every ``/admin/*`` route
answers 403, :mod:`monitor.server.exporter`). The CLI clients (``embedding-monitor baseline``,
``embedding-monitor drift explain``) take the paths from here, so this module stays light:
no numpy, no torch, no river.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from monitor.drift.attribution.explain import explanation
from monitor.server.admin_routes import Response, json_response, model_and_stream

BASELINE_PATH = "/admin/baseline"
EXPLAIN_PATH = "/admin/drift/explain"


class DriftAdmin(Protocol):
    """What the endpoints need of the drift component."""

    context: Any  # its ``registry`` holds the streams whose windows a capture pins

    def last_results(self, model: str, stream: str) -> tuple[list[tuple[str, str]], dict[tuple[str, str], Any]]: ...

    def capture_current(self, states: Iterable[Any]) -> list[Any]: ...


def add_drift_routes(add_route: Callable[..., None], drift: DriftAdmin) -> None:
    add_route(BASELINE_PATH, lambda environ: capture_baseline(drift, environ), methods=("POST",))
    add_route(EXPLAIN_PATH, lambda environ: explain_last_cycle(drift, environ), methods=("GET",))


def explain_last_cycle(drift: DriftAdmin, environ: Mapping[str, Any]) -> Response:
    """``GET /admin/drift/explain?model=M[&stream=S]``: the last cycle's verdict, ranked regions, exemplar ids."""
    model, stream, refused = model_and_stream(environ)
    if refused is not None:
        return refused
    known, results = drift.last_results(model, stream)
    if not known:
        return json_response(404, {"error": f"no records seen for {_named(model, stream)}"})
    if not results:
        return json_response(404, {"error": f"no drift cycle has tested {_named(model, stream)} yet"})
    return json_response(200, {"explanations": [explanation(*key, result) for key, result in results.items()]})


def capture_baseline(drift: DriftAdmin, environ: Mapping[str, Any]) -> Response:
    """``POST /admin/baseline?model=M[&stream=S]``: pin the current window(s) as the reference."""
    model, stream, refused = model_and_stream(environ)
    if refused is not None:
        return refused
    states = [s for s in drift.context.registry if s.model == model and (not stream or s.stream == stream)]
    if not states:
        return json_response(404, {"error": f"no records seen for {_named(model, stream)}"})
    try:
        refs = drift.capture_current(states)
    except ValueError as exc:
        return json_response(409, {"error": str(exc)})
    return json_response(200, {"references": [r.describe() for r in refs]})


def _named(model: str, stream: str) -> str:
    """How an answer names what was asked for: one stream, or every stream of a model."""
    return f"{model}/{stream}" if stream else f"model {model}"
