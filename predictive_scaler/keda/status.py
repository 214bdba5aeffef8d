"""KEDA answers read from the PredictiveScalers themselves: their spec and ``status.keda``.

The reconciling process writes each decision's answer to the scaler's status
(:meth:`~predictive_scaler.keda.answer.KedaAnswer.to_status`), so any process can serve it: a
second replica that only serves KEDA while the controller restarts, another shard, or the
controller itself before its first reconcile after a start. Reading the object also tells
what the board of one process cannot: that no such scaler exists (NOT_FOUND, permanent), or
that it is in another mode or refused (FAILED_PRECONDITION), and which workload it plans for.

:func:`judge` is pure. :class:`ScalerStatusReader` reads one object per scaler through the
injected ``get_scaler`` (the kube layer's GET) and keeps it until the next decision is due,
so a busy KEDA costs about one read per scaler per control interval, never one per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from predictive_scaler.clock import Clock
from predictive_scaler.errors import ClusterError, ConfigError, NotFoundError
from predictive_scaler.keda.answer import STATUS_FIELD, answer_from_status, workload_of
from predictive_scaler.keda.board import Lookup
from predictive_scaler.spec import ScalerSpec

#: Cached reads kept before expired ones are swept (names KEDA asks for that do not exist count too).
_SWEEP_ABOVE = 10_000


def judge(obj: Mapping[str, Any], namespace: str, name: str, now: datetime, *, stale_after_seconds: float,
          stale_ok: bool = False) -> Lookup:
    """What KEDA gets for this PredictiveScaler object, read from its spec and status."""
    try:
        spec = ScalerSpec.from_dict(obj.get("spec") or {})
    except ConfigError as exc:
        return Lookup("failed-precondition", f"PredictiveScaler {namespace}/{name} is not served to KEDA: its spec "
                                             f"is invalid ({exc})")
    target = workload_of(spec, namespace)
    if spec.mode != "keda":
        return Lookup("failed-precondition", f"PredictiveScaler {namespace}/{name} is not served to KEDA: its mode "
                                             f"is {spec.mode}, not keda", target=target)
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    ready = _condition(status, "Ready")
    if ready is not None and ready.get("status") == "False":
        # The last reconcile refused the scaler (paused, invalid, a conflicting autoscaler, no target).
        return Lookup("failed-precondition", f"PredictiveScaler {namespace}/{name} is not served to KEDA: "
                                             f"{ready.get('reason')}: {ready.get('message')}", target=target)
    block = status.get(STATUS_FIELD)
    if not isinstance(block, Mapping) or status.get("mode") not in (None, "keda"):
        return Lookup("unavailable", f"no decision for PredictiveScaler {namespace}/{name} yet: the controller has "
                                     "not reconciled it in mode keda (it does within one interval of starting)",
                      target=target)
    try:
        answer = answer_from_status(block, spec, namespace=namespace, name=name)
    except ConfigError as exc:
        return Lookup("unavailable", str(exc), target=target)
    age = now.timestamp() - answer.decided_at.timestamp()
    if age > stale_after_seconds and not stale_ok:
        return Lookup("unavailable", f"the last decision for {namespace}/{name} is {age:.0f} s old (more than "
                                     f"{stale_after_seconds:.0f} s): no controller is reconciling it", target=target)
    return Lookup("ok", answer.why, answer, target)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


@dataclass(frozen=True)
class _Read:
    obj: Mapping[str, Any] | None
    #: Why there is no object: (code, message).
    failure: tuple[str, str] | None
    fresh_until: float


class ScalerStatusReader:
    """PredictiveScaler objects read on demand, each kept until its next decision is due.

    ``get_scaler(namespace, name)`` returns the object, raises NotFoundError when there is
    none and ClusterError when the API cannot say.
    """

    def __init__(self, get_scaler: Callable[[str, str], Mapping[str, Any]], clock: Clock, *,
                 stale_after_seconds: float, interval_seconds: float, min_refresh_seconds: float = 5.0) -> None:
        self._get = get_scaler
        self.clock = clock
        self.stale_after_seconds = float(stale_after_seconds)
        self.interval_seconds = float(interval_seconds)
        self.min_refresh_seconds = float(min_refresh_seconds)
        self._reads: dict[tuple[str, str], _Read] = {}
        self._lock = threading.Lock()
        #: API reads made (a test counts them).
        self.reads = 0

    def lookup(self, namespace: str, name: str, *, stale_ok: bool = False) -> Lookup:
        read = self._read(namespace, name)
        if read.failure is not None:
            code, message = read.failure
            return Lookup(code, message)  # type: ignore[arg-type]
        assert read.obj is not None
        return judge(read.obj, namespace, name, self.clock.now(), stale_after_seconds=self.stale_after_seconds,
                     stale_ok=stale_ok)

    def _read(self, namespace: str, name: str) -> _Read:
        key = (namespace, name)
        now = self.clock.now().timestamp()
        with self._lock:
            kept = self._reads.get(key)
        if kept is not None and now < kept.fresh_until:
            return kept
        read = self._fetch(namespace, name, now)
        with self._lock:
            if len(self._reads) >= _SWEEP_ABOVE:
                self._reads = {k: r for k, r in self._reads.items() if now < r.fresh_until}
            self._reads[key] = read
        return read

    def _fetch(self, namespace: str, name: str, now: float) -> _Read:
        soon = now + self.min_refresh_seconds
        self.reads += 1
        try:
            obj = self._get(namespace, name)
        except NotFoundError:
            return _Read(None, ("not-found", f"no PredictiveScaler {name!r} in namespace {namespace} (the "
                                             "ScaledObject's namespace): create it, or set the trigger's scalerName "
                                             "to an existing one"), soon)
        except ClusterError as exc:
            return _Read(None, ("unavailable", f"cannot read PredictiveScaler {namespace}/{name} from the "
                                               f"Kubernetes API: {exc}"), soon)
        block = ((obj.get("status") or {}).get(STATUS_FIELD)) if isinstance(obj.get("status"), Mapping) else None
        decided = _decided_at(block)
        if decided is None:
            return _Read(obj, None, soon)
        # The next decision is due one interval after this one: read again then, not before.
        due = decided + self.interval_seconds
        return _Read(obj, None, max(soon, min(due, now + self.interval_seconds)))


def _decided_at(block: Any) -> float | None:
    if not isinstance(block, Mapping):
        return None
    try:
        return datetime.fromisoformat(str(block["decidedAt"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None
