"""Several predictive scalers sharing one cluster-wide speculative budget, replayed on one trace.

The controller bounds the sum of every scaler's speculative GPUs by the cluster budget: each
reconcile takes what :func:`predictive_scaler.policy.budget.cluster_share` leaves it given what
the others hold, and the reconcile step takes that share as a value. The backtest runs the same
pure rule through the same :class:`~predictive_scaler.reconcile.Reconciler`: every control tick
the scalers reconcile in the order the scenario lists them, each seeing what the scalers before
it took at this tick (the ones after it have not decided yet and count for nothing — a fixed
priority order; the controller's order is whichever reconcile runs first). So at every tick the
sum is bounded by the cap, and :func:`run_fleet` audits exactly that, every tick, against each
scaler's independently replayed counterfactual (``measures.speculative_per_tick``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from predictive_scaler.backtest.adapters import run_predictive
from predictive_scaler.backtest.measures import speculative_per_tick
from predictive_scaler.backtest.records import Setup, prepare
from predictive_scaler.backtest.runner import counterfactual, initial_replicas
from predictive_scaler.backtest.scenario import Scenario, deep_merge
from predictive_scaler.backtest.simulator import PolicyRun
from predictive_scaler.errors import ConfigError
from predictive_scaler.policy.budget import ClusterShare, allowance, cluster_share
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import ClusterPort, Reconciler, ReconcileResult
from predictive_scaler.series import Series

__all__ = ["FleetResult", "ScalerRun", "run_fleet"]


@dataclass(frozen=True)
class ScalerRun:
    name: str
    setup: Setup
    run: PolicyRun
    #: Speculative GPUs every tick, audited against the scaler's own replayed counterfactual.
    speculative: np.ndarray
    #: Ticks at which the cluster's share was below the scaler's own budget (the others held the rest).
    share_below_own_ticks: int


@dataclass(frozen=True)
class FleetResult:
    scalers: tuple[ScalerRun, ...]
    max_gpus: int | None
    max_cost_per_hour: float | None

    @property
    def total_speculative(self) -> np.ndarray:
        """The sum over the scalers, every tick."""
        return np.sum([s.speculative for s in self.scalers], axis=0)

    @property
    def total_cost_per_hour(self) -> np.ndarray:
        return np.sum([s.speculative * _price(s.setup) for s in self.scalers], axis=0)

    @property
    def minutes_over_budget(self) -> float:
        """Minutes in which the audited sum exceeded the cluster budget (GPUs or cost)."""
        tick_s = self.scalers[0].run.tick_s
        over = np.zeros(self.total_speculative.shape, dtype=bool)
        if self.max_gpus is not None:
            over |= self.total_speculative > self.max_gpus
        if self.max_cost_per_hour is not None:
            over |= self.total_cost_per_hour > self.max_cost_per_hour + 1e-9
        return float(np.count_nonzero(over)) * tick_s / 60.0

    def to_dict(self) -> dict[str, Any]:
        total = self.total_speculative
        return {
            "cluster_budget": {"maxGpus": self.max_gpus, "maxCostPerHour": self.max_cost_per_hour},
            "max_total_speculative_gpus": int(total.max()) if total.size else 0,
            "minutes_over_cluster_budget": self.minutes_over_budget,
            "scalers": [{"name": s.name, "max_speculative_gpus": int(s.speculative.max()) if s.speculative.size else 0,
                         "minutes_share_below_own_budget": s.share_below_own_ticks * s.run.tick_s / 60.0} for s in self.scalers],
        }


def _price(setup: Setup) -> float:
    price = setup.spec.prewarm.budget.price_per_gpu_hour
    return 0.0 if price is None else float(price)


class _Ledger:
    """Who holds what at each control tick (the backtest's bookkeeping; the rule is the pure one)."""

    def __init__(self, max_gpus: int | None, max_cost: float | None) -> None:
        self.max_gpus, self.max_cost = max_gpus, max_cost
        self.held: dict[float, dict[str, tuple[int, float]]] = {}

    def share(self, name: str, at: datetime, price: float | None) -> ClusterShare:
        others = [h for who, h in self.held.get(at.timestamp(), {}).items() if who != name]
        return cluster_share(self.max_gpus, self.max_cost, others_gpus=sum(g for g, _ in others),
                             others_cost=sum(c for _, c in others), price_per_gpu_hour=price)

    def settle(self, name: str, at: datetime, gpus: int, price: float | None) -> None:
        self.held.setdefault(at.timestamp(), {})[name] = (gpus, gpus * (price or 0.0))


def _sharing(ledger: _Ledger, name: str, price: float | None, below: list[int]) -> type[Reconciler]:
    class Sharing(Reconciler):
        """The shared reconciler, handed the cluster's share as the controller hands it."""

        def step(self, state: PlannerState, *, cluster_share: ClusterShare | None = None,
                 cluster: ClusterPort | None = None) -> ReconcileResult:
            now = self.clock.now()
            share = ledger.share(name, now, price)
            own = allowance(self.spec.prewarm.budget).gpus
            if share.gpus is not None and share.gpus < own:
                below[0] += 1
            result = super().step(state, cluster_share=share, cluster=cluster)
            ledger.settle(name, now, result.decision.speculative_gpus if result.applied else 0, price)
            return result

    return Sharing


def run_fleet(trace: Series, scenario: Scenario) -> FleetResult:
    """Replay ``trace`` for every scaler of ``scenario.scalers`` under ``scenario.cluster_budget``."""
    if not scenario.scalers:
        raise ConfigError("the scenario lists no scalers; give scalers: [{name: a}, {name: b}, …] and a "
                          "cluster_budget to share", field="scalers")
    limits = scenario.cluster_budget or {}
    ledger = _Ledger(limits.get("maxGpus"), limits.get("maxCostPerHour"))
    runs: list[ScalerRun] = []
    for entry in scenario.scalers:
        sub = dataclasses.replace(
            scenario, name=f"{scenario.name}/{entry['name']}", policies=("predictive",), scalers=(),
            cluster_budget=None, spec=deep_merge(scenario.spec, entry.get("spec") or {}),
            peak_replicas=entry.get("peak_replicas", scenario.peak_replicas))
        setup = prepare(trace, sub)
        price = setup.spec.prewarm.budget.price_per_gpu_hour
        below = [0]
        first = initial_replicas(setup)
        run, _ = run_predictive(setup, initial_replicas=first,
                                reconciler_class=_sharing(ledger, entry["name"], price, below))
        spec_gpus = speculative_per_tick(run, counterfactual(setup, first), setup.scenario.cluster)
        runs.append(ScalerRun(entry["name"], setup, run, spec_gpus, below[0]))
    return FleetResult(tuple(runs), ledger.max_gpus, ledger.max_cost)
