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
from predictive_scaler.spec import ReactiveBehavior

_EPS = 1e-9


@dataclass(frozen=True)
class ReactiveResult:
    desired: int
    raw: int
    recommendations: tuple[tuple[float, int], ...]
    limits: tuple[str, ...]
    reasons: tuple[str, ...]


def raw_recommendation(
    demand: float, capacity: float, current: int, ready: int, tolerance: float, unit: str = ""
) -> tuple[int, str]:
    """HPA's replica calculation (step 1) and a sentence explaining it."""
    need = replicas_for(demand, capacity)
    per = f"{capacity:g} {unit} per replica".strip()
    if current <= 0:
        return need, f"observed demand {demand:.4g} {unit} needs {need} replicas at {per}"
    ready = min(max(ready, 0), current)
    missing = current - ready
    ratio = demand / (ready * capacity) if ready > 0 else (math.inf if demand > 0 else 0.0)
    if missing == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current, (f"observed demand {demand:.4g} {unit} is {ratio:.0%} of the {current} replicas' "
                             f"capacity, within the {tolerance:.0%} tolerance: keep {current}")
        return _ceil(ratio * current), f"observed demand {demand:.4g} {unit} needs {need} replicas at {per}"
    if ratio > 1.0:
        new_ratio = demand / (current * capacity)
        assumption = f"{missing} not-ready replicas counted as idle"
    else:
        new_ratio = (demand + missing * capacity) / (current * capacity)
        assumption = f"{missing} not-ready replicas counted as fully busy"
    if abs(new_ratio - 1.0) <= tolerance or (ratio > 1.0) != (new_ratio > 1.0) or new_ratio == 1.0:
        return current, (f"observed demand {demand:.4g} {unit} with {assumption} is {new_ratio:.0%} of "
                         f"{current} replicas' capacity: keep {current}")
    raw = _ceil(new_ratio * current)
    return raw, f"observed demand {demand:.4g} {unit} with {assumption} asks for {raw} replicas at {per}"


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
        held = ("max-replicas",) if desired < current else ()
        return ReactiveResult(desired, current, _prune(recommendations, behavior, now), held, (
            f"demand is missing, so the reactive policy keeps the current {current} replicas "
            "(missing metrics never scale down)",))
    raw, why = raw_recommendation(demand, capacity, current, ready, behavior.tolerance, unit)
    window = tuple((t, r) for t, r in _prune(recommendations, behavior, now) if t != now) + ((now, raw),)
    reasons = [f"reactive (HPA rule): {why}"]
    limits: list[str] = []

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
        limits.append("scale-down-stabilization")
        reasons.append(f"scale-down stabilisation: the highest recommendation in the last "
                       f"{behavior.scale_down_stabilization_seconds} s is {down_rec}, so not below {rec}")
    elif rec < raw and raw > current:
        limits.append("scale-up-stabilization")
        reasons.append(f"scale-up stabilisation: the lowest recommendation in the last "
                       f"{behavior.scale_up_stabilization_seconds} s is {up_rec}")

    if rec > current:
        added = sum(n for t, n in scale_events if n > 0 and now - behavior.scale_up_period_seconds < t < now)
        start = max(0, current - added)
        by_percent = math.ceil(start * (1 + behavior.scale_up_percent / 100) - _EPS)
        by_pods = start + behavior.scale_up_pods
        limit = max(by_percent, by_pods)
        if rec > limit:
            limits.append("scale-up-rate")
            reasons.append(f"scale-up rate limit: at most max({behavior.scale_up_percent} %, "
                           f"{behavior.scale_up_pods} pods) per {behavior.scale_up_period_seconds} s from "
                           f"{start}, so {limit} instead of {rec}")
            rec = limit
    elif rec < current:
        removed = sum(-n for t, n in scale_events if n < 0 and now - behavior.scale_down_period_seconds < t < now)
        start = current + removed
        limit = math.ceil(start * (1 - behavior.scale_down_percent / 100) - _EPS)
        if rec < limit:
            limits.append("scale-down-rate")
            reasons.append(f"scale-down rate limit: at most {behavior.scale_down_percent} % per "
                           f"{behavior.scale_down_period_seconds} s from {start}, so {limit} instead of {rec}")
            rec = limit

    desired = clamp(rec, min_replicas, max_replicas)
    if desired > rec:
        limits.append("min-replicas")
        reasons.append(f"clamped up to minReplicas {min_replicas} (reactive asked for {rec})")
    elif desired < rec:
        limits.append("max-replicas")
        reasons.append(f"clamped down to maxReplicas {max_replicas} (reactive asked for {rec})")
    return ReactiveResult(desired, raw, window, tuple(limits), tuple(reasons))


def _prune(window: tuple[tuple[float, int], ...], behavior: ReactiveBehavior, now: float) -> tuple[tuple[float, int], ...]:
    keep = max(behavior.scale_down_stabilization_seconds, behavior.scale_up_stabilization_seconds)
    return tuple((t, r) for t, r in window if now - keep < t <= now)


def prune_events(events: tuple[tuple[float, int], ...], behavior: ReactiveBehavior, now: float) -> tuple[tuple[float, int], ...]:
    keep = max(behavior.scale_up_period_seconds, behavior.scale_down_period_seconds)
    return tuple((t, n) for t, n in events if now - keep < t <= now)
