"""The planner: forecast + observed demand + cluster state → a decision. Pure.

No I/O, no clock: ``now`` is an argument and all memory is the explicit,
serialisable :class:`PlannerState`. Strategies:

- ``predictive`` — replicas for the highest planned-on quantile (P95) over the
  next pod-start lead time, never below the reactive policy's ask; placeholder
  GPUs for the extra demand expected over the next node lead time beyond the
  replicas that exist or are starting (free GPUs on existing nodes absorb what
  they can). Everything above the reactive ask is speculative and bounded by
  the hard budget: first the replicas, then whole placeholder nodes.
- ``reactive`` — the HPA algorithm (see :mod:`reactive`), no speculation;
  used when the model is missing/stale/invalid, the forecast drifts, or demand
  has been missing for more than ``missingDataPeriods`` control periods.
- ``hold`` — no valid demand: keep the current replicas, never scale down,
  keep (never add) placeholders within the budget.

docs/planner.md lists every reason and limit string.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# DemandSample lives in the core (sources need it); re-exported here (__all__).
from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy import budget as budget_policy
from predictive_scaler.policy import drift as drift_policy
from predictive_scaler.policy import events as event_policy
from predictive_scaler.policy import reactive as reactive_policy
from predictive_scaler.policy.capacity import REPLICA_CAP, clamp, replicas_for, view_forecast
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import ScalerSpec

__all__ = ["ClusterState", "Decision", "DemandSample", "PlannerState", "plan"]

#: With replicas ahead, the plan releases below the HPA floor only while its forecast over the lead
#: time is at least this share of the demand observed now (else the model lags a level shift).
CAUGHT_UP_RATIO = 0.8
#: A release below the current replicas must fit the planned-on quantile plus this many times its
#: spread above the P50 (roughly P85 → P90 for a normal forecast): releases need more confidence than
#: holding, since a node released and soon needed again comes back only after a cold start.
RELEASE_SPREAD = 0.5


@dataclass(frozen=True)
class ClusterState:
    """What the cluster looks like now, as the adapter observed it.

    ``free_gpus`` are GPUs on existing nodes that no pod (placeholders included) requests.
    """

    desired_replicas: int
    ready_replicas: int
    starting_replicas: int = 0
    placeholder_gpus: int = 0
    free_gpus: int = 0


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    placeholder_gpus: int
    strategy: str  # "predictive" | "reactive" | "hold"
    speculative_gpus: int
    speculative_cost_per_hour: float | None
    limits: tuple[str, ...]
    reasons: tuple[str, ...]
    currency: str = "USD"
    #: What the HPA rule alone would do now (the floor of the predictive strategy).
    reactive_replicas: int = 0
    #: Replicas the forecast asked for before the budget (predictive only).
    predicted_replicas: int | None = None
    demand: float | None = None
    #: Highest planned-on quantile over the pod / node lead time.
    forecast_pod_lead: float | None = None
    forecast_node_lead: float | None = None
    drift: str | None = None
    metrics_problem: str | None = None
    model_problem: str | None = None
    budget_problem: str | None = None
    strategy_changed: bool = field(default=False)
    #: Names of the scheduled events (spec.events) in force.
    scheduled_events: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "desiredReplicas": self.desired_replicas,
            "placeholderGpus": self.placeholder_gpus,
            "strategy": self.strategy,
            "speculativeGpus": self.speculative_gpus,
            "speculativeCostPerHour": self.speculative_cost_per_hour,
            "currency": self.currency,
            "reactiveReplicas": self.reactive_replicas,
            "predictedReplicas": self.predicted_replicas,
            "demand": self.demand,
            "forecastPodLead": self.forecast_pod_lead,
            "forecastNodeLead": self.forecast_node_lead,
            "drift": self.drift,
            "limits": list(self.limits),
            "reasons": list(self.reasons),
            "scheduledEvents": list(self.scheduled_events),
        }


def _count(v: Any) -> int:
    """A cluster count as a sane non-negative int (adapters may hand us garbage)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0
    if not math.isfinite(f) or f <= 0:
        return 0
    return int(min(f, REPLICA_CAP))


def _demand_value(demand: DemandSample | None, now: float, max_age: int) -> tuple[float | None, str | None]:
    if demand is None:
        return None, "no demand observation"
    try:
        v = float(demand.value)
    except (TypeError, ValueError):
        return None, f"demand {demand.value!r} is not a number"
    if math.isnan(v):
        return None, "demand is NaN (empty or partial metrics)"
    if math.isinf(v) or v < 0:
        return None, f"demand {v} is not a finite non-negative number"
    if demand.observed_at is not None:
        age = now - demand.observed_at.timestamp()
        if age > max_age:
            return None, f"demand is stale: observed {age:.0f} s ago (maxAgeSeconds {max_age})"
    return v, None


def plan(
    spec: ScalerSpec,
    forecast: Forecast | None,
    demand: DemandSample | None,
    cluster: ClusterState,
    state: PlannerState,
    now: datetime,
    *,
    forecast_problem: str | None = None,
    metrics_problem: str | None = None,
) -> tuple[Decision, PlannerState]:
    """Decide replicas and placeholders for ``now``. Pure; same inputs → same outputs.

    ``forecast_problem``/``metrics_problem`` let the caller say why a forecast or a
    demand sample is missing (the ModelError/SourceError message) for the reasons.
    """
    t = now.timestamp()
    current = _count(cluster.desired_replicas)
    placeholders_now = _count(cluster.placeholder_gpus)
    free = _count(cluster.free_gpus)
    lo, hi = spec.min_replicas, spec.max_replicas
    cap = spec.capacity_per_replica
    unit = spec.demand_unit
    gpr = spec.gpus_per_replica
    gpn = spec.prewarm.gpus_per_node
    allow = budget_policy.allowance(spec.prewarm.budget)
    currency = allow.currency

    value, demand_problem = _demand_value(demand, t, spec.demand.max_age_seconds)
    observed_at = demand.observed_at.timestamp() if value is not None and demand and demand.observed_at else None
    if value is None and metrics_problem:
        demand_problem = f"{metrics_problem}; {demand_problem}" if demand is not None else metrics_problem
    view, view_problem = view_forecast(forecast, spec.quantile, t)
    model_problem = None
    if view is None:
        model_problem = forecast_problem or view_problem

    drift_state = state.drift
    if view is not None:
        drift_state = drift_policy.refresh_pending(drift_state, view, t, observed_at)
    # The counterfactual: the HPA rule stepped on its own replica count, never on the replicas the
    # forecast raised (else HPA tolerance and the scale-down window fold speculation into the floor).
    # It counts all its replicas ready (it has no pods to observe); the first decision, before any
    # speculation, starts it from the workload as the HPA would: its replicas and their readiness.
    retried = state.last_decided_at == t
    stored = state.counterfactual_prior if retried else state.counterfactual
    if stored is not None:
        cf_before = cf_ready = stored
    else:
        cf_before, cf_ready = current, _count(cluster.ready_replicas)
    events = reactive_policy.prune_events(state.scale_events, spec.reactive, t)
    reasons: list[str] = []
    limits: list[str] = []
    predicted: int | None = None
    q_pod = q_node = None
    placeholders = 0

    reactive = reactive_policy.recommend(
        spec.reactive, demand=value, capacity=cap * spec.reactive.target_utilization, current=cf_before,
        ready=cf_ready,
        min_replicas=lo, max_replicas=hi, recommendations=state.recommendations,
        scale_events=events, now=t, unit=unit,
    )
    cf = reactive.desired
    if cf != cf_before:
        events = tuple(e for e in events if e[0] != t) + ((t, cf - cf_before),)

    def speculative(replicas: int, gpus_held: int) -> int:
        return budget_policy.speculative_gpus(replicas, gpus_held, cf, gpr, gpn)

    if value is None:
        missing_since = state.missing_since if state.missing_since is not None else t
        periods = int((t - missing_since) // spec.control_period_seconds) + 1
        # Never scale down on missing data: the current replicas, not the counterfactual's.
        desired = clamp(max(current, lo), lo, hi)
        limits.append("missing-data")
        if desired < current:
            limits.append("max-replicas")
        if periods <= spec.missing_data_periods:
            strategy = "hold"
            reasons.append(
                f"holding {desired} replicas: no valid demand for {periods} control period(s) "
                f"({demand_problem}); never scaling down on missing data, no new prewarming; "
                f"reactive fallback after {spec.missing_data_periods} periods")
            if spec.prewarm.enabled and placeholders_now >= gpr:
                kept = budget_policy.most_within(
                    0, placeholders_now // gpr, lambda k: speculative(desired, k * gpr) <= allow.gpus)
                placeholders = kept * gpr
                if placeholders:
                    reasons.append(f"keeping {placeholders} placeholder GPUs already present "
                                   f"({speculative(desired, placeholders)} speculative GPUs on whole nodes)")
        else:
            strategy = "reactive"
            reasons.append(
                f"reactive fallback: no valid demand for {periods} control periods ({demand_problem}); "
                f"keeping {desired} replicas (missing metrics never scale down) and removing placeholders")
    else:
        missing_since = None
        drift_state, _ = drift_policy.observe(
            drift_state, spec.drift, value, t, view.step_seconds if view else None, slack=0.1 * cap,
            observed_at=observed_at)
        limits.extend(reactive.limits)
        if model_problem is not None:
            strategy = "reactive"
            reasons.append(f"reactive: {model_problem}; scaling like the HPA until a valid model is served")
        elif drift_state.drifting:
            strategy = "reactive"
            why = drift_state.reason or f"forecast drift ({drift_state.direction})"
            good = "" if drift_state.good_since is None else \
                f"; good again for {int(t - drift_state.good_since)} s"
            reasons.append(f"reactive: {why}; back to predictive after the forecast has been good for "
                           f"{spec.drift.recovery_seconds} s{good}")
        else:
            strategy = "predictive"
        reasons.extend(reactive.reasons)
        desired = cf
        if strategy == "reactive" and spec.prewarm.fill_nodes:
            desired = _fill(cf, cf, hi, gpr, gpn, allow.gpus, speculative, reasons)
        if strategy == "predictive":
            assert view is not None
            if drift_state.note and drift_state.note_at == t:
                reasons.append(drift_state.note)
            lead_pod = spec.lead_times.pod_start_seconds
            lead_node = spec.lead_times.node_start_seconds
            ahead = spec.prewarm.replicas_ahead
            # Replicas ahead: sized for the highest quantile over the node lead time, so whole nodes
            # arrive before the peak and leave as soon as the forecast over that window allows.
            if ahead:
                lead_pod = lead_node
            q_pod, _ = view.max_over(t, t + lead_pod)
            q_node, node_covered = view.max_over(t, t + lead_node)
            # The forecast is of step means; per-minute peaks inside a step run above them.
            peak = spec.demand.intra_step_peak_factor
            size_pod, size_node = q_pod * peak, q_node * peak
            predicted = clamp(replicas_for(size_pod, cap), lo, hi)
            raw_pred = replicas_for(size_pod, cap)
            p = f"P{spec.quantile * 100:g}"
            peak_text = "" if peak == 1 else (
                f", × {peak:g} for the peaks inside a {view.step_seconds // 60:g}-minute step "
                f"(demand.intraStepPeakFactor) = {size_pod:.4g} {unit}")
            reasons.append(f"predictive: {p} demand over the next {lead_pod} s is {q_pod:.4g} {unit}{peak_text}; "
                           f"at {cap:g} {unit} per replica that needs {raw_pred} replicas")
            if raw_pred > hi:
                limits.append("max-replicas")
                reasons.append(f"clamped to maxReplicas {hi} (forecast asks for {raw_pred})")
            # The floor: the reactive counterfactual — or, with replicas ahead (the forecast is the
            # stabilisation), the replicas the demand observed now needs.
            floor = clamp(replicas_for(value, cap), lo, hi) if ahead else cf
            if ahead and size_pod < value * CAUGHT_UP_RATIO:
                # A forecast far below the demand observed now has not caught up with a level shift:
                # it is no ground for releasing below the HPA's floor (its scale-down window).
                floor = cf
            want = max(predicted, floor)
            if ahead and want < current:
                # A confident release: fewer replicas than now only when the forecast's upper band
                # (planned-on quantile + RELEASE_SPREAD × its spread above the P50) fits them, so a
                # forecast hovering at a node boundary does not release a node it soon needs again
                # (once that node is consolidated away, getting it back costs a cold start).
                band = (q_pod + RELEASE_SPREAD * view.spread_over(t, t + lead_pod)) * peak
                held = min(current, max(want, clamp(replicas_for(band, cap), lo, hi)))
                if held > want:
                    reasons.append(f"releasing only to {held} replicas, not {want}: the forecast's upper band "
                                   f"({band:.4g} {unit}) does not fit fewer")
                want = held
            desired = budget_policy.most_within(min(want, cf), want, lambda d: speculative(d, 0) <= allow.gpus)
            if want > cf:
                cost = allow.cost(speculative(desired, 0))
                reasons.append(
                    f"{desired - cf} replicas above the reactive need of {cf} are speculative "
                    f"({speculative(desired, 0)} GPUs on whole nodes{_cost_text(cost, currency)})")
                if desired < want:
                    limits.append("budget")
                    reasons.append(_budget_text(allow, speculative(want, 0), "replicas"))
            elif ahead and want < cf:
                reasons.append(f"the forecast over the next {lead_pod} s and the demand now need {want} replicas, "
                               f"fewer than the reactive rule's {cf} (its scale-down window): releasing to {want}")
            elif predicted < cf:
                reasons.append(f"the forecast needs {predicted} replicas, fewer than the reactive "
                               f"{cf}; keeping the reactive floor")
            if spec.prewarm.fill_nodes:
                desired = _fill(desired, cf, hi, gpr, gpn, allow.gpus, speculative, reasons)
            if spec.prewarm.enabled:
                placeholders, ph_reasons, ph_limited = _placeholders(
                    size_node, cap, unit, hi, desired, current, free, gpr, gpn, lead_node, node_covered,
                    allow, currency, p if peak == 1 else f"{p} × intra-step peak factor {peak:g}", speculative)
                reasons.extend(ph_reasons)
                if ph_limited and "budget" not in limits:
                    limits.append("budget")
    spec_gpus = speculative(desired, placeholders)
    scheduled = event_policy.apply(spec, t, desired=desired, speculative_gpus=spec_gpus, reactive=cf,
                                   strategy=strategy, forecast=q_pod, demand=value)
    desired, spec_gpus, limits, reasons = scheduled.desired, scheduled.speculative_gpus, \
        limits + list(scheduled.limits), reasons + list(scheduled.reasons)
    if allow.problem is not None and strategy == "predictive":
        limits.append("budget-invalid" if "invalid" in allow.problem else "budget-empty")
        reasons.append(allow.problem)
    cost = allow.cost(spec_gpus)

    changed = strategy != state.strategy
    new_state = PlannerState(
        strategy=strategy,
        strategy_since=t if changed else state.strategy_since,
        recommendations=reactive.recommendations,
        scale_events=events,
        missing_since=missing_since,
        counterfactual=cf if value is not None else stored,
        counterfactual_prior=stored,
        drift=drift_state,
        last_decided_at=t,
    )
    decision = Decision(
        desired_replicas=desired,
        placeholder_gpus=placeholders,
        strategy=strategy,
        speculative_gpus=spec_gpus,
        speculative_cost_per_hour=cost,
        limits=tuple(dict.fromkeys(limits)),
        reasons=tuple(reasons),
        currency=currency,
        reactive_replicas=cf,
        predicted_replicas=predicted,
        demand=value,
        forecast_pod_lead=q_pod,
        forecast_node_lead=q_node,
        drift=drift_state.direction if drift_state.drifting else None,
        metrics_problem=demand_problem,
        model_problem=model_problem,
        budget_problem=allow.problem,
        strategy_changed=changed and state.strategy != "",
        scheduled_events=scheduled.names,
    )
    return decision, new_state


def _placeholders(
    q_node: float, cap: float, unit: str, hi: int, desired: int, current: int, free: int,
    gpr: int, gpn: int, lead_node: int, covered: bool,
    allow: budget_policy.Allowance, currency: str, p: str, speculative: Callable[[int, int], int],
) -> tuple[int, list[str], bool]:
    """Placeholder GPUs for the demand one node lead time ahead; (gpus, reasons, budget-limited).

    Placeholders hold GPUs for every replica the node lead time needs beyond ``desired`` — on free
    GPUs of existing nodes first (the simulator and the scheduler put them there), the rest on new
    nodes — as many as the budget allows above the counterfactual, whole nodes counted.
    """
    reasons: list[str] = []
    need = min(replicas_for(q_node, cap), hi)
    extra = max(0, need - desired)
    horizon = "" if covered else " (the forecast horizon ends before the node lead time)"
    if extra == 0:
        reasons.append(f"prewarm: {p} demand over the next {lead_node} s is {q_node:.4g} {unit}{horizon}, "
                       f"needing {need} replicas; the {desired} existing or starting replicas cover it, "
                       "no placeholders")
        return 0, reasons, False
    new_replica_gpus = max(0, desired - current) * gpr
    free_after = max(0, free - new_replica_gpus)
    fit_free = min(extra, free_after // gpr)
    reasons.append(
        f"prewarm: {p} demand over the next {lead_node} s is {q_node:.4g} {unit}{horizon}, needing {need} "
        f"replicas, {extra} more than the {desired} existing or starting; {fit_free} fit on free GPUs of "
        f"existing nodes, {extra - fit_free} need new nodes")
    allowed = budget_policy.most_within(0, extra, lambda k: speculative(desired, k * gpr) <= allow.gpus)
    gpus = allowed * gpr
    if gpus:
        total = speculative(desired, gpus)
        reasons.append(
            f"{gpus} placeholder GPUs keep capacity warm on nodes of {gpn} GPUs "
            f"({total} speculative GPUs in all{_cost_text(allow.cost(total), currency)})")
    limited = allowed < extra
    if limited:
        reasons.append(_budget_text(allow, speculative(desired, extra * gpr), "prewarmed nodes"))
    return gpus, reasons, limited


def _fill(desired: int, cf: int, hi: int, gpr: int, gpn: int, allowed: int,
          speculative: Callable[[int, int], int], reasons: list[str]) -> int:
    """``desired`` raised to fill every GPU of the whole nodes it takes (prewarm.fillNodes), within budget."""
    per_node = max(1, gpn // gpr)
    full = min(hi, -(-desired // per_node) * per_node)
    filled = budget_policy.most_within(desired, full, lambda d: speculative(d, 0) <= allowed)
    if filled > desired:
        reasons.append(f"fill nodes: {filled} replicas use every GPU of the {-(-filled // per_node)} node(s) "
                       f"{desired} replicas take (a billed GPU costs the same idle or serving)")
    return filled


def _cost_text(cost: float | None, currency: str) -> str:
    return "" if cost is None else f", {cost:.2f} {currency}/h"


def _budget_text(allow: budget_policy.Allowance, wanted_gpus: int, what: str, remaining: int | None = None) -> str:
    if allow.problem is not None:
        return f"no speculative {what}: {allow.problem}"
    left = "" if remaining is None else f", {max(0, remaining)} GPUs of it left after the speculative replicas"
    return (f"prewarm budget limits the speculative {what}: they would take {wanted_gpus} GPUs, the budget "
            f"allows {allow.gpus} ({allow.summary}){left}")
