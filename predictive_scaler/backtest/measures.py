"""What a policy cost and how well it served, and how good the forecasts were.

All measures are taken over the ticks whose demand is known (a trace gap is
neither served nor billed: it is outside the evidence). Undefined values are
``None`` (JSON ``null``), never NaN.

Wasted prewarm, in GPU-hours and currency: at each tick the *speculative* GPUs
are those held by placeholders plus those of replicas above what the reactive
policy holds at that tick; the part of them that demand does not need (at the
reactive target) within one node lead time is waste — capacity bought earlier
than reacting would have needed, or never needed before it was released.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from predictive_scaler.backtest.simulator import ClusterConfig, Demand, PolicyRun

# The MASE scale is the engine's, one definition (None on a flat window); re-exported for adapters.py.
from predictive_scaler.forecasting.metrics import naive_scale  # noqa: F401


@dataclass(frozen=True)
class PolicyMeasures:
    gpu_hours: float
    cost: float
    slo_attainment: float | None
    unmet_minutes: float
    unserved_requests: float
    prewarm_gpu_hours: float
    wasted_prewarm_cost: float
    scale_events: int
    reactive_minutes: float | None

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
    reactive_desired: np.ndarray,
    reactive_need: np.ndarray,
    demand_unit_seconds: float,
) -> PolicyMeasures:
    """Measures of one policy run. ``reactive_desired`` is the reactive peer's schedule and
    ``reactive_need`` the replicas demand needs at the reactive target, per tick."""
    known = demand.known
    tick_h = demand.tick_s / 3600.0
    d = np.where(known, demand.values, 0.0)
    capacity = run.ready * demand.capacity_per_replica
    served = np.minimum(d, capacity)
    short = np.where(known, d - served, 0.0)
    total = float(d.sum())
    gpu_hours = float(run.billed_gpus[known].sum() * tick_h)
    wasted_gpu_hours = float(wasted_speculative_gpus(run, demand, config, reactive_desired, reactive_need)[known].sum() * tick_h)
    # A change of desired replicas between ticks is one scale event (the first tick is the start state).
    events = int(np.count_nonzero(np.diff(run.desired))) if run.desired.size > 1 else 0
    return PolicyMeasures(
        gpu_hours=gpu_hours,
        cost=gpu_hours * config.price_per_gpu_hour,
        slo_attainment=float(served.sum() / total) if total > 0 else None,
        unmet_minutes=float(np.count_nonzero(short > 1e-9 * max(1.0, demand.capacity_per_replica)) * demand.tick_s / 60.0),
        unserved_requests=float(short.sum() * demand.tick_s / demand_unit_seconds),
        prewarm_gpu_hours=float(run.placeholder_gpus[known].sum() * tick_h),
        wasted_prewarm_cost=wasted_gpu_hours * config.price_per_gpu_hour,
        scale_events=events,
        reactive_minutes=None if run.fallback is None else float(np.count_nonzero(run.fallback & known) * demand.tick_s / 60.0),
    )


def wasted_speculative_gpus(
    run: PolicyRun,
    demand: Demand,
    config: ClusterConfig,
    reactive_desired: np.ndarray,
    reactive_need: np.ndarray,
) -> np.ndarray:
    """Per tick, speculative GPUs not needed by demand within one node lead time (see module doc)."""
    gpr = config.gpus_per_replica
    speculative = run.placeholder_gpus + gpr * np.maximum(0, run.desired - reactive_desired)
    ahead = int(math.ceil(config.cold_start_s / demand.tick_s)) + 1
    need = reactive_need
    padded = np.concatenate([need, np.zeros(ahead - 1, dtype=need.dtype)])
    peak_ahead = sliding_window_view(padded, ahead).max(axis=1)
    justified = gpr * np.maximum(0, peak_ahead - reactive_desired)
    return np.maximum(0, speculative - justified)


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

