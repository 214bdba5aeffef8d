"""The reactive policy: the Kubernetes HPA algorithm, on an aggregate demand metric.

Mapping: demand is an external/object metric with an AverageValue target of
``capacity_per_replica`` per replica; ``current`` is the scale's spec.replicas;
replicas that exist but are not ready are the HPA's "missing pods". As in the
HPA (pkg/controller/podautoscaler, documented in "Horizontal Pod Autoscaling"):

1. raw = ceil(current × ratio), no change while |ratio − 1| ≤ tolerance;
   with missing pods the ratio is recomputed assuming they use 0 % of the
   target on a scale-up and 100 % on a scale-down, and the change is dropped
   if that flips its direction or lands within tolerance;
2. stabilisation: the recommendation moves down only to the highest raw
   recommendation in the scale-down window (and up only to the lowest in the
   scale-up window);
3. rate limits: up by at most max(percent, pods) of the replicas at the start
   of the period, down by at most percent;
4. min/max clamps, reported.

Missing demand never scales down: the policy keeps ``current``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from predictive_scaler.policy.capacity import REPLICA_CAP, clamp, replicas_for
from predictive_scaler.policy.reasons import (
    Clamped,
    HpaRule,
    Limit,
    MissingDemandKept,
    RateLimited,
    Reason,
    Stabilised,
)
from predictive_scaler.spec import ReactiveBehavior

_EPS = 1e-9


@dataclass(frozen=True)
class ReactiveResult:
    desired: int
    raw: int
    recommendations: tuple[tuple[float, int], ...]
    limits: tuple[Limit, ...]
    reasons: tuple[Reason, ...]


def raw_recommendation(
    demand: float, capacity: float, current: int, ready: int, tolerance: float, unit: str = ""
) -> tuple[int, HpaRule]:
    """HPA's replica calculation (step 1) and the reason explaining it."""
    need = replicas_for(demand, capacity)
    if current <= 0:
        return need, HpaRule("need", demand, unit, capacity, need)
    ready = min(max(ready, 0), current)
    missing = current - ready
    ratio = demand / (ready * capacity) if ready > 0 else (math.inf if demand > 0 else 0.0)
    if missing == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current, HpaRule("tolerance", demand, unit, capacity, current, ratio=ratio, tolerance=tolerance,
                                    current=current)
        return _ceil(ratio * current), HpaRule("need", demand, unit, capacity, need)
    busy = ratio <= 1.0
    if not busy:
        new_ratio = demand / (current * capacity)
    else:
        new_ratio = (demand + missing * capacity) / (current * capacity)
    if abs(new_ratio - 1.0) <= tolerance or (ratio > 1.0) != (new_ratio > 1.0) or new_ratio == 1.0:
        return current, HpaRule("missing-keep", demand, unit, capacity, current, ratio=new_ratio, current=current,
                                not_ready=missing, counted_busy=busy)
    raw = _ceil(new_ratio * current)
    return raw, HpaRule("missing-ask", demand, unit, capacity, raw, ratio=new_ratio, current=current,
                        not_ready=missing, counted_busy=busy)


def _ceil(x: float) -> int:
    if not math.isfinite(x) or x >= REPLICA_CAP:
        return REPLICA_CAP
    return max(0, math.ceil(x - _EPS))


def recommend(
    behavior: ReactiveBehavior,
    *,
    demand: float | None,
    capacity: float,
    current: int,
    ready: int,
    min_replicas: int,
    max_replicas: int,
    recommendations: tuple[tuple[float, int], ...],
    scale_events: tuple[tuple[float, int], ...],
    now: float,
    unit: str = "",
) -> ReactiveResult:
    """One HPA evaluation at ``now``; ``demand=None`` means the metric is missing."""
    if demand is None:
        desired = clamp(max(current, min_replicas), min_replicas, max_replicas)
        held = (Limit.MAX_REPLICAS,) if desired < current else ()
        return ReactiveResult(desired, current, _prune(recommendations, behavior, now), held,
                              (MissingDemandKept(current),))
    raw, why = raw_recommendation(demand, capacity, current, ready, behavior.tolerance, unit)
    window = tuple((t, r) for t, r in _prune(recommendations, behavior, now) if t != now) + ((now, raw),)
    reasons: list[Reason] = [why]
    limits: list[Limit] = []

    up_cut = now - behavior.scale_up_stabilization_seconds
    down_cut = now - behavior.scale_down_stabilization_seconds
    up_rec = min(r for t, r in window if t > up_cut or t == now)
    down_rec = max(r for t, r in window if t > down_cut or t == now)
    rec = current
    if rec < up_rec:
        rec = up_rec
    if rec > down_rec:
        rec = down_rec
    if rec > raw and raw < current:
        reasons.append(Stabilised("down", behavior.scale_down_stabilization_seconds, down_rec, rec))
        limits.append(Limit.SCALE_DOWN_STABILIZATION)
    elif rec < raw and raw > current:
        reasons.append(Stabilised("up", behavior.scale_up_stabilization_seconds, up_rec, rec))
        limits.append(Limit.SCALE_UP_STABILIZATION)

    if rec > current:
        added = sum(n for t, n in scale_events if n > 0 and now - behavior.scale_up_period_seconds < t < now)
        start = max(0, current - added)
        by_percent = math.ceil(start * (1 + behavior.scale_up_percent / 100) - _EPS)
        by_pods = start + behavior.scale_up_pods
        limit = max(by_percent, by_pods)
        if rec > limit:
            limits.append(Limit.SCALE_UP_RATE)
            reasons.append(RateLimited("up", behavior.scale_up_percent, behavior.scale_up_pods,
                                       behavior.scale_up_period_seconds, start, limit, rec))
            rec = limit
    elif rec < current:
        removed = sum(-n for t, n in scale_events if n < 0 and now - behavior.scale_down_period_seconds < t < now)
        start = current + removed
        limit = math.ceil(start * (1 - behavior.scale_down_percent / 100) - _EPS)
        if rec < limit:
            limits.append(Limit.SCALE_DOWN_RATE)
            reasons.append(RateLimited("down", behavior.scale_down_percent, 0, behavior.scale_down_period_seconds,
                                       start, limit, rec))
            rec = limit

    desired = clamp(rec, min_replicas, max_replicas)
    if desired > rec:
        limits.append(Limit.MIN_REPLICAS)
        reasons.append(Clamped("min", min_replicas, rec, "reactive"))
    elif desired < rec:
        limits.append(Limit.MAX_REPLICAS)
        reasons.append(Clamped("max", max_replicas, rec, "reactive"))
    return ReactiveResult(desired, raw, window, tuple(limits), tuple(reasons))


def _prune(window: tuple[tuple[float, int], ...], behavior: ReactiveBehavior, now: float) -> tuple[tuple[float, int], ...]:
    keep = max(behavior.scale_down_stabilization_seconds, behavior.scale_up_stabilization_seconds)
    return tuple((t, r) for t, r in window if now - keep < t <= now)


def prune_events(events: tuple[tuple[float, int], ...], behavior: ReactiveBehavior, now: float) -> tuple[tuple[float, int], ...]:
    keep = max(behavior.scale_up_period_seconds, behavior.scale_down_period_seconds)
    return tuple((t, n) for t, n in events if now - keep < t <= now)
