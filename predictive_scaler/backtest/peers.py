"""The policies the predictive scaler is compared with, and the physical bound.

Each peer turns a demand timeline into a desired-replica schedule with numpy
(or a tight loop where the rule is sequential), so a 42-day, 1-minute backtest
costs milliseconds per peer; the simulator then plays the schedule.

- ``reactive``: HPA on the demand seen with the metrics delay (tolerance 10 %,
  300 s scale-down stabilisation, scale-up max(100 %, 4 pods) per 15 s,
  missing metrics never scale down, min/max clamps) — DESIGN §5.
- ``static``: a fixed fleet sized for the peak of the training window.
- ``holt-winters``: the Predictive HPA approach — Holt-Winters (damped additive,
  daily season) on the reactive replica recommendation, forecast over the node
  lead time, the max of that and the reactive recommendation fed to the HPA.
- ``oracle``: perfect foresight with the same lead times — at each tick it asks
  for the most replicas any tick within one cold-start lead time will need.
- the physical bound: whole nodes exactly fitting each tick's need, zero lead time.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from predictive_scaler.backtest.simulator import ClusterConfig, Demand

#: HPA defaults (DESIGN §5).
HPA_TOLERANCE = 0.1
HPA_DOWNSCALE_STABILIZATION_S = 300.0
HPA_SCALE_UP_PERIOD_S = 15.0


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int


def observed(demand: Demand, delay_s: float) -> np.ndarray:
    """What a metrics pipeline shows at each tick: the demand ``delay_s`` ago (NaN before any)."""
    lag = int(math.ceil(delay_s / demand.tick_s - 1e-9))
    out = np.full(len(demand), np.nan)
    if lag < len(demand):
        out[lag:] = demand.values[: len(demand) - lag]
    return out


def hpa_schedule(
    metric: np.ndarray,
    *,
    target_per_replica: float,
    bounds: Bounds,
    control_every: int,
    tick_s: int,
    initial: int,
    floor: np.ndarray | None = None,
    tolerance: float = HPA_TOLERANCE,
    stabilization_s: float = HPA_DOWNSCALE_STABILIZATION_S,
) -> np.ndarray:
    """Desired replicas per tick of an HPA whose metric is total demand (per-pod average × pods).

    ``floor`` (replicas per tick) is a recommendation the HPA must not go under
    — how the Holt-Winters peer injects its forecast.
    """
    n = metric.shape[0]
    out = np.empty(n, dtype=np.int64)
    period_s = control_every * tick_s
    window = max(1, int(round(stabilization_s / period_s)))
    ups = max(1, int(period_s // HPA_SCALE_UP_PERIOD_S))
    recent: list[int] = []
    current = int(np.clip(initial, bounds.min_replicas, bounds.max_replicas))
    for i in range(n):
        if i % control_every == 0:
            value = metric[i]
            if not math.isfinite(value):
                rec = current  # a missing metric never scales down
            else:
                ratio = value / (max(current, 1) * target_per_replica)
                if current > 0 and abs(ratio - 1.0) <= tolerance:
                    rec = current
                else:
                    rec = int(math.ceil(value / target_per_replica - 1e-9))
            if floor is not None:
                rec = max(rec, int(floor[i]))
            rec = int(np.clip(rec, bounds.min_replicas, bounds.max_replicas))
            recent.append(rec)
            if len(recent) > window:
                recent.pop(0)
            if rec > current:
                limit = current
                for _ in range(ups):
                    limit = max(2 * limit, limit + 4)
                current = min(rec, limit)
            else:
                current = min(current, max(recent))
        out[i] = current
    return out


def reactive_schedule(demand: Demand, config: ClusterConfig, bounds: Bounds, *, target_utilization: float,
                      control_every: int, initial: int) -> np.ndarray:
    return hpa_schedule(
        observed(demand, config.metrics_delay_s),
        target_per_replica=demand.capacity_per_replica * target_utilization,
        bounds=bounds, control_every=control_every, tick_s=demand.tick_s, initial=initial,
    )


def static_replicas(training_demand: np.ndarray, capacity_per_replica: float) -> int:
    """Replicas for the peak of the training window."""
    peak = float(np.nanmax(training_demand)) if np.isfinite(training_demand).any() else 0.0
    return max(1, int(math.ceil(peak / capacity_per_replica - 1e-9)))


def oracle_schedule(demand: Demand, config: ClusterConfig, bounds: Bounds) -> np.ndarray:
    """Perfect foresight: the most replicas needed within one cold-start lead time from now."""
    need = demand.need()
    ahead = int(math.ceil(config.cold_start_s / demand.tick_s)) + 1
    padded = np.concatenate([need, np.full(ahead - 1, need[-1] if need.size else 0)])
    schedule = sliding_window_view(padded, ahead).max(axis=1)
    return np.clip(schedule, bounds.min_replicas, bounds.max_replicas).astype(np.int64)


def bound_gpus(demand: Demand, config: ClusterConfig) -> np.ndarray:
    """GPUs of the whole nodes that exactly fit each tick's need (0 where demand is unknown)."""
    nodes = -(-demand.need() // config.replicas_per_node)
    return np.where(demand.known, nodes * config.gpus_per_node, 0)


# -- Holt-Winters peer ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HoltWintersState:
    alpha: float
    beta: float
    gamma: float
    phi: float
    level: float
    trend: float
    season: np.ndarray  # last m seasonal terms, oldest first


def fit_holt_winters(y: np.ndarray, season: int) -> HoltWintersState:
    """Damped additive Holt-Winters fitted by statsmodels on ``y`` (gaps interpolated)."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    y = _interpolate(y)
    use_season = season >= 2 and y.size >= 2 * season
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(
            y, trend="add", damped_trend=True,
            seasonal="add" if use_season else None,
            seasonal_periods=season if use_season else None,
            initialization_method="estimated",
        )
        res = model.fit()
    p = res.params
    season_terms = np.asarray(res.season[-season:], dtype=float) if use_season else np.zeros(max(season, 1))
    return HoltWintersState(
        alpha=float(p["smoothing_level"]), beta=float(p.get("smoothing_trend") or 0.0),
        gamma=float(p.get("smoothing_seasonal") or 0.0) if use_season else 0.0,
        phi=float(p.get("damping_trend") or 1.0),
        level=float(res.level[-1]), trend=float(res.trend[-1]), season=season_terms,
    )


def holt_winters_filter(state: HoltWintersState, y: np.ndarray, horizon: int) -> tuple[np.ndarray, HoltWintersState]:
    """Run the recursion over ``y``; row ``t`` is the max forecast over steps t+1..t+horizon made after y[t]."""
    a, b, g, phi = state.alpha, state.beta, state.gamma, state.phi
    level, trend = state.level, state.trend
    season = list(state.season)
    m = len(season)
    damp = np.cumsum(phi ** np.arange(1, horizon + 1))
    out = np.empty(y.size)
    for t, obs in enumerate(y):
        s_old = season[t % m]  # the seasonal term of this step, one season ago
        if math.isfinite(obs):
            new_level = a * (obs - s_old) + (1 - a) * (level + phi * trend)
            trend = b * (new_level - level) + (1 - b) * phi * trend
            season[t % m] = g * (obs - level - phi * trend) + (1 - g) * s_old
            level = new_level
        ahead = [season[(t + h) % m] for h in range(1, horizon + 1)]
        out[t] = float(np.max(level + damp * trend + np.asarray(ahead)))
    rolled = np.roll(np.asarray(season), -(y.size % m))
    return out, HoltWintersState(a, b, g, phi, level, trend, rolled)


def holt_winters_floor(
    demand: Demand,
    history: np.ndarray,
    *,
    ticks_per_step: int,
    season_steps: int,
    horizon_steps: int,
    retrain_steps: int,
    train_steps: int,
) -> np.ndarray:
    """Per tick, the Holt-Winters replica forecast (max over the lead time) known at that tick.

    ``history`` is the reactive recommendation (replicas) at the model step over
    training + evaluation; forecasts issued after step ``k`` apply from the
    first tick of step ``k + 1`` until the next step — only observed steps are used.
    """
    n_steps = history.size - train_steps
    usable = np.zeros(max(n_steps, 0))
    start = 0
    while start < n_steps:
        stop = min(n_steps, start + retrain_steps)
        # Refit on the latest training-length window, then filter from the step before
        # this block: the forecast made after step k-1 is what is known during step k.
        state = fit_holt_winters(history[start: train_steps + start - 1], season_steps)
        usable[start:stop], _ = holt_winters_filter(
            state, history[train_steps + start - 1: train_steps + stop - 1], horizon_steps)
        start = stop
    per_tick = np.repeat(np.ceil(np.clip(usable, 0, None) - 1e-9), ticks_per_step)[: len(demand)]
    if per_tick.size < len(demand):
        per_tick = np.concatenate([per_tick, np.full(len(demand) - per_tick.size, per_tick[-1] if per_tick.size else 0)])
    return per_tick.astype(np.int64)


def _interpolate(y: np.ndarray) -> np.ndarray:
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    if ok.all():
        return y
    if not ok.any():
        return np.zeros_like(y)
    idx = np.arange(y.size)
    return np.interp(idx, idx[ok], y[ok])
