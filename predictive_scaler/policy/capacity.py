"""Demand → replicas, and the forecast seen from ``now``.

Pure arithmetic. Every input may be NaN, infinite, negative or huge; every
output is a finite, non-negative whole number no larger than :data:`REPLICA_CAP`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from predictive_scaler.core.values import Forecast
from predictive_scaler.errors import ModelError

#: No decision ever exceeds this many replicas or GPUs, whatever the input.
REPLICA_CAP = 10**9

#: Float noise allowance so 3.0000000000000004 replicas is 3, not 4.
_EPS = 1e-9


def replicas_for(demand: float, capacity_per_replica: float) -> int:
    """Whole replicas needed to serve ``demand``; bad demand (NaN, <0) needs none."""
    if not (capacity_per_replica > 0) or not math.isfinite(capacity_per_replica):
        return 0
    if not (demand > 0):  # also catches NaN
        return 0
    ratio = demand / capacity_per_replica
    if not math.isfinite(ratio) or ratio >= REPLICA_CAP:
        return REPLICA_CAP
    return max(0, math.ceil(ratio - _EPS))


def clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


@dataclass(frozen=True)
class ForecastView:
    """The planned-on quantile (and P50 if present) of a forecast, on epoch-second steps."""

    issued_at: float
    step_seconds: int
    pq: np.ndarray
    p50: np.ndarray | None
    model: str

    def step_start(self, h: int) -> float:
        return self.issued_at + (h + 1) * self.step_seconds

    def index_at(self, t: float) -> int:
        """Index of the forecast step containing time ``t`` (may be out of range)."""
        return math.floor((t - self.issued_at) / self.step_seconds) - 1

    def max_over(self, start: float, end: float) -> tuple[float, bool]:
        """Highest planned-on quantile over the steps overlapping [start, end]; and whether the
        horizon reached ``end``."""
        n = len(self.pq)
        lo = max(0, self.index_at(start))
        hi = math.ceil((end - self.issued_at) / self.step_seconds) - 2
        covered = hi <= n - 1
        hi = min(max(hi, lo), n - 1)
        return float(np.max(self.pq[lo:hi + 1])), covered

    def spread_over(self, start: float, end: float) -> float:
        """How far the planned-on quantile's peak over [start, end] lies above the P50's (≥ 0; 0 without a P50)."""
        if self.p50 is None or len(self.p50) != len(self.pq):
            return 0.0
        top, _ = self.max_over(start, end)
        median, _ = ForecastView(self.issued_at, self.step_seconds, self.p50, None, self.model).max_over(start, end)
        return max(0.0, top - median)


def view_forecast(
    forecast: Forecast | None, quantile: float, now: float, max_lag_steps: int = 2
) -> tuple[ForecastView | None, str | None]:
    """A usable view of ``forecast`` at ``now``, or ``(None, why not)``.

    A forecast is stale when the step containing ``now`` lies more than
    ``max_lag_steps`` steps after the first forecast step (the model missed
    data), or beyond its horizon; it is invalid when it was issued in the future,
    is empty, or lacks the quantile the spec plans on.
    """
    if forecast is None:
        return None, "no forecast is available"
    if forecast.horizon_steps == 0:
        return None, f"the forecast from {forecast.model} is empty (0 steps)"
    try:
        pq = forecast.quantile(quantile)
    except ModelError:
        return None, (f"the forecast from {forecast.model} has quantiles {list(forecast.quantiles)}, "
                      f"not the P{quantile * 100:g} the spec plans on")
    try:
        p50: np.ndarray | None = forecast.quantile(0.5)
    except ModelError:
        p50 = None
    view = ForecastView(forecast.issued_at.timestamp(), int(forecast.step_seconds), pq, p50, forecast.model)
    h = view.index_at(now)
    if view.issued_at > now:
        return None, (f"the forecast from {forecast.model} was issued in the future "
                      f"({forecast.issued_at.isoformat()}); check the metrics clock")
    if h >= view.pq.shape[0] or h > max_lag_steps:
        lag = (now - view.issued_at) / 60
        return None, (f"the forecast from {forecast.model} is stale: issued {lag:.0f} min ago from data that "
                      f"ended at {forecast.issued_at.isoformat()}")
    return view, None
