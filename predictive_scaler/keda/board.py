"""The latest KEDA answer per scaler: the controller writes it after each reconcile, the gRPC server reads it.

One code path: an answer is only ever made from a reconcile's decision
(:func:`~predictive_scaler.keda.answer.answer_for`). This board holds the answers of the
scalers this process reconciles; the others (another shard's, or every scaler on a replica
that only serves KEDA, or this process's own before its first reconcile after a restart) are
read from the scalers' status (:mod:`~predictive_scaler.keda.status`). Once its last answer is
older than ``stale_after_seconds`` there is no answer: the server says UNAVAILABLE, which
KEDA's HPA treats as a failed metric and so never scales down on (and KEDA's ``fallback``
applies when the ScaledObject sets one). A scaler that cannot be served (another mode, paused,
an invalid spec, a conflicting autoscaler) is withdrawn with the reason, and the server answers
FAILED_PRECONDITION with it; a withdrawal ages out like an answer, so a process that stopped
reconciling a scaler (its shard moved) does not keep refusing it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

from predictive_scaler.clock import Clock
from predictive_scaler.keda.answer import KedaAnswer
from predictive_scaler.kube.workloads import WorkloadRef

#: ``unavailable`` is transient (retry; KEDA's fallback applies); the others are not.
Code = Literal["ok", "unavailable", "failed-precondition", "not-found"]


@dataclass(frozen=True)
class Lookup:
    code: Code
    message: str
    answer: KedaAnswer | None = None
    #: The workload the scaler plans for, when known (even without an answer: from its spec).
    target: WorkloadRef | None = None


class KedaBoard:
    def __init__(self, clock: Clock, stale_after_seconds: float) -> None:
        self.clock = clock
        self.stale_after_seconds = float(stale_after_seconds)
        self._answers: dict[tuple[str, str], KedaAnswer] = {}
        self._withdrawn: dict[tuple[str, str], tuple[str, float]] = {}
        self._version = 0
        self._changed = threading.Condition()

    def publish(self, answer: KedaAnswer) -> None:
        key = (answer.namespace, answer.name)
        with self._changed:
            self._answers[key] = answer
            self._withdrawn.pop(key, None)
            self._version += 1
            self._changed.notify_all()

    def withdraw(self, namespace: str, name: str, why: str | None) -> None:
        """No answer for this scaler any more; ``why`` None forgets it entirely (deleted)."""
        key = (namespace, name)
        with self._changed:
            self._answers.pop(key, None)
            if why is None:
                self._withdrawn.pop(key, None)
            else:
                self._withdrawn[key] = (why, self.clock.now().timestamp())
            self._version += 1
            self._changed.notify_all()

    def lookup(self, namespace: str, name: str, *, stale_ok: bool = False) -> Lookup:
        """The answer for a scaler; ``stale_ok`` also returns an old one."""
        key = (namespace, name)
        with self._changed:
            answer = self._answers.get(key)
            withdrawn = self._withdrawn.get(key)
        now = self.clock.now().timestamp()
        if withdrawn is not None and now - withdrawn[1] <= self.stale_after_seconds:
            return Lookup("failed-precondition", f"PredictiveScaler {namespace}/{name} is not served to KEDA: "
                                                 f"{withdrawn[0]}")
        if answer is None:
            return Lookup("unavailable", f"no decision for PredictiveScaler {namespace}/{name} in this process: it "
                                         "has not been reconciled here since the controller started")
        age = now - answer.decided_at.timestamp()
        if age > self.stale_after_seconds and not stale_ok:
            return Lookup("unavailable", f"the last decision for {namespace}/{name} is {age:.0f} s old (more than "
                                         f"{self.stale_after_seconds:.0f} s): the controller is not reconciling it",
                          target=answer.target)
        return Lookup("ok", answer.why, answer, answer.target)

    def wait(self, version: int, timeout: float) -> int:
        """Block until something changed after ``version`` (or ``timeout`` s); returns the current version."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != version, timeout=timeout)
            return self._version

    @property
    def version(self) -> int:
        with self._changed:
            return self._version
