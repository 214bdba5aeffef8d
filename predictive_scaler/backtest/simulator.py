"""A time-stepped GPU cluster simulator: replicas, nodes, placeholders, bills.

The simulator is deterministic: the same sequence of ``apply``/``advance``
calls at the same times always yields the same cluster. Time is whole seconds
since the start of the simulation (the runner maps it to wall-clock datetimes).

What it models (defaults in :class:`ClusterConfig`):

- A replica needs ``gpus_per_replica`` GPUs on one node. On a **warm** node (one
  that exists and has pulled the inference image) it is ready after
  ``pod_start_s + model_load_s``. If no node has room, a **cold** node is
  provisioned: ready after ``node_provision_s + image_pull_s + pod_start_s +
  model_load_s``. A replica placed on a node that is still provisioning or
  pulling is ready that much after the node becomes warm.
- **Placeholder pods** (1 GPU each, negative priority, inference image) hold
  GPUs. A real replica preempts them and starts in warm time; the evicted
  placeholder goes pending and the node autoscaler provisions a node for it —
  the balloon pattern.
- Nodes are billed for all their GPUs from provisioning until removal. A node
  with no replica and no placeholder is removed after ``consolidation_delay_s``.
- Scale-down removes not-ready replicas first, then the newest ready ones,
  as the ReplicaSet controller does. Running replicas are never migrated
  (Karpenter's replace-consolidation is not modelled: that flatters nobody).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from predictive_scaler.errors import ConfigError, did_you_mean
from predictive_scaler.yaml_input import excerpt

#: Lead times per node autoscaler. Image pull 3–8 min on a cold node
#: (5 min taken), model load ~1 min; Cluster Autoscaler removes a node after
#: 10 min unneeded (its default), Karpenter after its consolidateAfter (5 min here).
PRESETS: dict[str, dict[str, float]] = {
    "karpenter": {
        "node_provision_s": 50.0,
        "image_pull_s": 300.0,
        "pod_start_s": 10.0,
        "model_load_s": 60.0,
        "consolidation_delay_s": 300.0,
    },
    "cluster-autoscaler": {
        "node_provision_s": 240.0,
        "image_pull_s": 300.0,
        "pod_start_s": 10.0,
        "model_load_s": 60.0,
        "consolidation_delay_s": 600.0,
    },
}


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated cluster. Times in seconds, price in currency per GPU-hour."""

    #: GPUs on each node (all nodes alike).
    gpus_per_node: int = 4
    #: GPUs one inference replica requests.
    gpus_per_replica: int = 1
    #: Price of one GPU-hour (whole nodes are billed).
    price_per_gpu_hour: float = 2.5
    #: From a node request to a schedulable node (Karpenter 45–60 s, CA 3–5 min).
    node_provision_s: float = 50.0
    #: Pull of the inference image on a fresh node (5–15 GB: 3–8 min).
    image_pull_s: float = 300.0
    #: Container start on a node that has the image.
    pod_start_s: float = 10.0
    #: Loading the model weights into GPU memory before the replica is ready.
    model_load_s: float = 60.0
    #: An empty node is removed after this long.
    consolidation_delay_s: float = 300.0
    #: Age of the metric a reactive policy sees (scrape + rule evaluation; 30–90 s).
    metrics_delay_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "gpus_per_replica"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a whole number ≥ 1, got {value!r}", field=name)
        if self.gpus_per_replica > self.gpus_per_node:
            raise ConfigError(
                f"gpus_per_replica ({self.gpus_per_replica}) exceeds gpus_per_node ({self.gpus_per_node}); "
                "a replica must fit on one node — use bigger nodes or fewer GPUs per replica",
                field="gpus_per_replica",
            )
        for name in ("price_per_gpu_hour", "node_provision_s", "image_pull_s", "pod_start_s",
                     "model_load_s", "consolidation_delay_s", "metrics_delay_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number ≥ 0, got {value!r}", field=name)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ClusterConfig:
        try:
            base = PRESETS[name]
        except KeyError:
            raise ConfigError(
                f"unknown preset {excerpt(name)}; {did_you_mean(name, PRESETS)}choose one of {', '.join(sorted(PRESETS))}",
                field="preset",
            ) from None
        return cls(**{**base, **overrides})

    @property
    def replicas_per_node(self) -> int:
        return self.gpus_per_node // self.gpus_per_replica

    @property
    def warm_start_s(self) -> float:
        """Request → ready for a replica on a warm node."""
        return self.pod_start_s + self.model_load_s

    @property
    def node_warmup_s(self) -> float:
        """Node request → node ready with the image pulled."""
        return self.node_provision_s + self.image_pull_s

    @property
    def cold_start_s(self) -> float:
        """Request → ready for a replica that needs a new node: the node lead time."""
        return self.node_warmup_s + self.warm_start_s

    def nodes_for(self, replicas: int) -> int:
        """Whole nodes that fit ``replicas`` replicas."""
        return -(-max(0, replicas) // self.replicas_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def with_overrides(self, **overrides: Any) -> ClusterConfig:
        return replace(self, **overrides)


@dataclass
class _Node:
    id: int
    gpus: int
    created_s: float
    warm_s: float
    replica_gpus: int = 0
    placeholder_gpus: int = 0
    empty_since_s: float | None = None

    @property
    def free_gpus(self) -> int:
        return self.gpus - self.replica_gpus - self.placeholder_gpus


@dataclass
class _Replica:
    seq: int
    node_id: int
    ready_s: float


@dataclass(frozen=True)
class ClusterSnapshot:
    """What an observer of the simulated cluster sees at one instant."""

    time_s: float
    desired_replicas: int
    ready_replicas: int
    starting_replicas: int
    placeholder_gpus: int
    free_gpus: int
    nodes: int
    billed_gpus: int


@dataclass
class SimulatedCluster:
    """Mutable cluster state stepped by :meth:`apply` and :meth:`advance`."""

    config: ClusterConfig
    _nodes: dict[int, _Node] = field(default_factory=dict)
    _replicas: list[_Replica] = field(default_factory=list)
    _placeholder_target: int = 0
    _next_id: int = 0
    _next_seq: int = 0

    # -- set-up --------------------------------------------------------------------------------
    @classmethod
    def warm(cls, config: ClusterConfig, replicas: int, now_s: float = 0.0) -> SimulatedCluster:
        """A cluster already running ``replicas`` ready replicas on warm, packed nodes."""
        cluster = cls(config)
        for _ in range(config.nodes_for(replicas)):
            cluster._add_node(now_s, warm_s=now_s, created_s=now_s)
        for _ in range(replicas):
            node = cluster._best_node(now_s)
            assert node is not None  # nodes were sized for these replicas
            cluster._place(node, now_s, ready_s=now_s)
        cluster._mark_empty(now_s)
        return cluster

    # -- observing -----------------------------------------------------------------------------
    def snapshot(self, now_s: float) -> ClusterSnapshot:
        ready = sum(1 for r in self._replicas if r.ready_s <= now_s)
        return ClusterSnapshot(
            time_s=now_s,
            desired_replicas=len(self._replicas),
            ready_replicas=ready,
            starting_replicas=len(self._replicas) - ready,
            placeholder_gpus=sum(n.placeholder_gpus for n in self._nodes.values()),
            free_gpus=sum(n.free_gpus for n in self._nodes.values()),
            nodes=len(self._nodes),
            billed_gpus=sum(n.gpus for n in self._nodes.values()),
        )

    @property
    def desired_replicas(self) -> int:
        return len(self._replicas)

    def ready_replicas(self, now_s: float) -> int:
        return sum(1 for r in self._replicas if r.ready_s <= now_s)

    @property
    def billed_gpus(self) -> int:
        return sum(n.gpus for n in self._nodes.values())

    @property
    def placeholder_gpus(self) -> int:
        return sum(n.placeholder_gpus for n in self._nodes.values())

    def replica_ready_times(self) -> list[float]:
        return sorted(r.ready_s for r in self._replicas)

    def node_times(self) -> list[tuple[float, float]]:
        """(created_s, warm_s) of the live nodes, in creation order."""
        return [(n.created_s, n.warm_s) for n in self._nodes.values()]

    # -- acting --------------------------------------------------------------------------------
    def advance(self, now_s: float) -> None:
        """Remove nodes that have been empty for the consolidation delay."""
        delay = self.config.consolidation_delay_s
        gone = [n.id for n in self._nodes.values()
                if n.empty_since_s is not None and now_s - n.empty_since_s >= delay]
        for node_id in gone:
            del self._nodes[node_id]

    def apply(self, desired_replicas: int, placeholder_gpus: int, now_s: float) -> None:
        """Scale to ``desired_replicas`` and hold ``placeholder_gpus`` GPUs with placeholders."""
        desired_replicas = max(0, int(desired_replicas))
        placeholder_gpus = max(0, int(placeholder_gpus))
        gpr = self.config.gpus_per_replica
        if desired_replicas < len(self._replicas):
            # Not-ready replicas go first, then the newest (ReplicaSet scale-down order).
            self._replicas.sort(key=lambda r: (r.ready_s <= now_s, -r.seq))
            for r in self._replicas[: len(self._replicas) - desired_replicas]:
                self._nodes[r.node_id].replica_gpus -= gpr
            self._replicas = self._replicas[len(self._replicas) - desired_replicas:]
        while len(self._replicas) < desired_replicas:
            node = self._best_node(now_s)
            if node is None:
                node = self._add_node(now_s)
            self._place(node, now_s)
        self._placeholder_target = placeholder_gpus
        self._settle_placeholders(now_s)
        self._mark_empty(now_s)

    # -- internals -----------------------------------------------------------------------------
    def _add_node(self, now_s: float, *, warm_s: float | None = None, created_s: float | None = None) -> _Node:
        created = now_s if created_s is None else created_s
        node = _Node(
            id=self._next_id,
            gpus=self.config.gpus_per_node,
            created_s=created,
            warm_s=created + self.config.node_warmup_s if warm_s is None else warm_s,
        )
        self._next_id += 1
        self._nodes[node.id] = node
        return node

    def _best_node(self, now_s: float) -> _Node | None:
        """The node where a new replica is ready soonest; free GPUs before preempting placeholders."""
        gpr = self.config.gpus_per_replica
        best: _Node | None = None
        best_key: tuple[float, int, int, int] | None = None
        for node in self._nodes.values():
            if node.free_gpus + node.placeholder_gpus < gpr:
                continue
            preempts = int(node.free_gpus < gpr)
            # Soonest ready, then no preemption, then the fullest node (bin-packing), then oldest.
            key = (max(now_s, node.warm_s), preempts, -node.replica_gpus, node.id)
            if best_key is None or key < best_key:
                best, best_key = node, key
        return best

    def _place(self, node: _Node, now_s: float, ready_s: float | None = None) -> None:
        gpr = self.config.gpus_per_replica
        shortfall = gpr - node.free_gpus
        if shortfall > 0:
            node.placeholder_gpus -= shortfall  # preempted; re-placed by _settle_placeholders
        node.replica_gpus += gpr
        ready = max(now_s, node.warm_s) + self.config.warm_start_s if ready_s is None else ready_s
        self._replicas.append(_Replica(seq=self._next_seq, node_id=node.id, ready_s=ready))
        self._next_seq += 1

    def _settle_placeholders(self, now_s: float) -> None:
        held = sum(n.placeholder_gpus for n in self._nodes.values())
        if held > self._placeholder_target:
            # Release from the emptiest nodes first so they can be consolidated.
            excess = held - self._placeholder_target
            for node in sorted(self._nodes.values(), key=lambda n: (n.replica_gpus, -n.id)):
                take = min(excess, node.placeholder_gpus)
                node.placeholder_gpus -= take
                excess -= take
                if not excess:
                    break
        elif held < self._placeholder_target:
            missing = self._placeholder_target - held
            # Pending placeholders land on free GPUs (fullest, warmest nodes first) …
            for node in sorted(self._nodes.values(), key=lambda n: (-(n.replica_gpus + n.placeholder_gpus), n.warm_s, n.id)):
                take = min(missing, node.free_gpus)
                node.placeholder_gpus += take
                missing -= take
                if not missing:
                    break
            # … and the node autoscaler provisions nodes for the rest.
            while missing:
                node = self._add_node(now_s)
                take = min(missing, node.gpus)
                node.placeholder_gpus = take
                missing -= take

    def _mark_empty(self, now_s: float) -> None:
        for node in self._nodes.values():
            if node.replica_gpus or node.placeholder_gpus:
                node.empty_since_s = None
            elif node.empty_since_s is None:
                node.empty_since_s = now_s


# -- running one policy over a demand timeline ----------------------------------------------------

@dataclass(frozen=True)
class Demand:
    """Demand on the simulation grid: ``values[i]`` holds during tick ``i`` (NaN = unknown)."""

    values: np.ndarray
    tick_s: int
    capacity_per_replica: float

    def __post_init__(self) -> None:
        if self.tick_s < 1:
            raise ConfigError(f"tick must be ≥ 1 s, got {self.tick_s}", field="control_period")
        if not (math.isfinite(self.capacity_per_replica) and self.capacity_per_replica > 0):
            raise ConfigError(
                f"capacity per replica must be > 0, got {self.capacity_per_replica}; "
                "give --capacity-per-replica or --peak-replicas",
                field="capacity_per_replica",
            )
        arr = np.asarray(self.values, dtype=float).copy()
        arr.flags.writeable = False
        object.__setattr__(self, "values", arr)

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @property
    def known(self) -> np.ndarray:
        return np.isfinite(self.values)

    def filled(self) -> np.ndarray:
        """Values with gaps carried forward (leading gaps as 0) — what a policy can act on."""
        return _ffill(self.values)

    def need(self, utilization: float = 1.0) -> np.ndarray:
        """Replicas needed each tick to serve the demand at ``utilization`` of capacity (gaps carried forward)."""
        per = self.capacity_per_replica * utilization
        # Tiny tolerance: 20/2 must be 10 replicas, not 11 after float noise.
        return np.ceil(self.filled() / per - 1e-9).clip(min=0).astype(np.int64)


def _ffill(values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    ok = np.isfinite(arr)
    if ok.all():
        return arr.copy()
    idx = np.where(ok, np.arange(arr.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = arr[idx]
    out[~np.isfinite(out)] = 0.0  # leading gap: nothing known yet
    return out


@dataclass(frozen=True)
class PolicyRun:
    """What one policy did, tick by tick."""

    name: str
    tick_s: int
    desired: np.ndarray
    ready: np.ndarray
    billed_gpus: np.ndarray
    placeholder_gpus: np.ndarray
    #: Ticks spent in reactive fallback (None for policies without a fallback mode).
    fallback: np.ndarray | None


#: A policy's control step: act on the cluster at ``now_s`` (tick ``i``); return True when in fallback.
ControlStep = Callable[[int, float, SimulatedCluster], bool]


def simulate(
    name: str,
    control: ControlStep,
    n_ticks: int,
    tick_s: int,
    config: ClusterConfig,
    *,
    initial_replicas: int,
    control_every: int = 1,
    has_fallback: bool = False,
    progress: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Step a fresh warm cluster through ``n_ticks`` ticks under ``control``."""
    cluster = SimulatedCluster.warm(config, initial_replicas)
    desired = np.zeros(n_ticks, dtype=np.int64)
    ready = np.zeros(n_ticks, dtype=np.int64)
    billed = np.zeros(n_ticks, dtype=np.int64)
    held = np.zeros(n_ticks, dtype=np.int64)
    fallback = np.zeros(n_ticks, dtype=bool)
    in_fallback = False
    for i in range(n_ticks):
        now = float(i * tick_s)
        cluster.advance(now)
        if i % control_every == 0:
            in_fallback = bool(control(i, now, cluster))
        desired[i] = cluster.desired_replicas
        ready[i] = cluster.ready_replicas(now)
        billed[i] = cluster.billed_gpus
        held[i] = cluster.placeholder_gpus
        fallback[i] = in_fallback
        if progress is not None and i % 1000 == 999:
            progress(1000)
    if progress is not None:
        progress(n_ticks % 1000)
    return PolicyRun(name, tick_s, desired, ready, billed, held, fallback if has_fallback else None)
