"""Real HTTP scrapes of the daemon's /metrics, parsed with prometheus_client's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> Samples:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def http_status(port: int, path: str, host: str = "127.0.0.1") -> int:
    return http_answer(port, path, host)[0]


def http_answer(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    """The status and the body (stripped) of a GET of ``path``; an error status is an answer too."""
    import urllib.error

    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode().strip()
