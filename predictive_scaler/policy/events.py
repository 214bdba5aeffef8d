"""Scheduled events (``spec.events``): known windows that raise the plan. Pure.

An event is a window ``[start, end)`` — once, or every 7 days from ``start`` —
with a replica floor (``minReplicas``) or a factor on the planned demand
(``demandMultiplier``). It is in force from :func:`lead_seconds` before each
occurrence starts (the node lead time and one control period, so the capacity is
ready at the start) until the occurrence ends.

The raise is what the user asked for, so the planner does not count it as
speculative capacity and does not charge it to the prewarm budget; it never goes
above ``maxReplicas``. :func:`apply` is the planner's whole use of this module;
:func:`forecaster_options` turns past occurrences into Prophet's training holidays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from predictive_scaler.policy.capacity import replicas_for
from predictive_scaler.policy.reasons import Clamped, EventAsk, EventRaised, Limit, Reason
from predictive_scaler.spec import WEEK, ScalerSpec, ScheduledEvent

__all__ = ["Applied", "EventRaise", "Occurrence", "apply", "forecaster_options", "holiday_windows", "in_force",
           "lead_seconds", "occurrences", "raise_plan"]

_WEEK_S = WEEK.total_seconds()


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of an event: ``[start, end)`` in epoch seconds."""

    event: ScheduledEvent
    start: float
    end: float


def _occurrence_containing(ev: ScheduledEvent, t: float, lead: float) -> Occurrence | None:
    start, end = ev.start_time.timestamp(), ev.end_time.timestamp()
    k = 0
    if ev.recurrence == "weekly":
        # The occurrence whose start - lead is the last one at or before t.
        k = max(0, math.floor((t + lead - start) / _WEEK_S))
    s, e = start + k * _WEEK_S, end + k * _WEEK_S
    return Occurrence(ev, s, e) if s - lead <= t < e else None


def in_force(events: Sequence[ScheduledEvent], t: float, lead: float) -> tuple[Occurrence, ...]:
    """The occurrences in force at ``t`` (epoch seconds): ``start - lead <= t < end``."""
    found = (_occurrence_containing(ev, t, lead) for ev in events)
    return tuple(o for o in found if o is not None)


def occurrences(events: Sequence[ScheduledEvent], start: float, end: float) -> tuple[Occurrence, ...]:
    """Every occurrence overlapping ``[start, end)`` (epoch seconds), in time order."""
    out: list[Occurrence] = []
    for ev in events:
        s0, e0 = ev.start_time.timestamp(), ev.end_time.timestamp()
        if ev.recurrence != "weekly":
            if s0 < end and e0 > start:
                out.append(Occurrence(ev, s0, e0))
            continue
        k = max(0, math.floor((start - e0) / _WEEK_S))
        while s0 + k * _WEEK_S < end:
            if e0 + k * _WEEK_S > start:
                out.append(Occurrence(ev, s0 + k * _WEEK_S, e0 + k * _WEEK_S))
            k += 1
    return tuple(sorted(out, key=lambda o: (o.start, o.event.name)))


@dataclass(frozen=True)
class EventRaise:
    """What the events in force ask for at one instant."""

    occurrences: tuple[Occurrence, ...]
    #: Replicas they ask for (before maxReplicas), 0 when they ask for none.
    replicas: int
    reasons: tuple[EventAsk, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.event.name for o in self.occurrences)


def raise_plan(events: Sequence[ScheduledEvent], t: float, lead: float, *, planned_demand: float | None,
               capacity: float, unit: str) -> EventRaise | None:
    """The replicas the events in force at ``t`` ask for; None when no event is in force.

    ``planned_demand`` is what the strategy planned on (the P95 over the pod lead
    time when predictive, the demand now when reactive, None when demand is
    missing); a multiplier scales it, a floor stands alone. Several events in
    force: the largest ask wins.
    """
    now_in = in_force(events, t, lead)
    if not now_in:
        return None
    asks: list[EventAsk] = []
    for o in now_in:
        ev = o.event
        starts = t < o.start
        left = int((o.start if starts else o.end) - t)
        if ev.min_replicas is not None:
            asks.append(EventAsk(ev.name, starts, left, min_replicas=ev.min_replicas, replicas=ev.min_replicas))
        elif ev.demand_multiplier is not None and planned_demand is not None and math.isfinite(planned_demand):
            scaled = planned_demand * ev.demand_multiplier
            asks.append(EventAsk(ev.name, starts, left, multiplier=ev.demand_multiplier, demand=scaled, unit=unit,
                                 replicas=replicas_for(scaled, capacity)))
        else:
            asks.append(EventAsk(ev.name, starts, left, multiplier=ev.demand_multiplier))
    return EventRaise(now_in, max(a.replicas for a in asks), tuple(asks))


def lead_seconds(spec: ScalerSpec) -> int:
    """How long before an occurrence the plan is raised: the node lead time, plus one control period so
    the reconcile just before ``start - node lead`` already raises it (decisions are taken once a period)."""
    return spec.lead_times.node_start_seconds + spec.control_period_seconds


@dataclass(frozen=True)
class Applied:
    """A decision's numbers after the events in force raised them."""

    desired: int
    speculative_gpus: int
    reasons: tuple[Reason, ...]
    limits: tuple[Limit, ...]
    names: tuple[str, ...]


def apply(spec: ScalerSpec, t: float, *, desired: int, speculative_gpus: int, reactive: int, strategy: str,
          forecast: float | None, demand: float | None) -> Applied:
    """Raise ``desired`` to what the events in force at ``t`` ask for (at most maxReplicas).

    Replicas the forecast had bought above the reactive need that the event floor now
    covers stop being speculative (the user asked for them), so they leave the budget.
    """
    planned = forecast * spec.demand.intra_step_peak_factor if strategy == "predictive" and forecast is not None \
        else demand
    ask = raise_plan(spec.events, t, lead_seconds(spec), planned_demand=planned,
                     capacity=spec.capacity_per_replica, unit=spec.demand_unit)
    if ask is None:
        return Applied(desired, speculative_gpus, (), (), ())
    reasons: list[Reason] = list(ask.reasons)
    limits = [Limit.EVENT]
    target = min(ask.replicas, spec.max_replicas)
    if ask.replicas > spec.max_replicas:
        limits.append(Limit.MAX_REPLICAS)
        reasons.append(Clamped("max", spec.max_replicas, ask.replicas, "events"))
    reasons.append(EventRaised(desired, max(desired, target), ask.names))
    if strategy == "predictive":
        gpr = spec.gpus_per_replica
        before = max(0, desired - reactive)
        after = max(0, desired - max(reactive, target))
        speculative_gpus = max(0, speculative_gpus - (before - after) * gpr)
    return Applied(max(desired, target), speculative_gpus, tuple(reasons), tuple(limits), ask.names)


def holiday_windows(events: Sequence[ScheduledEvent], start: float, end: float) -> tuple[tuple[str, float, float], ...]:
    """Past occurrences in ``[start, end)`` as ``(name, start, end)``: Prophet's training holidays."""
    return tuple((o.event.name, max(o.start, start), min(o.end, end)) for o in occurrences(events, start, end))


def forecaster_options(events: Sequence[ScheduledEvent], start: float, end: float) -> dict[str, dict[str, object]]:
    """Per-kind forecaster options the events imply for training on ``[start, end)`` (Prophet's holidays)."""
    windows = holiday_windows(events, start, end)
    return {"prophet": {"holidays": windows}} if windows else {}
