"""The policies the predictive scaler is compared with, and the physical bound.

Each peer turns a demand timeline into a desired-replica schedule with numpy
(or a tight loop where the rule is sequential), so a 42-day, 1-minute backtest
costs milliseconds per peer; the simulator then plays the schedule.

- ``reactive``: the planner's own HPA rule (policy/reactive.py: tolerance,
  scale-down stabilisation, scale-up rate, missing metrics never scale down,
  min/max clamps) on the demand the measurement chain shows (:func:`observed`).
- ``static``: a fixed fleet sized for the peak of the training window.
- ``holt-winters``: the Predictive HPA approach — Holt-Winters (damped additive,
  daily season) on the reactive replica recommendation, forecast over the node
  lead time, the max of that and the observed demand fed to the same HPA rule.
- ``oracle``: perfect foresight with the same lead times — at each tick it asks
  for the most replicas any tick within one cold-start lead time will need.
- the physical bound: whole nodes exactly fitting each tick's need, zero lead time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from predictive_scaler.backtest.scenario import MeasurementChain
from predictive_scaler.backtest.simulator import ClusterConfig, Demand, SimulatedCluster
from predictive_scaler.policy.reactive import prune_events, recommend
from predictive_scaler.series import Series
from predictive_scaler.spec import ReactiveBehavior


@dataclass(frozen=True)
class Bounds:
    min_replicas: int
    max_replicas: int


def observed(trace: Series, times_s: np.ndarray, chain: MeasurementChain, delay_s: float) -> np.ndarray:
    """What the demand query returns at each time (epoch seconds): the trace through the measurement
    chain — a ``rate()`` window of scraped counters, ``delay_s`` late (NaN = no value)."""
    return chain.signal(trace.values, trace.start.timestamp(), trace.step_seconds, times_s, delay_s)


class HpaControl:
    """The reactive policy as a simulator control step: the planner's own HPA rule
    (:func:`predictive_scaler.policy.reactive.recommend`) on the delayed demand metric.

    ``floor`` (demand units per tick) is a forecast the HPA must not go under —
    how the Holt-Winters peer injects its prediction, as the Predictive HPA does.
    """

    def __init__(
        self,
        metric: np.ndarray,
        *,
        behavior: ReactiveBehavior,
        capacity: float,
        bounds: Bounds,
        floor: np.ndarray | None = None,
    ) -> None:
        self.metric = metric
        self.behavior = behavior
        self.capacity = capacity
        self.bounds = bounds
        self.floor = floor
        self._recommendations: tuple[tuple[float, int], ...] = ()
        self._events: tuple[tuple[float, int], ...] = ()

    def __call__(self, i: int, now_s: float, cluster: SimulatedCluster) -> bool:
        value = float(self.metric[i])
        observed_value: float | None = value if math.isfinite(value) else None
        forecast_won = False
        if self.floor is not None and observed_value is not None and self.floor[i] > observed_value:
            observed_value, forecast_won = float(self.floor[i]), True
        snap_current = cluster.desired_replicas
        result = recommend(
            self.behavior,
            demand=observed_value,
            capacity=self.capacity,
            current=snap_current,
            ready=cluster.ready_replicas(now_s),
            min_replicas=self.bounds.min_replicas,
            max_replicas=self.bounds.max_replicas,
            recommendations=self._recommendations,
            scale_events=self._events,
            now=now_s,
        )
        self._recommendations = result.recommendations
        if result.desired != snap_current:
            self._events = prune_events(self._events + ((now_s, result.desired - snap_current),), self.behavior, now_s)
        cluster.apply(result.desired, 0, now_s)
        return not forecast_won


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


#: Smoothing parameters of the Holt-Winters peer. The Predictive HPA takes them from
#: its user rather than fitting them; these are a moderate, commonly used setting.
HW_ALPHA, HW_BETA, HW_GAMMA, HW_PHI = 0.5, 0.05, 0.3, 0.98


def fit_holt_winters(y: np.ndarray, season: int) -> HoltWintersState:
    """Damped additive Holt-Winters with fixed smoothing, state initialised and filtered over ``y``.

    Initial state: level = mean of the first season, no trend, seasonal terms =
    the mean deviation of each slot of the season from its day's mean (gaps interpolated).
    """
    y = _interpolate(y)
    m = max(1, season)
    days = y.size // m
    if days >= 1:
        cycles = y[: days * m].reshape(days, m)
        season_terms = (cycles - cycles.mean(axis=1, keepdims=True)).mean(axis=0)
        level = float(cycles[0].mean())
    else:
        season_terms, level = np.zeros(m), float(y.mean()) if y.size else 0.0
    start = HoltWintersState(HW_ALPHA, HW_BETA, HW_GAMMA, HW_PHI, level, 0.0, season_terms)
    _, state = holt_winters_filter(start, y, 1)
    return state


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


# -- the counterfactual the prewarm budget is audited against ------------------------------------

def counterfactual_schedule(metric: np.ndarray, *, behavior: ReactiveBehavior, capacity: float, bounds: Bounds,
                            initial_replicas: int, tick_s: int, control_every: int = 1) -> np.ndarray:
    """Per tick, the replicas the HPA rule alone would hold, stepped on its own count from the demand only.

    ``metric`` is the demand the planner saw at each tick (NaN = missing: the rule holds). The first
    evaluation starts from ``initial_replicas`` (all ready), as the planner's counterfactual does; this
    replay never sees what any policy did, so speculation cannot raise it.
    """
    out = np.zeros(metric.size, dtype=np.int64)
    current = int(initial_replicas)
    recs: tuple[tuple[float, int], ...] = ()
    events: tuple[tuple[float, int], ...] = ()
    for i in range(metric.size):
        if i % control_every == 0:
            now = float(i * tick_s)
            value = float(metric[i])
            r = recommend(behavior, demand=value if math.isfinite(value) else None, capacity=capacity,
                          current=current, ready=current, min_replicas=bounds.min_replicas,
                          max_replicas=bounds.max_replicas, recommendations=recs, scale_events=events, now=now)
            recs = r.recommendations
            if r.desired != current:
                events = prune_events(events + ((now, r.desired - current),), behavior, now)
            current = r.desired
        out[i] = current
    return out
