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

Reasons and limits are typed (:mod:`predictive_scaler.policy.reasons`); docs/planner.md lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import numpy as np

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy import budget as budget_policy
from predictive_scaler.policy import drift as drift_policy
from predictive_scaler.policy import events as event_policy
from predictive_scaler.policy import reactive as reactive_policy
from predictive_scaler.policy import reasons as why
from predictive_scaler.policy import service as service_policy
from predictive_scaler.policy.capacity import (
    REPLICA_CAP,
    ForecastView,
    clamp,
    replicas_for,
    view_forecast,
)
from predictive_scaler.policy.reasons import Limit, Reason
from predictive_scaler.policy.state import DriftState, PlannerState
from predictive_scaler.spec import ScalerSpec

__all__ = ["ClusterState", "Decision", "plan"]


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
    #: Of ``placeholder_gpus``, those whose pods are bound to an existing node (not pending).
    placeholder_bound_gpus: int = 0


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    placeholder_gpus: int
    strategy: str  # "predictive" | "reactive" | "hold"
    speculative_gpus: int
    speculative_cost_per_hour: float | None
    limits: tuple[Limit, ...]
    reasons: tuple[Reason, ...]
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
    #: What ``budget_problem`` is: Limit.BUDGET_INVALID or Limit.BUDGET_EMPTY.
    budget_problem_limit: Limit | None = None
    strategy_changed: bool = field(default=False)
    #: Names of the scheduled events (spec.events) in force.
    scheduled_events: tuple[str, ...] = ()

    @property
    def sentences(self) -> tuple[str, ...]:
        """The reasons as the sentences users read (status, JSON, Events)."""
        return tuple(r.text() for r in self.reasons)

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
            "limits": [str(x) for x in self.limits],
            "reasons": list(self.sentences),
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


@dataclass(frozen=True)
class _Observed:
    """Step 1's output: the inputs as the planner trusts them."""

    t: float
    current: int
    ready: int
    placeholders: int
    free: int
    #: Valid demand now (None: missing data, ``demand_problem`` says why) and when it was observed.
    value: float | None
    demand_problem: str | None
    observed_at: float | None
    view: ForecastView | None
    model_problem: str | None
    #: GPUs this scaler's placeholders hold on existing nodes (bound pods; at most ``placeholders``).
    bound: int = 0


@dataclass(frozen=True)
class _Counterfactual:
    """Step 2's output: the HPA rule stepped on its own replica count (the floor and the budget's base)."""

    reactive: reactive_policy.ReactiveResult
    #: Its replicas now, and what was stored before this decision (a retried decision restarts from it).
    replicas: int
    stored: int | None
    scale_events: tuple[tuple[float, int], ...]


@dataclass
class _Draft:
    """The decision being built: what each later step reads and adds to."""

    spec: ScalerSpec
    allow: budget_policy.Allowance
    cf: int
    desired: int = 0
    placeholders: int = 0
    strategy: str = "predictive"
    predicted: int | None = None
    q_pod: float | None = None
    q_node: float | None = None
    limits: list[Limit] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)

    def speculative(self, replicas: int, gpus_held: int) -> int:
        """Speculative GPUs of ``replicas`` and ``gpus_held`` placeholder GPUs above the counterfactual."""
        return budget_policy.speculative_gpus(replicas, gpus_held, self.cf, self.spec.gpus_per_replica,
                                              self.spec.prewarm.gpus_per_node)

    def fits(self, replicas: int, gpus_held: int = 0) -> bool:
        return self.speculative(replicas, gpus_held) <= self.allow.gpus

    def limit(self, limit: Limit) -> None:
        if limit not in self.limits:
            self.limits.append(limit)


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
    cluster_share: budget_policy.ClusterShare | None = None,
) -> tuple[Decision, PlannerState]:
    """Decide replicas and placeholders for ``now``. Pure; same inputs → same outputs.

    ``forecast_problem``/``metrics_problem`` let the caller say why a forecast or a
    demand sample is missing (the ModelError/SourceError message) for the reasons.
    ``cluster_share`` is what the cluster-wide budget leaves this scaler (it only lowers the
    prewarm budget's ``maxGpus``; None: no cluster cap).

    The steps, in order: observe the inputs → the reactive counterfactual → the strategy
    (hold / reactive / predictive, drift) → the predictive want within the budget → fill
    nodes → placeholders → the scheduled events → the decision and the new state.
    """
    seen = _observe(spec, forecast, demand, cluster, now, forecast_problem, metrics_problem)
    drift_state = state.drift
    if seen.view is not None:
        drift_state = drift_policy.refresh_pending(drift_state, seen.view, seen.t, seen.observed_at)
    cf = _counterfactual(spec, state, seen)
    recent = _recent_demand(spec, state, seen)
    onset = _onset(spec, state.onset_at, seen)
    hold_until = None if onset is None else onset + spec.drift.signal_lag_seconds
    draft = _Draft(spec, budget_policy.allowance(spec.prewarm.budget, cluster_share), cf.replicas)
    if seen.value is None:
        missing_since = state.missing_since if state.missing_since is not None else seen.t
        _missing_data(draft, seen, missing_since)
    else:
        missing_since = None
        drift_state, _ = drift_policy.observe(
            drift_state, spec.drift, seen.value, seen.t, seen.view.step_seconds if seen.view else None,
            slack=0.1 * spec.capacity_per_replica, observed_at=seen.observed_at, hold_until=hold_until)
        _choose_strategy(draft, seen, cf, drift_state)
        if draft.strategy == "reactive" and spec.prewarm.fill_nodes:
            draft.desired = _fill(draft, draft.desired)
        if draft.strategy == "predictive":
            held = hold_until is not None and _seen_at(seen) < hold_until
            _predictive(draft, seen, drift_state, recent, held=held, headroom_log=state.headroom_log)
    return _decide(draft, seen, cf, state, drift_state, missing_since, recent, onset)


def _observe(spec: ScalerSpec, forecast: Forecast | None, demand: DemandSample | None, cluster: ClusterState,
             now: datetime, forecast_problem: str | None, metrics_problem: str | None) -> _Observed:
    """Step 1: counts made sane, demand validated (fresh, finite, ≥ 0), the forecast seen from ``now``."""
    t = now.timestamp()
    value, demand_problem = _demand_value(demand, t, spec.demand.max_age_seconds)
    observed_at = demand.observed_at.timestamp() if value is not None and demand and demand.observed_at else None
    if value is None and metrics_problem:
        demand_problem = f"{metrics_problem}; {demand_problem}" if demand is not None else metrics_problem
    view, view_problem = view_forecast(forecast, spec.quantile, t)
    model_problem = None
    if view is None:
        model_problem = forecast_problem or view_problem
    return _Observed(t, _count(cluster.desired_replicas), _count(cluster.ready_replicas),
                     _count(cluster.placeholder_gpus), _count(cluster.free_gpus), value, demand_problem,
                     observed_at, view, model_problem,
                     min(_count(cluster.placeholder_bound_gpus), _count(cluster.placeholder_gpus)))


def _counterfactual(spec: ScalerSpec, state: PlannerState, seen: _Observed) -> _Counterfactual:
    """Step 2: the HPA rule stepped on its own replica count, never on the replicas the forecast raised.

    (Else HPA tolerance and the scale-down window fold speculation into the floor.) It counts all its
    replicas ready (it has no pods to observe); the first decision, before any speculation, starts it
    from the workload as the HPA would: its replicas and their readiness.
    """
    t = seen.t
    retried = state.last_decided_at == t
    stored = state.counterfactual_prior if retried else state.counterfactual
    if stored is not None:
        cf_before = cf_ready = stored
    else:
        cf_before, cf_ready = seen.current, seen.ready
    events = reactive_policy.prune_events(state.scale_events, spec.reactive, t)
    reactive = reactive_policy.recommend(
        spec.reactive, demand=seen.value, capacity=spec.capacity_per_replica * spec.reactive.target_utilization,
        current=cf_before, ready=cf_ready, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
        recommendations=state.recommendations, scale_events=events, now=t, unit=spec.demand_unit,
    )
    cf = reactive.desired
    if cf != cf_before:
        events = tuple(e for e in events if e[0] != t) + ((t, cf - cf_before),)
    return _Counterfactual(reactive, cf, stored, events)


def _recent_demand(spec: ScalerSpec, state: PlannerState, seen: _Observed) -> tuple[tuple[float, float], ...]:
    """The valid demand observed within the release window (``reactive.scaleDownStabilizationSeconds``),
    this decision's included; a retried decision replaces its own earlier entry (deciding twice = once)."""
    window = spec.reactive.scale_down_stabilization_seconds
    kept = tuple((at, v) for at, v in state.recent_demand if seen.t - window <= at < seen.t)
    return kept if seen.value is None else (*kept, (seen.t, seen.value))


def _replicas_per_node(spec: ScalerSpec) -> int:
    """Replicas one node holds (``prewarm.gpusPerNode`` GPUs, at least one replica)."""
    return max(1, spec.prewarm.gpus_per_node // spec.gpus_per_replica)


def _nodes(spec: ScalerSpec, replicas: int) -> int:
    """Whole nodes ``replicas`` take."""
    return -(-replicas // _replicas_per_node(spec))


def _seen_at(seen: _Observed) -> float:
    """The time the demand observed now is of (its source's stamp, else now)."""
    return seen.observed_at if seen.observed_at is not None else seen.t


def _onset(spec: ScalerSpec, stored: float | None, seen: _Observed) -> float | None:
    """The onset of the predicted rise the plan places capacity for: the start of the first model step,
    from the one the demand observed now is of to one node lead time ahead, whose P50 exceeds that
    demand by at least one replica's capacity, after a step that does not. ``stored`` is the onset
    remembered from before: while the rise goes on (the step observed is already above the level) it
    stays the onset, so the steps of one rise — or of a rise that never came — do not hold it again
    and again; a rise first seen once under way was placed for by nobody ahead and has none. None: no
    rise ahead.
    """
    view, level = seen.view, seen.value
    if view is None or level is None or view.p50 is None or len(view.p50) != len(view.pq):
        return stored  # nothing to judge by: keep what was known
    h0 = max(0, view.index_at(_seen_at(seen)))
    horizon = seen.t + spec.lead_times.node_start_seconds
    rise = level + spec.capacity_per_replica
    for h in range(h0, len(view.p50)):
        if h > h0 and view.step_start(h) > horizon:
            break
        if math.isfinite(float(view.p50[h])) and float(view.p50[h]) >= rise:
            start = view.step_start(h)
            return start if h > h0 else stored
    return None


def _anchor(view: ForecastView, value: float, at: float, recent: tuple[tuple[float, float], ...],
            since: float, lag: float = 0.0) -> tuple[float, float] | None:
    """(P50, demand) when the demand observed now lies below the forecast's P50 for the time it is of,
    and every demand observed since ``since`` (the release window, which ``recent`` must span) did too.

    A value stamped ``at`` is a mean over the ``lag`` before it (a ``rate()`` window): it is of every
    step that window overlaps, so it is compared with the lowest of their P50s — a rising forecast is
    not "above the level" merely because the window still reads the steps before the rise."""
    if view.p50 is None or len(view.p50) != len(view.pq) or not recent or recent[0][0] > since:
        return None
    h = max(0, view.index_at(at))
    if h >= len(view.p50):
        return None
    median = float(np.min(view.p50[max(0, min(h, view.index_at(at - lag))):h + 1]))
    below = math.isfinite(median) and max(v for _, v in recent) < median
    return (median, value) if below else None


def _missing_data(draft: _Draft, seen: _Observed, missing_since: float) -> None:
    """Step 3 without demand: hold (keep replicas and, within the budget, placeholders), later reactive."""
    spec = draft.spec
    lo, hi, gpr = spec.min_replicas, spec.max_replicas, spec.gpus_per_replica
    periods = int((seen.t - missing_since) // spec.control_period_seconds) + 1
    # Never scale down on missing data: the current replicas, not the counterfactual's.
    desired = draft.desired = clamp(max(seen.current, lo), lo, hi)
    draft.limits.append(Limit.MISSING_DATA)
    if desired < seen.current:
        draft.limits.append(Limit.MAX_REPLICAS)
    if periods <= spec.missing_data_periods:
        draft.strategy = "hold"
        draft.reasons.append(why.Holding(desired, periods, seen.demand_problem, spec.missing_data_periods))
        if spec.prewarm.enabled and seen.placeholders >= gpr:
            kept = budget_policy.most_within(0, seen.placeholders // gpr, lambda k: draft.fits(desired, k * gpr))
            draft.placeholders = kept * gpr
            if draft.placeholders:
                draft.reasons.append(why.KeepingPlaceholders(draft.placeholders,
                                                             draft.speculative(desired, draft.placeholders)))
    else:
        draft.strategy = "reactive"
        draft.reasons.append(why.MissingDataFallback(periods, seen.demand_problem, desired))
    if desired < seen.current:
        draft.reasons.append(why.Clamped("max", desired, seen.current, "hold"))


def _choose_strategy(draft: _Draft, seen: _Observed, cf: _Counterfactual, drift: DriftState) -> None:
    """Step 3 with demand: reactive on a missing/invalid model or drift, else predictive; the HPA floor."""
    spec = draft.spec
    draft.limits.extend(cf.reactive.limits)
    if seen.model_problem is not None:
        draft.strategy = "reactive"
        draft.reasons.append(why.ModelFallback(seen.model_problem))
    elif drift.drifting:
        draft.strategy = "reactive"
        draft.reasons.append(why.DriftFallback(
            drift.reason or f"forecast drift ({drift.direction})", spec.drift.recovery_seconds,
            None if drift.good_since is None else int(seen.t - drift.good_since)))
    else:
        draft.strategy = "predictive"
    draft.reasons.extend(cf.reactive.reasons)
    draft.desired = cf.replicas


def _predictive(draft: _Draft, seen: _Observed, drift: DriftState, recent: tuple[tuple[float, float], ...],
                *, held: bool = False, headroom_log: float = 0.0) -> None:
    """Steps 4–6 of the predictive strategy: the forecast's want within the budget, fill, placeholders.

    ``recent`` is the demand observed within the release window (now included). ``held``: a predicted
    rise's onset is not yet fully in the observed signal (:func:`_onset`), so the level observed is no
    ground for lowering the forecast — the signal lags the rise by its ``rate()`` window.
    """
    spec, t, cf, hi = draft.spec, seen.t, draft.cf, draft.spec.max_replicas
    view, value = seen.view, seen.value
    assert view is not None and value is not None
    if drift.note and drift.note_at == t:
        draft.reasons.append(why.DriftNote(drift.note))
    lead_pod = spec.lead_times.pod_start_seconds
    lead_node = spec.lead_times.node_start_seconds
    ahead = spec.prewarm.replicas_ahead
    # Replicas ahead: sized for the highest quantile over the node lead time, so whole nodes
    # arrive before the peak and leave as soon as the forecast over that window allows.
    if ahead:
        lead_pod = lead_node
    q_pod, _ = view.max_over(t, t + lead_pod)
    q_node, node_covered = view.max_over(t, t + lead_node)
    draft.q_pod, draft.q_node = q_pod, q_node
    # The forecast is of step means; per-minute peaks inside a step run above them.
    # The service tracker's headroom (spec.service) rides on the peak factor: the same plan, widened.
    headroom = math.exp(headroom_log)
    peak = spec.demand.intra_step_peak_factor * headroom
    cap = spec.capacity_per_replica
    size_pod, size_node = q_pod * peak, q_node * peak
    window = spec.reactive.scale_down_stabilization_seconds
    recent_peak = max(v for _, v in recent)
    anchor = None if held else _anchor(view, value, _seen_at(seen), recent, t - window + spec.control_period_seconds,
                                       spec.drift.signal_lag_seconds)
    if anchor is not None:
        # The model has run above the level observed for a whole release window (it lags a fall): its forecast is lowered by
        # that gap, so it buys no node for demand the present level does not support. (Never below
        # the floor below; an observation above the P50 raises nothing here — the floor does.)
        gap = (anchor[0] - anchor[1]) * peak
        size_pod, size_node = max(0.0, size_pod - gap), max(0.0, size_node - gap)
        draft.reasons.append(why.ForecastAnchored(anchor[0], anchor[1], size_pod, spec.demand_unit))
    raw_pred = replicas_for(size_pod, cap)
    predicted = draft.predicted = clamp(raw_pred, spec.min_replicas, hi)
    draft.reasons.append(why.PredictiveNeed(spec.quantile, lead_pod, q_pod, spec.demand_unit,
                                            spec.demand.intra_step_peak_factor, view.step_seconds, size_pod, cap,
                                            raw_pred, headroom))
    if raw_pred > hi:
        draft.limits.append(Limit.MAX_REPLICAS)
        draft.reasons.append(why.Clamped("max", hi, raw_pred, "forecast"))
    # The floor: the reactive counterfactual — or, with replicas ahead (the forecast is the
    # stabilisation), the replicas the demand observed now needs.
    floor = clamp(replicas_for(value, cap), spec.min_replicas, hi) if ahead else cf
    if ahead and size_pod < value * CAUGHT_UP_RATIO:
        # A forecast far below the demand observed now has not caught up with a level shift:
        # it is no ground for releasing below the HPA's floor (its scale-down window).
        floor = cf
    want = max(predicted, floor)
    if ahead and want < seen.current:
        want = _confident_release(draft, seen, want, q_pod=q_pod, lead_pod=lead_pod, peak=peak,
                                  recent_peak=recent_peak)
    draft.desired = _within_budget(draft, want)
    if want < cf and ahead:
        draft.reasons.append(why.ReleasingAhead(lead_pod, want, cf))
    elif want <= cf and predicted < cf:
        draft.reasons.append(why.ReactiveFloor(predicted, cf))
    if spec.prewarm.fill_nodes:
        draft.desired = _fill(draft, draft.desired)
    if spec.prewarm.enabled:
        _placeholders(draft, size_node, seen.current, seen.free, lead_node, node_covered, peak, seen.bound)


def _confident_release(draft: _Draft, seen: _Observed, want: int, *, q_pod: float, lead_pod: float, peak: float,
                       recent_peak: float) -> int:
    """A confident release: fewer replicas than now (``want``) only when the forecast's upper band
    (planned-on quantile + RELEASE_SPREAD × its spread above the P50) fits them, so a forecast
    hovering at a node boundary does not release a node it soon needs again (once that node is
    consolidated away, getting it back costs a cold start). Returns the replicas held."""
    spec, t, cap, hi = draft.spec, seen.t, draft.spec.capacity_per_replica, draft.spec.max_replicas
    view = seen.view
    assert view is not None
    band = (q_pod + RELEASE_SPREAD * view.spread_over(t, t + lead_pod)) * peak
    held = min(seen.current, max(want, clamp(replicas_for(band, cap), spec.min_replicas, hi)))
    if held > want:
        draft.reasons.append(why.ReleaseHeld(held, want, band, spec.demand_unit))
    # Node-boundary hysteresis: demand observed within the release window that needed exactly one
    # node more than the release keeps that node (a node released for a fraction of a replica comes
    # back only after a cold start). A fall by more than a node is a level change: not held.
    recent_need = min(seen.current, clamp(replicas_for(recent_peak, cap), spec.min_replicas, hi))
    if recent_need > held and _nodes(spec, recent_need) == _nodes(spec, want) + 1:
        window = spec.reactive.scale_down_stabilization_seconds
        draft.reasons.append(why.ReleaseHeldRecent(recent_need, want, recent_peak, window, spec.demand_unit))
        held = recent_need
    return held


def _within_budget(draft: _Draft, want: int) -> int:
    """Step 4: the most replicas up to ``want`` whose speculation the budget allows (never below the floor)."""
    cf = draft.cf
    desired = budget_policy.most_within(min(want, cf), want, lambda d: draft.fits(d))
    if want > cf:
        gpus = draft.speculative(desired, 0)
        draft.reasons.append(why.SpeculativeReplicas(desired - cf, cf, gpus, draft.allow.cost(gpus),
                                                     draft.allow.currency))
        if desired < want:
            draft.limits.append(Limit.BUDGET)
            draft.reasons.append(_budget_limited(draft.allow, draft.speculative(want, 0), "replicas"))
    return desired


def _fill(draft: _Draft, desired: int) -> int:
    """Step 5: ``desired`` raised to fill every GPU of the whole nodes it takes (prewarm.fillNodes), within budget."""
    full = min(draft.spec.max_replicas, _nodes(draft.spec, desired) * _replicas_per_node(draft.spec))
    filled = budget_policy.most_within(desired, full, lambda d: draft.fits(d))
    if filled > desired:
        draft.reasons.append(why.FillNodes(filled, _nodes(draft.spec, filled), desired))
    return filled


def _placeholders(draft: _Draft, q_node: float, current: int, free: int, lead_node: int, covered: bool,
                  peak: float, bound: int = 0) -> None:
    """Step 6: placeholder GPUs for the demand one node lead time ahead (``bound``: GPUs this scaler's
    placeholders already hold on existing nodes).

    Placeholders hold GPUs for every replica the node lead time needs beyond ``desired`` — on free
    GPUs of existing nodes first (the simulator and the scheduler put them there), the rest on new
    nodes — as many as the budget allows above the counterfactual, whole nodes counted.
    """
    spec, desired, allow = draft.spec, draft.desired, draft.allow
    gpr, unit = spec.gpus_per_replica, spec.demand_unit
    need = min(replicas_for(q_node, spec.capacity_per_replica), spec.max_replicas)
    extra = max(0, need - desired)
    if extra == 0:
        draft.reasons.append(why.Prewarm(spec.quantile, peak, lead_node, q_node, unit, covered, need, desired, 0, 0))
        return
    new_replica_gpus = max(0, desired - current) * gpr
    free_after = max(0, free - new_replica_gpus)
    # New replicas the free GPUs cannot take preempt the bound placeholders (they yield to any pod).
    bound_after = max(0, bound - max(0, new_replica_gpus - free))
    on_bound = min(extra, bound_after // gpr)
    fit_free = min(extra - on_bound, free_after // gpr)
    draft.reasons.append(why.Prewarm(spec.quantile, peak, lead_node, q_node, unit, covered, need, desired, extra,
                                     fit_free, on_bound))
    allowed = budget_policy.most_within(0, extra, lambda k: draft.fits(desired, k * gpr))
    gpus = draft.placeholders = allowed * gpr
    if gpus:
        total = draft.speculative(desired, gpus)
        draft.reasons.append(why.Placeholders(gpus, spec.prewarm.gpus_per_node, total, allow.cost(total),
                                              allow.currency))
    if allowed < extra:
        draft.reasons.append(_budget_limited(allow, draft.speculative(desired, extra * gpr), "prewarmed nodes"))
        draft.limit(Limit.BUDGET)


def _decide(draft: _Draft, seen: _Observed, cf: _Counterfactual, state: PlannerState, drift: DriftState,
            missing_since: float | None, recent: tuple[tuple[float, float], ...],
            onset: float | None = None) -> tuple[Decision, PlannerState]:
    """Step 7: the scheduled events raise the plan; the budget's problem is reported; decision and state."""
    spec, allow, t = draft.spec, draft.allow, seen.t
    spec_gpus = draft.speculative(draft.desired, draft.placeholders)
    scheduled = event_policy.apply(spec, t, desired=draft.desired, speculative_gpus=spec_gpus, reactive=draft.cf,
                                   strategy=draft.strategy, forecast=draft.q_pod, demand=seen.value)
    limits = draft.limits + list(scheduled.limits)
    reasons = draft.reasons + list(scheduled.reasons)
    if allow.problem is not None and allow.problem_limit is not None and draft.strategy == "predictive":
        limits.append(allow.problem_limit)
        reasons.append(why.BudgetProblem(allow.problem_limit, allow.problem))
    changed = draft.strategy != state.strategy
    new_state = PlannerState(
        strategy=draft.strategy,
        strategy_since=t if changed else state.strategy_since,
        recommendations=cf.reactive.recommendations,
        scale_events=cf.scale_events,
        missing_since=missing_since,
        counterfactual=draft.cf if seen.value is not None else cf.stored,
        counterfactual_prior=cf.stored,
        drift=drift,
        last_decided_at=t,
        recent_demand=recent,
        onset_at=onset,
        **_service(spec, state, seen, recent),
    )
    decision = Decision(
        desired_replicas=scheduled.desired,
        placeholder_gpus=draft.placeholders,
        strategy=draft.strategy,
        speculative_gpus=scheduled.speculative_gpus,
        speculative_cost_per_hour=allow.cost(scheduled.speculative_gpus),
        limits=tuple(dict.fromkeys(limits)),
        reasons=tuple(reasons),
        currency=allow.currency,
        reactive_replicas=draft.cf,
        predicted_replicas=draft.predicted,
        demand=seen.value,
        forecast_pod_lead=draft.q_pod,
        forecast_node_lead=draft.q_node,
        drift=drift.direction if drift.drifting else None,
        metrics_problem=seen.demand_problem,
        model_problem=seen.model_problem,
        budget_problem=allow.problem,
        budget_problem_limit=allow.problem_limit,
        strategy_changed=changed and state.strategy != "",
        scheduled_events=scheduled.names,
    )
    return decision, new_state


def _service(spec: ScalerSpec, state: PlannerState, seen: _Observed,
             recent: tuple[tuple[float, float], ...]) -> dict[str, Any]:
    """The service tracker after this decision (:mod:`~predictive_scaler.policy.service`).

    Shortfall is demand above what the *ready* replicas serve — replicas still starting are what
    headroom would have had ready. It is evidence only while more headroom could have served it: not
    at ``maxReplicas``, not while no replica is ready, and not once replicas have stayed unready
    longer than the lead times (a workload whose pods do not become ready — an image that cannot be
    pulled, a crash loop — needs fixing, not more speculative GPUs). Disabled, it keeps nothing.
    """
    if not spec.service.enabled:
        return {}
    if seen.value is None:
        return {"headroom_log": state.headroom_log, "demand_level": state.demand_level,
                "unready_since": state.unready_since}
    unready_since = None if seen.ready >= seen.current else (
        state.unready_since if state.unready_since is not None else seen.t)
    lead = spec.lead_times.node_start_seconds + spec.lead_times.pod_start_seconds
    stuck = unready_since is not None and seen.t - unready_since > lead
    ceiling = spec.max_replicas * spec.capacity_per_replica
    saturated = any(v >= ceiling for _, v in recent)
    evidence = 1 <= seen.ready < spec.max_replicas and not stuck and not saturated
    capacity = seen.ready * spec.capacity_per_replica if evidence else None
    dt = 0.0 if state.last_decided_at is None else seen.t - state.last_decided_at
    h, level = service_policy.update(spec.service, state.headroom_log, state.demand_level, seen.value, capacity, dt)
    return {"headroom_log": h, "demand_level": level, "unready_since": unready_since}


def _budget_limited(allow: budget_policy.Allowance, wanted_gpus: int, what: Literal["replicas", "prewarmed nodes"],
                    ) -> why.BudgetLimited:
    return why.BudgetLimited(what, wanted_gpus, allow.gpus, allow.summary, allow.problem)
