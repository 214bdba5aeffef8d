"""Does the ScaledObject asking scale the workload the PredictiveScaler plans for?

KEDA names only the ScaledObject (``ScaledObjectRef``: name, namespace, trigger metadata), not
its ``scaleTargetRef``. A ScaledObject on workload B naming the scaler of workload A would scale
B on A's plan, so its target is read — from the controller's watch-fed cache when it already
shows the ScaledObject on A, else from the API (the namespace's ScaledObjects, one paginated
list; a new ScaledObject is asked about as KEDA creates its HPA, possibly before the watch
delivered it). A namespace's list is kept a while (see :class:`TargetCheck`), so neither a
busy KEDA nor a misconfigured ScaledObject turns into a read per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from predictive_scaler.clock import Clock
from predictive_scaler.errors import ClusterError, NotFoundError
from predictive_scaler.kube.autoscalers import scaled_object_conflicts
from predictive_scaler.kube.transport import path_segment
from predictive_scaler.kube.workloads import WorkloadRef

#: The names of the ScaledObjects whose scaleTargetRef is a workload (None: cannot say now).
Targeting = Callable[[WorkloadRef], Collection[str] | None]
#: The ScaledObjects of a namespace, as the API lists them.
Listing = Callable[[str], Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class Verdict:
    verdict: Literal["ok", "refused", "unknown"]
    message: str = ""


class TargetCheck:
    """``listed`` reads a namespace's ScaledObjects (the API); ``cached`` answers from the watch, when fresh.

    A namespace's list is kept ``ttl_seconds`` while it shows the ScaledObject on the workload,
    ``refused_ttl_seconds`` when it does not (a ScaledObject just created or changed is read again soon).
    """

    def __init__(self, listed: Listing, clock: Clock, *, cached: Targeting | None = None,
                 ttl_seconds: float = 60.0, refused_ttl_seconds: float = 5.0) -> None:
        self._listed = listed
        self._cached = cached
        self.clock = clock
        self.ttl_seconds = float(ttl_seconds)
        self.refused_ttl_seconds = float(refused_ttl_seconds)
        self._lists: dict[str, tuple[Sequence[Mapping[str, Any]], float]] = {}
        self._lock = threading.Lock()

    def check(self, scaled_object: str, scaler: str, target: WorkloadRef) -> Verdict:
        if self._cached is not None:
            try:
                seen = self._cached(target)
            except ClusterError:
                seen = None
            if seen is not None and scaled_object in seen:
                return Verdict("ok")
        now = self.clock.now().timestamp()
        with self._lock:
            kept = self._lists.get(target.namespace)
        if kept is not None and scaled_object in self._scaling(kept[0], target):
            if now - kept[1] <= self.ttl_seconds:
                return Verdict("ok")
        elif kept is not None and now - kept[1] <= self.refused_ttl_seconds:
            return self._refused(scaled_object, scaler, target)
        try:
            items = self._listed(target.namespace)
        except ClusterError as exc:
            return Verdict("unknown", f"cannot read the ScaledObjects of namespace {target.namespace} to check "
                                      f"what ScaledObject {scaled_object} scales: {exc}")
        with self._lock:
            self._lists[target.namespace] = (items, now)
        if scaled_object in self._scaling(items, target):
            return Verdict("ok")
        return self._refused(scaled_object, scaler, target)

    @staticmethod
    def _scaling(items: Sequence[Mapping[str, Any]], target: WorkloadRef) -> set[str]:
        return {c.name for c in scaled_object_conflicts(items, target)}

    @staticmethod
    def _refused(scaled_object: str, scaler: str, target: WorkloadRef) -> Verdict:
        return Verdict("refused", (
            f"ScaledObject {target.namespace}/{scaled_object} does not scale {target.kind} "
            f"{target.namespace}/{target.name}, the workload PredictiveScaler {target.namespace}/{scaler} plans "
            "for: KEDA would scale another workload on its plan. Point the ScaledObject's scaleTargetRef at "
            f"{target.kind}/{target.name}, or its trigger's scalerName at the PredictiveScaler of its own workload"))


class _Lists(Protocol):
    def list_paginated(self, path: str, query: Any = None, *, what: str) -> tuple[list[dict[str, Any]], Any]: ...


def listed_scaled_objects(kube: _Lists) -> Listing:
    """``listed`` for :class:`TargetCheck`: a namespace's ScaledObjects, listed through the kube layer."""

    def read(namespace: str) -> Sequence[Mapping[str, Any]]:
        path = f"/apis/keda.sh/v1alpha1/namespaces/{path_segment(namespace)}/scaledobjects"
        try:
            items, _ = kube.list_paginated(path, what=f"list KEDA ScaledObjects in {namespace}")
        except NotFoundError:
            return []  # KEDA's CRD is not installed: nothing scales a workload through KEDA
        return items

    return read


class _Cache(Protocol):
    def fresh(self, *resources: str) -> bool: ...

    def conflicts(self, target: WorkloadRef) -> Collection[Any]: ...


def cached_scaled_objects(cache: _Cache) -> Targeting:
    """``cached`` for :class:`TargetCheck`: the controller's watch-fed cache, while it is fresh."""
    from predictive_scaler.kube.cache import SCALED_OBJECTS

    def read(target: WorkloadRef) -> frozenset[str] | None:
        if not cache.fresh(SCALED_OBJECTS):
            return None
        return frozenset(c.name for c in cache.conflicts(target) if c.kind == "ScaledObject")

    return read
