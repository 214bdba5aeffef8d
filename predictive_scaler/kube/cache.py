"""One shared, watch-fed cache of the cluster objects every reconcile needs.

A reconcile used to LIST every live pod in the cluster (for the free GPUs), the GPU
nodes, and the HPAs and ScaledObjects of its namespace: N scalers made N cluster-wide
pod lists per period, so API load and controller CPU grew with scalers × pods.
:class:`ClusterCache` instead runs one *reflector* per resource — a paginated LIST
(``limit``/``continue``) that yields a resourceVersion, then a WATCH from it — and a
reconcile reads memory. What each reflector keeps is compact (a pod is its namespace,
labels, node, GPU request and readiness class; nothing else of the object stays).

Pods are watched cluster-wide with the server-side field selector that drops finished
pods (``status.phase`` neither Succeeded nor Failed). No label marks "a pod on a GPU
node", and a field selector on ``spec.nodeName`` only takes one node, so the GPU
accounting filters by node in memory: per node, the GPUs requested (and held by
placeholders) are kept up to date on every event, not summed per reconcile.

Staleness, bounded and stated: while a watch stream is open, the cache lags the API
server by the delivery of one event. A watch ends by itself every
``watch_timeout_seconds`` and is re-opened from the last resourceVersion; a broken one
(or one that ends Gone: the resourceVersion is too old) is re-listed. Every ``resync_seconds`` the
resource is re-listed anyway (events a server failed to deliver cannot outlive that).
:meth:`ClusterCache.stale_for` says, per resource, how long ago it was last known
current (0 while its watch is connected); :meth:`ClusterCache.fresh` is False when that
exceeds ``max_staleness_seconds`` or the first list has not finished. The controller
(controller/ports.py) never scales a target down on a stale cache, grants no placeholder
GPUs it cannot see, and falls back to direct (paginated) reads for conflicts and pods.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from predictive_scaler.errors import ClusterError, GoneError, NotFoundError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.autoscalers import (
    ConflictingAutoscaler,
    hpa_conflicts,
    scaled_object_conflicts,
)
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.pods import (
    LIVE_PODS,
    NodeCapacity,
    PodCounts,
    count_pods,
    node_gpus,
    pod_gpu_request,
)
from predictive_scaler.kube.workloads import WorkloadRef

log = logging.getLogger("predictive_scaler.kube.cache")

#: Resources the cache watches (the keys of :meth:`ClusterCache.stale_for`).
PODS, NODES, HPAS, SCALED_OBJECTS = "pods", "nodes", "horizontalpodautoscalers", "scaledobjects"
#: Longest the cache may go without being known current before decisions treat it as stale.
MAX_STALENESS_SECONDS = 120.0
#: A watch is re-opened this often (well under the staleness bound, so a quiet stream never looks stale).
WATCH_TIMEOUT_SECONDS = 50
#: Full re-list period: bounds the life of any event the server failed to deliver.
RESYNC_SECONDS = 600.0


# ------------------------------------------------------------ label selectors ---

_REQUIREMENT = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|!=|=|\s+in\s+|\s+notin\s+)\s*(?:\((?P<set>[^)]*)\)|(?P<value>[A-Za-z0-9_.-]*)))?\s*"
)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op in ("=", "in"):
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # "!=", "notin": absent keys match


def parse_selector(selector: str) -> tuple[Requirement, ...]:
    """A label selector in its string form (as ``/scale`` reports it) as requirements;
    ClusterError naming the part that is not one."""
    parts = _split_top_level(selector)
    out = []
    for part in parts:
        m = _REQUIREMENT.fullmatch(part)
        if m is None or (m.group("neg") and m.group("op")):
            raise ClusterError(f"label selector {selector!r}: cannot read {part.strip()!r}")
        key, op = m.group("key"), (m.group("op") or "").strip()
        if not op:
            out.append(Requirement(key, "!exists" if m.group("neg") else "exists"))
        elif op in ("in", "notin"):
            if m.group("set") is None:
                raise ClusterError(f"label selector {selector!r}: {op} needs a (set)")
            out.append(Requirement(key, op, frozenset(v.strip() for v in m.group("set").split(","))))
        else:
            if m.group("set") is not None:
                raise ClusterError(f"label selector {selector!r}: {op} takes one value")
            out.append(Requirement(key, "!=" if op == "!=" else "=", frozenset({m.group("value") or ""})))
    return tuple(out)


def _split_top_level(selector: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


# ------------------------------------------------------------- compact records ---


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str | None
    gpus: int
    placeholder: bool
    #: count_pods' class: "ready", "starting", "unscheduled", "terminating" or "" (finished).
    state: str


def pod_record(pod: Mapping[str, Any], gpu_resource: str = manifests.GPU_RESOURCE) -> PodRecord:
    meta = pod.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    counts = count_pods([pod])
    state = ("terminating" if counts.terminating else "ready" if counts.ready
             else "unscheduled" if counts.unscheduled else "starting" if counts.starting else "")
    try:
        gpus = pod_gpu_request(pod, gpu_resource)
    except ClusterError:
        gpus = 0
    except Exception:  # noqa: BLE001 — a malformed quantity counts as 0 GPUs here; the node list says why
        gpus = 0
    return PodRecord(str(meta.get("namespace", "")), str(meta.get("name", "")), labels,
                     (pod.get("spec") or {}).get("nodeName") or None, gpus,
                     labels.get(manifests.ROLE_LABEL) == manifests.PLACEHOLDER_ROLE, state)


@dataclass(frozen=True)
class NodeRecord:
    name: str
    labels: Mapping[str, str]
    gpus: int  # allocatable on a ready, schedulable node; 0 otherwise


# ---------------------------------------------------------------- a reflector ---


class Reflector:
    """LIST + WATCH of one collection into a dict, in its own daemon thread."""

    def __init__(self, kube: KubeCluster, resource: str, path: Callable[[], str], *,
                 on_replace: Callable[[list[dict[str, Any]]], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 query: Mapping[str, str] | None = None, optional: bool = False,
                 watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS, resync_seconds: float = RESYNC_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.resource = resource
        self._path = path
        self._on_replace = on_replace
        self._on_event = on_event
        self._query = dict(query or {})
        self._optional = optional
        self._watch_timeout = watch_timeout_seconds
        self._resync = resync_seconds
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.connected = False
        self.last_ok: float | None = None
        self.absent = False  # an optional API the server does not serve (KEDA not installed)
        self.lists = self.watches = self.relists_after_error = self.absent_checks = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.resource}", daemon=True)
        self._thread.start()

    def stop(self, join_seconds: float = 0.0) -> None:
        """Stop after the current request (a watch ends within ``watch_timeout_seconds``)."""
        self._stop.set()
        if join_seconds and self._thread is not None:
            self._thread.join(join_seconds)

    def stale_for(self, now: float | None = None) -> float:
        if self.connected:
            return 0.0
        if self.last_ok is None:
            return float("inf")
        return max(0.0, (self._clock() if now is None else now) - self.last_ok)

    def _ok(self) -> None:
        self.last_ok = self._clock()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self.sync_once()
                backoff = 1.0
            except ClusterError as exc:
                self.connected = False
                self.last_error = str(exc)
                if self._optional and isinstance(exc, NotFoundError):
                    self._on_replace([])
                    self.absent = True
                    self.absent_checks += 1
                    self._ok()
                    self.synced.set()
                    # Asked again as often as a watch is re-opened: "absent" stays known-current (fresh).
                    self._stop.wait(self._watch_timeout)
                    continue
                self.relists_after_error += 1
                log.warning("watch broken; re-listing", extra={"resource": self.resource, "detail": str(exc)})
                self._stop.wait(0 if isinstance(exc, GoneError) else backoff)
                backoff = min(30.0, backoff * 2)

    def sync_once(self) -> None:
        """One LIST, then watches from its resourceVersion until the resync period ends."""
        path = self._path()
        what = f"list {self.resource}"
        items, rv = self.kube.list_paginated(path, self._query, what=what)
        self.lists += 1
        self._on_replace(items)
        self.absent = False
        listed_at = self._clock()
        self._ok()
        self.synced.set()
        while not self._stop.is_set() and self._clock() - listed_at < self._resync:
            self.watches += 1
            try:
                for event in self.kube.watch_stream(path, rv, what=f"watch {self.resource}",
                                                    timeout_seconds=self._watch_timeout, query=self._query,
                                                    opened=self._opened):
                    obj = event.get("object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_event(str(event["type"]), obj)
                    self._ok()
                    if self._stop.is_set():
                        return
            finally:
                if self.connected:
                    self._ok()
                self.connected = False

    def _opened(self) -> None:
        self.connected = True
        self._ok()


# ------------------------------------------------------------------ the cache ---


class ClusterCache:
    """Pods, GPU nodes, HPAs and ScaledObjects, watched once for the whole process."""

    def __init__(self, kube: KubeCluster, *, namespace: str | None = None,
                 gpu_resource: str = manifests.GPU_RESOURCE, max_staleness_seconds: float = MAX_STALENESS_SECONDS,
                 watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS, resync_seconds: float = RESYNC_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.namespace = namespace
        self.gpu_resource = gpu_resource
        self.max_staleness_seconds = max_staleness_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], PodRecord] = {}
        self._by_label: dict[tuple[str, str, str], set[str]] = {}  # (namespace, key, value) → pod names
        self._by_namespace: dict[str, set[str]] = {}
        self._requested: dict[str, int] = {}  # node → GPUs requested by live pods
        self._placeheld: dict[str, int] = {}  # node → of which held by placeholders
        self._nodes: dict[str, NodeRecord] = {}
        self._hpas: dict[tuple[str, str], dict[str, Any]] = {}
        self._scaled_objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._selectors: dict[str, tuple[Requirement, ...]] = {}
        scoped = f"/namespaces/{namespace}" if namespace else ""

        def reflector(resource: str, path: Callable[[], str], on_replace: Callable[[list[dict[str, Any]]], None],
                      on_event: Callable[[str, dict[str, Any]], None], query: Mapping[str, str] | None = None,
                      optional: bool = False) -> Reflector:
            return Reflector(kube, resource, path, on_replace=on_replace, on_event=on_event, query=query,
                             optional=optional, watch_timeout_seconds=watch_timeout_seconds,
                             resync_seconds=resync_seconds, clock=clock)

        self.reflectors = {
            NODES: reflector(NODES, lambda: "/api/v1/nodes", self._replace_nodes, self._node_event),
            PODS: reflector(PODS, lambda: "/api/v1/pods", self._replace_pods, self._pod_event,
                            query={"fieldSelector": LIVE_PODS}),
            HPAS: reflector(HPAS, lambda: f"/apis/autoscaling/{kube.hpa_version()}{scoped}/horizontalpodautoscalers",
                            self._replacer(self._hpas), self._eventer(self._hpas)),
            SCALED_OBJECTS: reflector(SCALED_OBJECTS, lambda: f"/apis/keda.sh/v1alpha1{scoped}/scaledobjects",
                                      self._replacer(self._scaled_objects), self._eventer(self._scaled_objects),
                                      optional=True),
        }

    # -- lifecycle (a controller Component) ---------------------------------------------------------
    def start(self) -> ClusterCache:
        for reflector in self.reflectors.values():
            reflector.start()
        return self

    def stop(self, join_seconds: float = 0.0) -> None:
        """Stop every reflector; ``join_seconds`` > 0 waits that long for their threads (tests do)."""
        for reflector in self.reflectors.values():
            reflector.stop()
        deadline = time.monotonic() + join_seconds
        for reflector in self.reflectors.values():
            reflector.stop(max(0.0, deadline - time.monotonic()) if join_seconds else 0.0)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.reflectors.values())

    # -- staleness -----------------------------------------------------------------------------------
    def stale_for(self) -> dict[str, float]:
        """Seconds since each resource was last known current (0 while its watch is connected)."""
        now = self._clock()
        return {name: r.stale_for(now) for name, r in self.reflectors.items()}

    def fresh(self, *resources: str) -> bool:
        now = self._clock()
        return all(self.reflectors[r].synced.is_set() and self.reflectors[r].stale_for(now)
                   <= self.max_staleness_seconds for r in resources or self.reflectors)

    # -- reads ---------------------------------------------------------------------------------------
    def pod_counts(self, namespace: str, selector: str) -> PodCounts:
        """What ``KubeCluster.list_pods`` answers, from memory (label index, then the full selector)."""
        requirements = self._parsed(selector)
        with self._lock:
            candidates: Iterable[str] | None = None
            for req in requirements:
                if req.op in ("=", "in"):
                    names: set[str] = set()
                    for value in req.values:
                        names |= self._by_label.get((namespace, req.key, value), set())
                    if candidates is None or len(names) < len(candidates):  # type: ignore[arg-type]
                        candidates = names
            if candidates is None:
                candidates = self._by_namespace.get(namespace, set())
            counts = {"ready": 0, "starting": 0, "unscheduled": 0, "terminating": 0}
            for name in candidates:
                pod = self._pods.get((namespace, name))
                if pod is None or not pod.state or not all(r.matches(pod.labels) for r in requirements):
                    continue
                counts[pod.state] += 1
        starting = counts["starting"] + counts["unscheduled"]
        return PodCounts(counts["ready"], starting, counts["unscheduled"], counts["terminating"])

    def gpu_capacity(self, node_selector: Mapping[str, str] | None = None) -> NodeCapacity:
        """What ``KubeCluster.list_gpu_nodes`` answers, from memory (per-node sums kept on every event)."""
        wanted = dict(node_selector or {})
        with self._lock:
            nodes = [n for n in self._nodes.values()
                     if n.gpus > 0 and all(n.labels.get(k) == v for k, v in wanted.items())]
            requested = {n.name: self._requested.get(n.name, 0) for n in nodes}
            placeholder = sum(self._placeheld.get(n.name, 0) for n in nodes)
        return NodeCapacity(nodes=len(nodes), allocatable_gpus=sum(n.gpus for n in nodes),
                            requested_gpus=sum(requested.values()), placeholder_gpus=placeholder,
                            free_gpus=sum(max(0, n.gpus - requested[n.name]) for n in nodes))

    def conflicts(self, target: WorkloadRef) -> tuple[ConflictingAutoscaler, ...]:
        """What ``KubeCluster.list_conflicting_autoscalers`` answers, from memory."""
        with self._lock:
            hpas = [o for (ns, _), o in self._hpas.items() if ns == target.namespace]
            scaled = [o for (ns, _), o in self._scaled_objects.items() if ns == target.namespace]
        return (*hpa_conflicts(hpas, target), *scaled_object_conflicts(scaled, target))

    def sizes(self) -> dict[str, int]:
        with self._lock:
            return {PODS: len(self._pods), NODES: len(self._nodes), HPAS: len(self._hpas),
                    SCALED_OBJECTS: len(self._scaled_objects)}

    def _parsed(self, selector: str) -> tuple[Requirement, ...]:
        found = self._selectors.get(selector)
        if found is None:
            found = self._selectors[selector] = parse_selector(selector)
        return found

    # -- feeding -------------------------------------------------------------------------------------
    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        records = [pod_record(p, self.gpu_resource) for p in items]
        with self._lock:
            self._pods.clear()
            self._by_label.clear()
            self._by_namespace.clear()
            self._requested.clear()
            self._placeheld.clear()
            for record in records:
                self._add_pod(record)

    def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        record = pod_record(obj, self.gpu_resource)
        with self._lock:
            old = self._pods.get((record.namespace, record.name))
            if old is not None:
                self._remove_pod(old)
            if kind != "DELETED" and record.state:
                self._add_pod(record)

    def _add_pod(self, pod: PodRecord) -> None:
        self._pods[(pod.namespace, pod.name)] = pod
        self._by_namespace.setdefault(pod.namespace, set()).add(pod.name)
        for key, value in pod.labels.items():
            self._by_label.setdefault((pod.namespace, key, value), set()).add(pod.name)
        if pod.node and pod.gpus:
            self._requested[pod.node] = self._requested.get(pod.node, 0) + pod.gpus
            if pod.placeholder:
                self._placeheld[pod.node] = self._placeheld.get(pod.node, 0) + pod.gpus

    def _remove_pod(self, pod: PodRecord) -> None:
        self._pods.pop((pod.namespace, pod.name), None)
        self._by_namespace.get(pod.namespace, set()).discard(pod.name)
        for key, value in pod.labels.items():
            names = self._by_label.get((pod.namespace, key, value))
            if names is not None:
                names.discard(pod.name)
                if not names:
                    del self._by_label[(pod.namespace, key, value)]
        if pod.node and pod.gpus:
            self._requested[pod.node] -= pod.gpus
            if pod.placeholder:
                self._placeheld[pod.node] -= pod.gpus

    def _node_record(self, node: Mapping[str, Any]) -> NodeRecord:
        meta = node.get("metadata") or {}
        try:
            gpus = node_gpus(node, self.gpu_resource)
        except Exception:  # noqa: BLE001 — a node with an unreadable GPU quantity lends nothing
            gpus = 0
        return NodeRecord(str(meta.get("name", "")), dict(meta.get("labels") or {}), gpus)

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        records = [self._node_record(n) for n in items]
        with self._lock:
            self._nodes = {r.name: r for r in records}

    def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        record = self._node_record(obj)
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(record.name, None)
            else:
                self._nodes[record.name] = record

    def _replacer(self, into: dict[tuple[str, str], dict[str, Any]]) -> Callable[[list[dict[str, Any]]], None]:
        def replace(items: list[dict[str, Any]]) -> None:
            compact = {_key(o): _autoscaler(o) for o in items}
            with self._lock:
                into.clear()
                into.update(compact)
        return replace

    def _eventer(self, into: dict[tuple[str, str], dict[str, Any]]) -> Callable[[str, dict[str, Any]], None]:
        def event(kind: str, obj: dict[str, Any]) -> None:
            with self._lock:
                if kind == "DELETED":
                    into.pop(_key(obj), None)
                else:
                    into[_key(obj)] = _autoscaler(obj)
        return event


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _autoscaler(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Only what the conflict check reads: name, namespace, owners, scaleTargetRef, triggers."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "ownerReferences": meta.get("ownerReferences") or []},
            "spec": {"scaleTargetRef": spec.get("scaleTargetRef") or {}, "triggers": spec.get("triggers") or []}}


__all__ = ["ClusterCache", "PodRecord", "Reflector", "parse_selector"]
