"""The one wait helper: what it returns, what it retries, and what a timeout says."""

from __future__ import annotations

import time

import pytest

from tests.support.waiting import wait_until


def test_wait_until_returns_the_first_truthy_value_and_retries_connection_errors() -> None:
    answers = iter([ConnectionRefusedError("not up yet"), 0, [], ["ready"]])

    def poll() -> list[str]:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    assert wait_until(poll, timeout=5, interval=0.01) == ["ready"]


def test_wait_until_reports_the_last_value_on_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError, match="last=0"):
        wait_until(lambda: 0, timeout=0.3, interval=0.05, message="never")
    assert time.monotonic() - start < 2


def test_an_error_it_does_not_retry_fails_at_once_and_a_timeout_adds_the_diagnosis() -> None:
    with pytest.raises(KeyError):
        wait_until(lambda: {}["missing"], timeout=5)
    with pytest.raises(AssertionError, match="waiting for the log line: last=None\n--- log tail ---"):
        wait_until(
            lambda: None, timeout=0.1, interval=0.05, message="the log line", on_timeout=lambda: "--- log tail ---"
        )
