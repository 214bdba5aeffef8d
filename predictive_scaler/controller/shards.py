"""Sharding: N controller replicas, each acting only on the scalers of its shard, fenced by Leases.

A StatefulSet of N replicas runs one controller per ordinal; replica ``i`` of ``n`` reconciles the
PredictiveScalers whose stable hash ``core.sharding.shard_of("namespace/name", n)`` (the retraining job's split) is ``i``. Two replicas
must never act on the same scaler, including while ``n`` changes (a rollout runs old and new
replicas side by side, and an old replica may still be mid-period). The fence:

- every replica holds the Lease ``predictive-scaler-shard-<i>`` in the controller's namespace
  (``holderIdentity`` = its pod, ``leaseDurationSeconds``, annotation ``…/shard-count: n``), taken
  only when free or expired and renewed with a resourceVersion precondition, so one holder at a time;
- a replica *acts* only while (a) its own Lease is held by it and was renewed less than
  ``duration − margin`` ago (a replica that cannot renew stops before anyone may take over), and (b)
  at its last read every live Lease (renewed less than ``duration`` ago) carries the same shard count.

When the count changes, the first replica with the new count sees live Leases with the old one and
waits; the old replicas see the new Lease at their next renewal and stop. No scaler is acted on until
every live replica agrees — the scalers hold their replicas meanwhile (no scale-down, nothing new),
for the length of the rollout plus at most one Lease duration. A replica that stops releases its Lease.

The cluster-wide speculative budget is **split per shard** (:func:`shard_limits`): shard ``i`` of ``n``
may hold ``max_gpus // n`` (the first ``max_gpus % n`` shards one more) and ``max_cost / n``. Split,
not coordinated through a shared API object: a shared counter would be one hot object every reconcile
of every shard writes with optimistic concurrency (conflicts grow with shards × scalers), and a shard
that cannot reach it would have to stop speculating. The price is that a shard cannot borrow another's
unused share. While the count changes, a shard may inherit scalers holding more than its new share; so
a shard also counts every other shard at ``max(its share, what its scalers' status says they hold)``
(:meth:`ShardedBudget.outside`) — an over-share shard only ever shrinks and an under-share one never
passes its share, so that bound is never below what the others really hold, and the sum stays under
the cap throughout.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from predictive_scaler.controller.settings import ClusterBudgetLimits
from predictive_scaler.core.sharding import shard_of
from predictive_scaler.errors import ClusterError, ConfigError

log = logging.getLogger("predictive_scaler.controller.shards")

SHARD_LABEL = "predictive-scaler.io/shard"
COUNT_ANNOTATION = "predictive-scaler.io/shard-count"
LEASE_PREFIX = "predictive-scaler-shard-"
#: A Lease not renewed for this long is free to take (and its holder has stopped acting before).
LEASE_SECONDS = 60
#: A holder stops acting this long before its Lease could be taken (clock skew, a slow renewal).
SAFETY_MARGIN_SECONDS = 15


def scaler_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def shard_limits(limits: ClusterBudgetLimits, index: int, count: int) -> ClusterBudgetLimits:
    """Shard ``index``'s part of the cluster budget (the parts add up to at most the whole)."""
    gpus = None if limits.max_gpus is None else limits.max_gpus // count + (1 if index < limits.max_gpus % count else 0)
    cost = None if limits.max_cost_per_hour is None else limits.max_cost_per_hour / count
    return ClusterBudgetLimits(max_gpus=gpus, max_cost_per_hour=cost)


@dataclass(frozen=True)
class LeaseState:
    shard: int
    holder: str | None
    count: int | None
    renewed_at: float | None
    duration: float
    resource_version: str

    def live(self, now: float) -> bool:
        return bool(self.holder) and self.renewed_at is not None and now - self.renewed_at < self.duration


def _lease_state(obj: Mapping[str, Any]) -> LeaseState | None:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    try:
        shard = int((meta.get("labels") or {})[SHARD_LABEL])
        count = (meta.get("annotations") or {}).get(COUNT_ANNOTATION)
        renew = spec.get("renewTime")
        renewed = datetime.fromisoformat(renew.replace("Z", "+00:00")).timestamp() if renew else None
        return LeaseState(shard, spec.get("holderIdentity") or None, int(count) if count else None, renewed,
                          float(spec.get("leaseDurationSeconds") or LEASE_SECONDS), str(meta.get("resourceVersion")))
    except (KeyError, ValueError, TypeError, AttributeError):
        return None  # not one of ours, or malformed: ignored (it cannot hold a shard)


class ShardMembership:
    """This replica's place among the shards: which scalers it owns and whether it may act now."""

    def __init__(self, kube: Any, namespace: str, index: int, count: int, identity: str, *,
                 clock: Callable[[], float], lease_seconds: int = LEASE_SECONDS,
                 margin_seconds: float = SAFETY_MARGIN_SECONDS) -> None:
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"shard index {index} is outside 0..{count - 1} (shard count {count}); a "
                              "StatefulSet's ordinal must be below its replica count", field="shard_index")
        self.kube = kube
        self.namespace = namespace
        self.index = index
        self.count = count
        self.identity = identity
        self._clock = clock
        self.lease_seconds = lease_seconds
        self.margin = margin_seconds
        self._lock = threading.Lock()
        self._renewed_at: float | None = None  # when our Lease was last written by us
        self._agreed = False
        #: Why this replica does not act now (None while it does), for logs and the readiness detail.
        self.waiting: str | None = "not renewed yet"
        self._raw: dict[str, dict[str, Any]] = {}  # the Leases as last listed, by name

    @property
    def lease_name(self) -> str:
        return f"{LEASE_PREFIX}{self.index}"

    def renew(self) -> bool:
        """Take or renew our Lease, then read all of them; True when this replica may act."""
        now = self._clock()
        try:
            leases = self._leases()
            mine = next((lease for lease in leases.values() if lease.shard == self.index), None)
            raw_mine = self._raw.get(self.lease_name)
            if mine is not None and mine.holder not in (None, self.identity) and mine.live(now):
                return self._wait(f"shard {self.index} Lease is held by {mine.holder}")
            self.kube.write_lease(self.namespace, self._body(now, raw_mine))
            with self._lock:
                self._renewed_at = now
            leases = self._leases()  # after our write: whoever wrote before us is seen now
        except ClusterError as exc:
            return self._wait(f"cannot renew the shard Lease ({exc})")
        others = [lease for lease in leases.values() if lease.shard != self.index and lease.live(now)]
        disagree = [lease for lease in others if lease.count != self.count]
        if disagree:
            return self._wait("the shard count is changing: " + ", ".join(
                f"shard {lease.shard} runs with {lease.count}" for lease in disagree) + f", this one with {self.count}")
        with self._lock:
            self._agreed = True
            self.waiting = None
        return True

    def acting(self) -> bool:
        with self._lock:
            fresh = self._renewed_at is not None and (
                self._clock() - self._renewed_at < self.lease_seconds - self.margin)
            return fresh and self._agreed

    def owns(self, namespace: str, name: str) -> bool:
        """Whether this replica acts on the scaler now: its shard, and the fence holds."""
        return shard_of(scaler_key(namespace, name), self.count) == self.index and self.acting()

    def release(self) -> None:
        """On a clean stop: give the Lease up so the next holder need not wait for it to expire."""
        with self._lock:
            self._agreed = False
            self._renewed_at = None
        try:
            self._leases()
            raw = self._raw.get(self.lease_name)
            if raw is not None and (raw.get("spec") or {}).get("holderIdentity") == self.identity:
                body = self._body(self._clock(), raw)
                body["spec"]["holderIdentity"] = ""
                self.kube.write_lease(self.namespace, body)
        except ClusterError as exc:
            log.warning("could not release the shard Lease", extra={"detail": str(exc)})

    # -- pieces ---------------------------------------------------------------------------------
    def _wait(self, why: str) -> bool:
        with self._lock:
            self._agreed = False
            self.waiting = why
        return False

    def _leases(self) -> dict[str, LeaseState]:
        raw = self.kube.list_leases(self.namespace, SHARD_LABEL)
        self._raw = {str((o.get("metadata") or {}).get("name")): o for o in raw}
        out = {}
        for name, obj in self._raw.items():
            state = _lease_state(obj)
            if state is not None:
                out[name] = state
        return out

    def _body(self, now: float, existing: Mapping[str, Any] | None) -> dict[str, Any]:
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        meta: dict[str, Any] = {"name": self.lease_name, "namespace": self.namespace,
                                "labels": {SHARD_LABEL: str(self.index)},
                                "annotations": {COUNT_ANNOTATION: str(self.count)}}
        spec: dict[str, Any] = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                                "renewTime": stamp}
        if existing is not None:
            meta["resourceVersion"] = (existing.get("metadata") or {}).get("resourceVersion")
            old = existing.get("spec") or {}
            if old.get("holderIdentity") == self.identity and old.get("acquireTime"):
                spec["acquireTime"] = old["acquireTime"]
                spec["leaseTransitions"] = old.get("leaseTransitions", 0)
            else:
                spec["acquireTime"] = stamp
                spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        else:
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = 0
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


@dataclass(frozen=True)
class Holding:
    gpus: int
    cost_per_hour: float


class ShardedBudget:
    """What the other shards may hold, for this shard's ledger: each at ``max(share, its status)``."""

    def __init__(self, limits: ClusterBudgetLimits, index: int, count: int) -> None:
        self.limits = limits
        self.index = index
        self.count = count
        self._outside: dict[int, Holding] = {}

    def observe(self, scalers: Iterable[Mapping[str, Any]]) -> None:
        """Every scaler's ``status.budgetInUse`` (one paginated list per period), summed per shard."""
        sums: dict[int, list[float]] = {}
        for obj in scalers:
            meta = obj.get("metadata") or {}
            shard = shard_of(scaler_key(str(meta.get("namespace", "")), str(meta.get("name", ""))), self.count)
            held = (obj.get("status") or {}).get("budgetInUse") or {}
            acc = sums.setdefault(shard, [0.0, 0.0])
            acc[0] += _num(held.get("gpus"))
            acc[1] += _num(held.get("costPerHour"))
        self._outside = {s: Holding(int(v[0]), v[1]) for s, v in sums.items() if s != self.index}

    def outside(self) -> Holding:
        """The most the other shards can hold now."""
        gpus, cost = 0, 0.0
        for j in range(self.count):
            if j == self.index:
                continue
            share = shard_limits(self.limits, j, self.count)
            seen = self._outside.get(j, Holding(0, 0.0))
            if share.max_gpus is not None:
                gpus += max(share.max_gpus, seen.gpus)
            if share.max_cost_per_hour is not None:
                cost += max(share.max_cost_per_hour, seen.cost_per_hour)
        return Holding(gpus, cost)

    def limits_now(self) -> ClusterBudgetLimits:
        """This shard's limits now: its share, and never more than the whole minus what the others can hold."""
        share = shard_limits(self.limits, self.index, self.count)
        out = self.outside()
        gpus = share.max_gpus
        if gpus is not None and self.limits.max_gpus is not None:
            gpus = max(0, min(gpus, self.limits.max_gpus - out.gpus))
        cost = share.max_cost_per_hour
        if cost is not None and self.limits.max_cost_per_hour is not None:
            cost = max(0.0, min(cost, self.limits.max_cost_per_hour - out.cost_per_hour))
        return ClusterBudgetLimits(max_gpus=gpus, max_cost_per_hour=cost)


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return out if math.isfinite(out) and out > 0 else 0.0


class ShardKeeper:
    """A controller Component: renews the shard Lease every quarter Lease duration and, once per
    period, re-reads the other shards' holdings (``observe``); releases the Lease on stop."""

    def __init__(self, membership: ShardMembership, observe: Callable[[], None], period_seconds: float) -> None:
        self.membership = membership
        self._observe = observe
        self._period = period_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ShardKeeper:
        self._thread = threading.Thread(target=self._run, name="shard-lease", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        every = self.membership.lease_seconds / 4
        last_observe = -math.inf
        while not self._stop.is_set():
            if not self.membership.renew():
                log.info("not acting on any scaler", extra={"detail": self.membership.waiting})
            now = self.membership._clock()
            if now - last_observe >= self._period:
                try:
                    self._observe()
                    last_observe = now
                except ClusterError as exc:
                    log.warning("cannot read the other shards' budgets", extra={"detail": str(exc)})
            self._stop.wait(every)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.membership.release()
