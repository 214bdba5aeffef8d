"""Scheduled events in a backtest report: each window, its lead time, and what the predictive policy planned.

The events are the spec's (``spec.events``, or ``events:`` at the top of a
scenario); the planner raised the plan for them inside the reconciler, so this
module only reads the run back: the fewest replicas the predictive policy
decided in any minute from the lead time before the window to its end, against
the floor the event asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from predictive_scaler.policy.events import Occurrence, lead_seconds, occurrences

if TYPE_CHECKING:
    from predictive_scaler.backtest.runner import Result


@dataclass(frozen=True)
class EventWindow:
    occurrence: Occurrence
    #: Epoch second from which the plan is raised (start − node lead time − one control period).
    raised_from: float
    #: Fewest replicas the predictive policy decided in [raised_from, end); None when not run or not covered.
    min_planned: int | None
    #: The floor asked for (minReplicas, at most maxReplicas); None for a demand multiplier.
    floor: int | None

    @property
    def held(self) -> bool | None:
        if self.floor is None or self.min_planned is None:
            return None
        return self.min_planned >= self.floor


def windows(result: Result) -> list[EventWindow]:
    """Every event occurrence overlapping the evaluation, with the predictive policy's lowest plan in it."""
    setup = result.setup
    spec = setup.spec
    if not spec.events:
        return []
    t0 = setup.eval_start.timestamp()
    t1 = t0 + setup.n_ticks * setup.tick_s
    lead = lead_seconds(spec)
    run = result.runs.get("predictive")
    out = []
    for o in occurrences(spec.events, t0, t1 + lead):
        raised = o.start - lead
        lowest = None
        if run is not None:
            first = max(0, int(np.ceil((raised - t0) / setup.tick_s)))
            last = min(len(run.desired), int(np.ceil((o.end - t0) / setup.tick_s)))
            if last > first:
                lowest = int(np.min(run.desired[first:last]))
        floor = None if o.event.min_replicas is None else min(o.event.min_replicas, spec.max_replicas)
        out.append(EventWindow(o, raised, lowest, floor))
    return out


def markdown_section(result: Result) -> list[str]:
    """The report's "Scheduled events" section (no lines when the spec has no events)."""
    found = windows(result)
    if not result.setup.spec.events:
        return []
    lead = lead_seconds(result.setup.spec)
    lines = ["## Scheduled events", "",
             f"Each window is raised from {lead} s (node lead time + one control period) before its start until "
             "its end; the raise "
             "is asked for by the user, so it is not speculative and not charged to the prewarm budget.", ""]
    if not found:
        return lines + ["No event window falls inside the evaluation.", ""]
    lines += ["| event | raised from | window | asks for | fewest planned replicas (predictive) | floor held |",
              "|---|---|---|---|---|---|"]
    for w in found:
        ev = w.occurrence.event
        asks = f"≥ {ev.min_replicas} replicas" if ev.min_replicas is not None else f"demand × {ev.demand_multiplier:g}"
        held = {True: "yes", False: "**no**", None: "—"}[w.held]
        lines.append(f"| {ev.name} | {_iso(w.raised_from)} | {_iso(w.occurrence.start)} → {_iso(w.occurrence.end)} "
                     f"| {asks} | {'—' if w.min_planned is None else w.min_planned} | {held} |")
    return lines + [""]


def mark_axes(ax: Any, result: Result) -> None:
    """Shade each event window (and, lighter, its lead time) on a plot whose x axis is naive UTC time."""
    for w in windows(result):
        ax.axvspan(np.datetime64(int(w.raised_from), "s"), np.datetime64(int(w.occurrence.start), "s"),
                   color="tab:purple", alpha=0.08, lw=0)
        ax.axvspan(np.datetime64(int(w.occurrence.start), "s"), np.datetime64(int(w.occurrence.end), "s"),
                   color="tab:purple", alpha=0.18, lw=0, label=f"event {w.occurrence.event.name}")


def _iso(t: float) -> str:
    return np.datetime_as_string(np.datetime64(int(t), "s"), unit="m") + "Z"
