"""Liveness and readiness, split the way Kubernetes reads them.

- **Liveness** (``/healthz``) answers one question: is this process wedged? It
  fails only when the reconcile loop has not run for ``liveness_timeout``: a
  reconcile started that long ago and has not returned, or scalers exist and no
  reconcile has returned (successfully *or not*) for that long. A dependency that
  is down does not fail it: a reconcile against an unreachable API server fails
  fast, returns, and counts as the loop running — restarting the pod would not
  bring the API server back, only crash-loop the controller. Every call a
  reconcile makes is bounded (HTTP timeouts × retries), so the default timeout
  (5 × the reconcile interval) is above the slowest reconcile a dependency can cause.
- **Readiness** (``/readyz``) fails while the Kubernetes API server or Prometheus
  has been unreachable for longer than ``readiness_timeout``. Each dependency is
  probed on its own thread (a hung one cannot hide the other), every
  ``probe_interval`` seconds, with a bounded timeout; the process starts not ready
  and becomes ready once both have answered.

Time here is ``time.monotonic`` by default (injectable): these are process
facts, not planning inputs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("predictive_scaler.controller")

Now = Callable[[], float]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str


class LoopMonitor:
    """When reconciles start and return; the liveness verdict follows from it."""

    def __init__(self, timeout_s: float, scalers: Callable[[], int] = lambda: 0, now: Now = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._now = now
        self._lock = threading.Condition()
        self._started = now()
        self._last_returned: float | None = None
        self._in_flight: dict[int, float] = {}
        self._next_token = 0
        #: How many scalers the loop has to reconcile.
        self._scalers = scalers

    def begin(self) -> int:
        with self._lock:
            self._next_token += 1
            self._in_flight[self._next_token] = self._now()
            return self._next_token

    def end(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)
            self._last_returned = self._now()
            self._lock.notify_all()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no reconcile is running (True), or ``timeout_s`` passed (False)."""
        deadline = self._now() + timeout_s
        with self._lock:
            while self._in_flight:
                left = deadline - self._now()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.05))
            return True

    def verdict(self) -> Verdict:
        now = self._now()
        with self._lock:
            oldest = min(self._in_flight.values(), default=None)
            last = self._last_returned
            scalers = self._scalers()
        limit = self.timeout_s
        if oldest is not None and now - oldest > limit:
            return Verdict(False, f"wedged: a reconcile has been running for {now - oldest:.0f}s "
                                  f"(limit {limit:g}s)")
        if scalers == 0 and oldest is None:
            return Verdict(True, "ok: no PredictiveScaler to reconcile")
        since = now - (last if last is not None else self._started)
        if since > limit and oldest is None:
            return Verdict(False, f"wedged: no reconcile returned for {since:.0f}s (limit {limit:g}s)")
        return Verdict(True, f"ok: last reconcile returned {since:.0f}s ago")


class DependencyProbe:
    """One dependency checked every ``interval_s`` on its own daemon thread.

    ``check`` returns None when the dependency answered, else why not; it must
    bound its own time (an HTTP timeout). Unreachable longer than ``timeout_s``
    — counted from the first failure after the last success, or from start —
    makes the dependency not ready.
    """

    def __init__(self, name: str, check: Callable[[], str | None], *, timeout_s: float, interval_s: float,
                 now: Now = time.monotonic) -> None:
        self.name = name
        self._check = check
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self._now = now
        self._lock = threading.Lock()
        self._started = now()
        self._last_ok: float | None = None
        self._failing_since: float | None = None
        self._problem = "not checked yet"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def probe_once(self) -> None:
        try:
            problem = self._check()
        except Exception as exc:  # noqa: BLE001 — a probe that raises is a failed probe, reported as such
            problem = f"{type(exc).__name__}: {exc}"
        now = self._now()
        with self._lock:
            if problem is None:
                self._last_ok, self._failing_since, self._problem = now, None, ""
            else:
                if self._failing_since is None:
                    self._failing_since = now if self._last_ok is not None else self._started
                if not self._problem or self._problem != problem:
                    log.warning("dependency unreachable", extra={"dependency": self.name, "detail": problem})
                self._problem = problem

    def verdict(self) -> Verdict:
        now = self._now()
        with self._lock:
            if self._last_ok is None:
                # A probe stuck in its first call has not failed yet, but has not answered either.
                return Verdict(False, f"{self.name}: not reached yet ({self._problem})")
            if self._failing_since is None:
                return Verdict(True, f"{self.name}: ok")
            down = now - self._failing_since
            if down > self.timeout_s:
                return Verdict(False, f"{self.name}: unreachable for {down:.0f}s (limit {self.timeout_s:g}s): "
                                      f"{self._problem}")
            return Verdict(True, f"{self.name}: failing for {down:.0f}s (limit {self.timeout_s:g}s): "
                                 f"{self._problem}")

    def start(self) -> DependencyProbe:
        self._thread = threading.Thread(target=self._run, name=f"probe-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


class Readiness:
    """Ready while every dependency is (see :class:`DependencyProbe`)."""

    def __init__(self, probes: list[DependencyProbe]) -> None:
        self.probes = probes

    def verdict(self) -> Verdict:
        verdicts = [p.verdict() for p in self.probes]
        return Verdict(all(v.ok for v in verdicts), "; ".join(v.message for v in verdicts) or "ok")

    def start(self) -> Readiness:
        for p in self.probes:
            p.start()
        return self

    def stop(self) -> None:
        for p in self.probes:
            p.stop()
