"""The cluster-wide speculative budget: bounds the sum over all PredictiveScalers.

Each scaler has its own prewarm budget; without a cluster cap, 50 scalers with
8 GPUs each may speculate on 400 GPUs together. :class:`ClusterBudget` is the
controller's ledger of what every scaler holds — bookkeeping only: what one scaler
may take is the pure rule :func:`predictive_scaler.policy.budget.cluster_share`,
handed to the reconcile step as a value (``Reconciler.step(state, cluster_share=…)``). A reconcile *reserves* first —
it is booked at the most it may take (the cap minus what the others hold) while
it decides — then *settles* at what it actually decided. Two scalers deciding at
the same time therefore never see the same spare GPUs: the sum can only be
over-estimated for the length of one step, never overrun.

The ledger is rebuilt from the custom resources' ``status.budgetInUse`` at
start-up (the status, not memory, is the record), so a restart changes nothing.
Forecast-only scalers hold nothing (they only report) and are booked at 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from predictive_scaler.controller.settings import ClusterBudgetLimits
from predictive_scaler.policy import budget as budget_policy
from predictive_scaler.policy.budget import ClusterShare


@dataclass(frozen=True)
class Holding:
    gpus: int
    cost_per_hour: float
    updated_at: float


@dataclass
class Reservation:
    """What one scaler may take this step; ``allowed_gpus`` None means no cluster cap."""

    uid: str
    allowed_gpus: int | None
    reason: str | None
    price_per_gpu_hour: float | None
    settled: Holding | None = None

    @property
    def share(self) -> ClusterShare:
        """The cluster's part for this scaler, as the value the reconcile step takes."""
        return ClusterShare(self.allowed_gpus, self.reason)

    def settle(self, gpus: int, now: float) -> None:
        """Record what the scaler actually holds after this step."""
        gpus = max(0, int(gpus))
        if self.allowed_gpus is not None:
            gpus = min(gpus, self.allowed_gpus)  # the planner cannot exceed it; belt and braces
        cost = 0.0 if self.price_per_gpu_hour is None else gpus * self.price_per_gpu_hour
        self.settled = Holding(gpus, cost, now)


class ClusterBudget:
    """Thread-safe ledger: uid → speculative GPUs (and cost) held. kopf runs sync handlers in threads."""

    def __init__(self, limits: ClusterBudgetLimits) -> None:
        self.limits = limits
        self._held: dict[str, Holding] = {}
        self._lock = threading.Lock()

    # -- bookkeeping ----------------------------------------------------------------------------
    def seed(self, uid: str, gpus: int, cost_per_hour: float, now: float) -> None:
        """Book what a scaler's status says it holds (start-up), unless it is already booked."""
        with self._lock:
            self._held.setdefault(uid, Holding(max(0, int(gpus)), max(0.0, float(cost_per_hour)), now))

    def release(self, uid: str) -> None:
        with self._lock:
            self._held.pop(uid, None)

    def forget_older_than(self, cutoff: float) -> list[str]:
        """Drop bookings not refreshed since ``cutoff`` (scalers deleted while the controller was away)."""
        with self._lock:
            stale = [uid for uid, h in self._held.items() if h.updated_at < cutoff]
            for uid in stale:
                del self._held[uid]
            return stale

    def held(self, uid: str) -> Holding | None:
        with self._lock:
            return self._held.get(uid)

    def total(self) -> tuple[int, float]:
        with self._lock:
            return sum(h.gpus for h in self._held.values()), sum(h.cost_per_hour for h in self._held.values())

    # -- one reconcile --------------------------------------------------------------------------
    @contextmanager
    def reserve(self, uid: str, price_per_gpu_hour: float | None, now: float) -> Iterator[Reservation]:
        """Book the scaler at the most it may take while it decides; settle or roll back after."""
        with self._lock:
            previous = self._held.get(uid)
            others_gpus = sum(h.gpus for u, h in self._held.items() if u != uid)
            others_cost = sum(h.cost_per_hour for u, h in self._held.items() if u != uid)
            allowed, reason = self._allowance(others_gpus, others_cost, price_per_gpu_hour)
            if allowed is not None:
                cost = 0.0 if price_per_gpu_hour is None else allowed * price_per_gpu_hour
                self._held[uid] = Holding(allowed, cost, now)
        reservation = Reservation(uid, allowed, reason, price_per_gpu_hour)
        try:
            yield reservation
        finally:
            with self._lock:
                if reservation.settled is not None:
                    self._held[uid] = reservation.settled
                elif previous is not None:
                    self._held[uid] = previous  # the step failed: what was held before still is
                else:
                    self._held.pop(uid, None)

    def _allowance(self, others_gpus: int, others_cost: float,
                   price: float | None) -> tuple[int | None, str | None]:
        share = budget_policy.cluster_share(self.limits.max_gpus, self.limits.max_cost_per_hour,
                                            others_gpus=others_gpus, others_cost=others_cost,
                                            price_per_gpu_hour=price)
        return share.gpus, share.reason
