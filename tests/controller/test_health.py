"""Liveness and readiness verdicts (time injected), and the one WSGI app that serves them with /metrics."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest

from predictive_scaler.controller.health import DependencyProbe, LoopMonitor, Readiness, Verdict
from predictive_scaler.controller.telemetry import Telemetry, telemetry_app


class Tick:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _loop(case: str, tick: Tick) -> LoopMonitor:
    scalers = 0 if case.startswith("no-scalers") else 1
    loop = LoopMonitor(30, scalers=lambda: scalers, now=tick)
    if case == "no-scalers-long-idle":
        tick.t += 3600
    elif case == "returned-recently":
        loop.end(loop.begin())
        tick.t += 29
    elif case == "failed-reconciles-keep-returning":  # an outage: each reconcile fails fast, and returns
        for _ in range(10):
            tick.t += 10
            loop.end(loop.begin())
    elif case == "nothing-returned-for-too-long":
        loop.end(loop.begin())
        tick.t += 31
    elif case == "one-reconcile-stuck":
        loop.begin()
        tick.t += 31
    elif case == "stuck-among-healthy":
        loop.begin()
        for _ in range(4):
            tick.t += 10
            loop.end(loop.begin())
    return loop


@pytest.mark.parametrize(("case", "alive"), [
    ("no-scalers-long-idle", True),
    ("returned-recently", True),
    ("failed-reconciles-keep-returning", True),
    ("nothing-returned-for-too-long", False),
    ("one-reconcile-stuck", False),
    ("stuck-among-healthy", False),
], ids=lambda v: str(v))
def test_liveness_fails_only_when_the_loop_does_not_run(case: str, alive: bool) -> None:
    verdict = _loop(case, Tick()).verdict()
    assert verdict.ok is alive, verdict.message
    if not alive:
        assert "wedged" in verdict.message and "limit 30s" in verdict.message


def test_wait_idle_returns_once_running_reconciles_return() -> None:
    loop = LoopMonitor(30)
    token = loop.begin()
    assert loop.wait_idle(0.05) is False
    loop.end(token)
    assert loop.wait_idle(0.05) is True


def _probe(answers: list[str | None], tick: Tick) -> DependencyProbe:
    queue = list(answers)
    return DependencyProbe("kubernetes", lambda: queue.pop(0), timeout_s=10, interval_s=1, now=tick)


@pytest.mark.parametrize(("answers", "step", "ready", "words"), [
    ([], 0, False, "not reached yet"),
    (["refused"], 20, False, "not reached yet"),
    ([None], 0, True, "ok"),
    ([None, "refused"], 5, True, "failing for"),
    ([None, "refused", "refused"], 6, False, "unreachable for 12s (limit 10s): refused"),
    ([None, "refused", None], 30, True, "ok"),
], ids=["unchecked", "never-answered", "answered", "down-within-limit", "down-beyond-limit", "back"])
def test_readiness_fails_while_a_dependency_is_unreachable_too_long(answers: list[str | None], step: float,
                                                                    ready: bool, words: str) -> None:
    tick = Tick()
    probe = _probe(answers, tick)
    for _ in answers:
        probe.probe_once()
        tick.t += step
    verdict = Readiness([probe]).verdict()
    assert verdict.ok is ready and words in verdict.message, verdict.message


def test_a_probe_that_raises_is_a_failed_probe() -> None:
    def boom() -> str | None:
        raise OSError("no route")

    tick = Tick()
    probe = DependencyProbe("prometheus", boom, timeout_s=1, interval_s=1, now=tick)
    probe.probe_once()
    tick.t += 5
    assert "not reached yet (OSError: no route)" in probe.verdict().message


def _get(app: Callable[..., Any], path: str) -> tuple[str, bytes]:
    seen: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"] = status

    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "QUERY_STRING": "", "wsgi.input": io.BytesIO(),
               "SERVER_NAME": "x", "SERVER_PORT": "8080", "wsgi.url_scheme": "http"}
    body = b"".join(app(environ, start_response))
    return seen["status"], body


@pytest.mark.parametrize(("path", "status", "text"), [
    ("/healthz", "200 OK", b"alive"),
    ("/readyz", "503 Service Unavailable", b"prometheus: unreachable"),
    ("/metrics", "200 OK", b"predictive_scaler_"),
    ("/", "404 Not Found", b"try /metrics, /healthz or /readyz"),
], ids=["healthz", "readyz", "metrics", "unknown"])
def test_one_app_serves_metrics_and_both_probes(path: str, status: str, text: bytes) -> None:
    app = telemetry_app(Telemetry().registry, lambda: Verdict(True, "alive"),
                        lambda: Verdict(False, "prometheus: unreachable for 61s"))
    got_status, body = _get(app, path)
    assert got_status == status and text in body
