"""What a policy cost and how well it served, and how good the forecasts were.

All measures are taken over the ticks whose demand is known (a trace gap is
neither served nor billed: it is outside the evidence). Undefined values are
``None`` (JSON ``null``), never NaN.

Wasted prewarm cost, in billed money (:func:`wasted_billed_gpus`): at each tick
the GPUs the policy is *billed* for (whole nodes) above what the reactive peer is
billed for at that tick are what the forecast added; the part of them that
demand does not need within one node lead time — the whole nodes that the
highest need (at the reactive target) over the next cold start would take,
beyond the reactive peer's — is waste, priced at the GPU-hour price. It is split
into the whole nodes that exist only because of placeholders
(``wasted_placeholder_cost``: packed, the nodes replicas + placeholders take
beyond those the replicas alone take) and the rest (``wasted_replica_cost``:
extra replicas), so the two parts add up to ``wasted_prewarm_cost``.

Budget audit (:func:`audit_budget`): every tick, the speculative GPUs of a
budgeted policy — placeholders plus replicas above the counterfactual (the HPA
rule replayed on the demand alone), or the whole nodes they need beyond the
counterfactual's if more — against the budget's allowance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from predictive_scaler.backtest.simulator import ClusterConfig, Demand, PolicyRun


@dataclass(frozen=True)
class PolicyMeasures:
    gpu_hours: float
    cost: float
    slo_attainment: float | None
    unmet_minutes: float
    unserved_requests: float
    prewarm_gpu_hours: float
    wasted_prewarm_cost: float
    wasted_placeholder_cost: float
    wasted_replica_cost: float
    scale_events: int
    reactive_minutes: float | None
    #: Budget audit (policies with a prewarm budget; None for the others).
    max_speculative_gpus: int | None = None
    minutes_over_budget: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BoundMeasures:
    gpu_hours: float
    cost: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_policy(
    run: PolicyRun,
    demand: Demand,
    config: ClusterConfig,
    *,
    reactive_billed: np.ndarray,
    reactive_need: np.ndarray,
    demand_unit_seconds: float,
    audit: BudgetAudit | None = None,
) -> PolicyMeasures:
    """Measures of one policy run. ``reactive_billed`` is the reactive peer's billed GPUs and
    ``reactive_need`` the replicas demand needs at the reactive target, per tick."""
    known = demand.known
    tick_h = demand.tick_s / 3600.0
    d = np.where(known, demand.values, 0.0)
    capacity = run.ready * demand.capacity_per_replica
    served = np.minimum(d, capacity)
    short = np.where(known, d - served, 0.0)
    total = float(d.sum())
    gpu_hours = float(run.billed_gpus[known].sum() * tick_h)
    wasted, wasted_ph = wasted_billed_gpus(run, demand, config, reactive_billed, reactive_need)
    price_h = tick_h * config.price_per_gpu_hour
    wasted_cost = float(wasted[known].sum() * price_h)
    wasted_ph_cost = float(wasted_ph[known].sum() * price_h)
    # A change of desired replicas between ticks is one scale event (the first tick is the start state).
    events = int(np.count_nonzero(np.diff(run.desired))) if run.desired.size > 1 else 0
    return PolicyMeasures(
        gpu_hours=gpu_hours,
        cost=gpu_hours * config.price_per_gpu_hour,
        slo_attainment=float(served.sum() / total) if total > 0 else None,
        unmet_minutes=float(np.count_nonzero(short > 1e-9 * max(1.0, demand.capacity_per_replica)) * demand.tick_s / 60.0),
        unserved_requests=float(short.sum() * demand.tick_s / demand_unit_seconds),
        prewarm_gpu_hours=float(run.placeholder_gpus[known].sum() * tick_h),
        wasted_prewarm_cost=wasted_cost,
        wasted_placeholder_cost=wasted_ph_cost,
        wasted_replica_cost=wasted_cost - wasted_ph_cost,
        scale_events=events,
        reactive_minutes=None if run.fallback is None else float(np.count_nonzero(run.fallback & known) * demand.tick_s / 60.0),
        max_speculative_gpus=None if audit is None else audit.max_speculative_gpus,
        minutes_over_budget=None if audit is None else audit.minutes_over_budget,
    )


def _packed(gpus: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """GPUs of the whole nodes that ``gpus`` GPUs take, packed."""
    return -(-np.maximum(0, gpus) // gpus_per_node) * gpus_per_node


def wasted_billed_gpus(
    run: PolicyRun,
    demand: Demand,
    config: ClusterConfig,
    reactive_billed: np.ndarray,
    reactive_need: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per tick, (wasted billed GPUs, the part of them due to placeholders) — see the module doc."""
    gpr, gpn = config.gpus_per_replica, config.gpus_per_node
    added = np.maximum(0, run.billed_gpus - reactive_billed)
    ahead = int(math.ceil(config.cold_start_s / demand.tick_s)) + 1
    need = np.asarray(reactive_need)
    padded = np.concatenate([need, np.zeros(ahead - 1, dtype=need.dtype)])
    peak_ahead = sliding_window_view(padded, ahead).max(axis=1)
    justified = np.maximum(0, _packed(peak_ahead * gpr, gpn) - reactive_billed)
    wasted = np.maximum(0, added - justified)
    replica_gpus = run.desired * gpr
    placeholder_nodes = _packed(replica_gpus + run.placeholder_gpus, gpn) - _packed(replica_gpus, gpn)
    return wasted, np.minimum(wasted, placeholder_nodes)


@dataclass(frozen=True)
class BudgetAudit:
    max_speculative_gpus: int
    minutes_over_budget: float


def speculative_per_tick(run: PolicyRun, counterfactual: np.ndarray, config: ClusterConfig) -> np.ndarray:
    """Speculative GPUs each tick: placeholders + replicas above the counterfactual, or whole nodes if more."""
    gpr, gpn = config.gpus_per_replica, config.gpus_per_node
    held = run.desired * gpr + run.placeholder_gpus
    excess = np.maximum(0, run.desired - counterfactual) * gpr + run.placeholder_gpus
    nodes = _packed(held, gpn) - _packed(counterfactual * gpr, gpn)
    return np.maximum(excess, nodes)


def audit_budget(run: PolicyRun, counterfactual: np.ndarray, config: ClusterConfig, allowed_gpus: int) -> BudgetAudit:
    """The prewarm budget checked every tick against the independently replayed counterfactual."""
    spec = speculative_per_tick(run, counterfactual, config)
    over = int(np.count_nonzero(spec > allowed_gpus))
    return BudgetAudit(int(spec.max()) if spec.size else 0, over * run.tick_s / 60.0)


def measure_bound(bound_gpus: np.ndarray, demand: Demand, config: ClusterConfig) -> BoundMeasures:
    gpu_hours = float(bound_gpus[demand.known].sum() * demand.tick_s / 3600.0)
    return BoundMeasures(gpu_hours=gpu_hours, cost=gpu_hours * config.price_per_gpu_hour)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b <= 0:
        return None
    return a / b


# -- forecast accuracy --------------------------------------------------------------------------------

@dataclass(frozen=True)
class HorizonAccuracy:
    mae: float | None
    wape: float | None
    mase: float | None
    pinball: float | None
    coverage: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "n"}


def horizon_accuracy(
    median: np.ndarray,
    upper: np.ndarray,
    actual: np.ndarray,
    *,
    quantile: float,
    naive_mae: float | None,
) -> HorizonAccuracy:
    """Point (P50) and quantile (``upper``) accuracy against ``actual``; pairs with a gap are skipped."""
    ok = np.isfinite(actual) & np.isfinite(median) & np.isfinite(upper)
    n = int(ok.sum())
    if n == 0:
        return HorizonAccuracy(None, None, None, None, None, 0)
    y, p50, pq = actual[ok], median[ok], upper[ok]
    err = np.abs(y - p50)
    mae = float(err.mean())
    denom = float(np.abs(y).sum())
    diff = y - pq
    pinball = float(np.mean(np.maximum(quantile * diff, (quantile - 1) * diff)))
    return HorizonAccuracy(
        mae=mae,
        wape=float(err.sum() / denom) if denom > 0 else None,
        mase=mae / naive_mae if naive_mae and naive_mae > 0 else None,
        pinball=pinball,
        coverage=float(np.mean(y <= pq)),
        n=n,
    )

