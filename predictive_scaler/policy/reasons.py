"""Why a decision is what it is, as data: typed limits and reasons, and their sentences. Pure.

The planner, the reactive rule, the budget and the scheduled events record *what*
limited a decision (:class:`Limit`) and *why* it is what it is (one :class:`Reason`
subclass per kind, its numbers as fields), never English. Every human sentence is
written here, in each reason's :meth:`Reason.text`; Events and Conditions are
derived from the kinds in :mod:`predictive_scaler.policy.explain`. Rewording a
sentence therefore changes no Event, no Condition and no classification.

docs/planner.md lists the limits and the reason kinds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Literal

__all__ = [
    "BUDGET_KINDS", "DRIFT_KINDS", "SCALING_KINDS", "SCALING_LIMITS", "BudgetLimited", "BudgetProblem",
    "Clamped", "DriftFallback", "DriftNote", "EventAsk", "EventRaised", "FillNodes", "Holding", "HpaRule",
    "KeepingPlaceholders", "Kind", "Limit", "MissingDataFallback", "MissingDemandKept", "ModelFallback",
    "Placeholders", "PredictiveNeed", "Prewarm", "RateLimited", "ReactiveFloor", "Reason", "ReleasingAhead",
    "SpeculativeReplicas", "Stabilised",
]


class Limit(StrEnum):
    """What limited a decision (``Decision.limits``); the values are what status and JSON show."""

    MIN_REPLICAS = "min-replicas"
    MAX_REPLICAS = "max-replicas"
    SCALE_UP_RATE = "scale-up-rate"
    SCALE_DOWN_RATE = "scale-down-rate"
    SCALE_DOWN_STABILIZATION = "scale-down-stabilization"
    SCALE_UP_STABILIZATION = "scale-up-stabilization"
    BUDGET = "budget"
    BUDGET_EMPTY = "budget-empty"
    BUDGET_INVALID = "budget-invalid"
    MISSING_DATA = "missing-data"
    EVENT = "event"


#: Limits reported by the ScalingLimited Condition and Event.
SCALING_LIMITS = frozenset({Limit.MIN_REPLICAS, Limit.MAX_REPLICAS, Limit.SCALE_UP_RATE, Limit.SCALE_DOWN_RATE,
                            Limit.SCALE_DOWN_STABILIZATION, Limit.SCALE_UP_STABILIZATION})


class Kind(StrEnum):
    """The kind of a :class:`Reason` (one per subclass)."""

    HOLDING = "holding"
    KEEPING_PLACEHOLDERS = "keeping-placeholders"
    MISSING_DATA_FALLBACK = "missing-data-fallback"
    MODEL_FALLBACK = "model-fallback"
    DRIFT_FALLBACK = "drift-fallback"
    DRIFT_NOTE = "drift-note"
    HPA_RULE = "hpa-rule"
    MISSING_DEMAND_KEPT = "missing-demand-kept"
    STABILISED = "stabilised"
    RATE_LIMITED = "rate-limited"
    CLAMPED = "clamped"
    PREDICTIVE_NEED = "predictive-need"
    SPECULATIVE_REPLICAS = "speculative-replicas"
    RELEASING_AHEAD = "releasing-ahead"
    RELEASE_HELD = "release-held"
    RELEASE_HELD_RECENT = "release-held-recent"
    FORECAST_ANCHORED = "forecast-anchored"
    REACTIVE_FLOOR = "reactive-floor"
    FILL_NODES = "fill-nodes"
    PREWARM = "prewarm"
    PLACEHOLDERS = "placeholders"
    BUDGET_LIMITED = "budget-limited"
    BUDGET_PROBLEM = "budget-problem"
    EVENT_ASK = "event-ask"
    EVENT_RAISED = "event-raised"


#: Reasons the ScalingLimited Condition and Event report (clamps, rate limits, stabilisation).
SCALING_KINDS = frozenset({Kind.STABILISED, Kind.RATE_LIMITED, Kind.CLAMPED})
#: Reasons the BudgetLimited Condition and Event report.
BUDGET_KINDS = frozenset({Kind.BUDGET_LIMITED, Kind.BUDGET_PROBLEM})
#: Reasons the Drift Condition reports.
DRIFT_KINDS = frozenset({Kind.DRIFT_FALLBACK, Kind.DRIFT_NOTE})


@dataclass(frozen=True)
class Reason:
    """One reason of a decision. ``kind`` says what it is; ``str()`` is its sentence."""

    kind: ClassVar[Kind]

    def text(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.text()

    def to_dict(self) -> dict[str, Any]:
        """The kind and the numbers, for logs and tests (status shows the sentence)."""
        return {"kind": str(self.kind), **dataclasses.asdict(self)}


def _cost_text(cost: float | None, currency: str) -> str:
    return "" if cost is None else f", {cost:.2f} {currency}/h"


# -- missing data -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Holding(Reason):
    kind = Kind.HOLDING
    replicas: int
    periods: int
    problem: str | None
    fallback_after: int

    def text(self) -> str:
        return (f"holding {self.replicas} replicas: no valid demand for {self.periods} control period(s) "
                f"({self.problem}); never scaling down on missing data, no new prewarming; "
                f"reactive fallback after {self.fallback_after} periods")


@dataclass(frozen=True)
class KeepingPlaceholders(Reason):
    kind = Kind.KEEPING_PLACEHOLDERS
    gpus: int
    speculative_gpus: int

    def text(self) -> str:
        return (f"keeping {self.gpus} placeholder GPUs already present "
                f"({self.speculative_gpus} speculative GPUs on whole nodes)")


@dataclass(frozen=True)
class MissingDataFallback(Reason):
    kind = Kind.MISSING_DATA_FALLBACK
    periods: int
    problem: str | None
    replicas: int

    def text(self) -> str:
        return (f"reactive fallback: no valid demand for {self.periods} control periods ({self.problem}); "
                f"keeping {self.replicas} replicas (missing metrics never scale down) and removing placeholders")


# -- strategy -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFallback(Reason):
    kind = Kind.MODEL_FALLBACK
    problem: str

    def text(self) -> str:
        return f"reactive: {self.problem}; scaling like the HPA until a valid model is served"


@dataclass(frozen=True)
class DriftFallback(Reason):
    kind = Kind.DRIFT_FALLBACK
    #: The drift monitor's evidence (its own sentence, :mod:`predictive_scaler.policy.drift`).
    evidence: str
    recovery_seconds: int
    good_for_seconds: int | None

    def text(self) -> str:
        good = "" if self.good_for_seconds is None else f"; good again for {self.good_for_seconds} s"
        return (f"reactive: {self.evidence}; back to predictive after the forecast has been good for "
                f"{self.recovery_seconds} s{good}")


@dataclass(frozen=True)
class DriftNote(Reason):
    """The drift monitor's note of this decision (drift started or ended), as it wrote it."""

    kind = Kind.DRIFT_NOTE
    note: str

    def text(self) -> str:
        return self.note


# -- the reactive (HPA) rule --------------------------------------------------------------------
@dataclass(frozen=True)
class HpaRule(Reason):
    """The HPA replica calculation (step 1 of :mod:`predictive_scaler.policy.reactive`).

    ``case``: ``need`` (demand ÷ capacity), ``tolerance`` (within tolerance: keep), ``missing-keep``
    / ``missing-ask`` (not-ready replicas counted as idle on a scale-up, busy on a scale-down).
    """

    kind = Kind.HPA_RULE
    case: Literal["need", "tolerance", "missing-keep", "missing-ask"]
    demand: float
    unit: str
    capacity: float
    replicas: int
    ratio: float = 0.0
    tolerance: float = 0.0
    current: int = 0
    not_ready: int = 0
    counted_busy: bool = False

    def sentence(self) -> str:
        """The calculation alone (without the ``reactive (HPA rule):`` prefix)."""
        d, unit = f"{self.demand:.4g}", self.unit
        per = f"{self.capacity:g} {unit} per replica".strip()
        assumption = f"{self.not_ready} not-ready replicas counted as {'fully busy' if self.counted_busy else 'idle'}"
        if self.case == "tolerance":
            return (f"observed demand {d} {unit} is {self.ratio:.0%} of the {self.current} replicas' "
                    f"capacity, within the {self.tolerance:.0%} tolerance: keep {self.current}")
        if self.case == "missing-keep":
            return (f"observed demand {d} {unit} with {assumption} is {self.ratio:.0%} of "
                    f"{self.current} replicas' capacity: keep {self.current}")
        if self.case == "missing-ask":
            return f"observed demand {d} {unit} with {assumption} asks for {self.replicas} replicas at {per}"
        return f"observed demand {d} {unit} needs {self.replicas} replicas at {per}"

    def text(self) -> str:
        return f"reactive (HPA rule): {self.sentence()}"


@dataclass(frozen=True)
class MissingDemandKept(Reason):
    kind = Kind.MISSING_DEMAND_KEPT
    replicas: int

    def text(self) -> str:
        return (f"demand is missing, so the reactive policy keeps the current {self.replicas} replicas "
                "(missing metrics never scale down)")


@dataclass(frozen=True)
class Stabilised(Reason):
    """An HPA stabilisation window held the recommendation (``limit`` says which)."""

    kind = Kind.STABILISED
    direction: Literal["up", "down"]
    window_seconds: int
    recommendation: int
    held_at: int

    @property
    def limit(self) -> Limit:
        return Limit.SCALE_UP_STABILIZATION if self.direction == "up" else Limit.SCALE_DOWN_STABILIZATION

    def text(self) -> str:
        if self.direction == "down":
            return (f"scale-down stabilisation: the highest recommendation in the last {self.window_seconds} s "
                    f"is {self.recommendation}, so not below {self.held_at}")
        return (f"scale-up stabilisation: the lowest recommendation in the last {self.window_seconds} s "
                f"is {self.recommendation}")


@dataclass(frozen=True)
class RateLimited(Reason):
    """An HPA rate policy cut the change from ``start`` to ``allowed`` (``asked`` before it)."""

    kind = Kind.RATE_LIMITED
    direction: Literal["up", "down"]
    percent: float
    pods: int
    period_seconds: int
    start: int
    allowed: int
    asked: int

    @property
    def limit(self) -> Limit:
        return Limit.SCALE_UP_RATE if self.direction == "up" else Limit.SCALE_DOWN_RATE

    def text(self) -> str:
        if self.direction == "up":
            return (f"scale-up rate limit: at most max({self.percent} %, {self.pods} pods) per "
                    f"{self.period_seconds} s from {self.start}, so {self.allowed} instead of {self.asked}")
        return (f"scale-down rate limit: at most {self.percent} % per {self.period_seconds} s from "
                f"{self.start}, so {self.allowed} instead of {self.asked}")


@dataclass(frozen=True)
class Clamped(Reason):
    """Clamped to a spec bound: ``bound`` min|max replicas, ``asked`` by ``by``."""

    kind = Kind.CLAMPED
    bound: Literal["min", "max"]
    to: int
    asked: int
    by: Literal["reactive", "forecast", "events", "hold"]

    @property
    def limit(self) -> Limit:
        return Limit.MIN_REPLICAS if self.bound == "min" else Limit.MAX_REPLICAS

    def text(self) -> str:
        if self.by == "reactive":
            if self.bound == "min":
                return f"clamped up to minReplicas {self.to} (reactive asked for {self.asked})"
            return f"clamped down to maxReplicas {self.to} (reactive asked for {self.asked})"
        if self.by == "hold":
            return f"clamped down to maxReplicas {self.to} (holding on missing data would keep {self.asked})"
        who = "forecast asks" if self.by == "forecast" else "the scheduled events ask"
        return f"clamped to maxReplicas {self.to} ({who} for {self.asked})"


# -- the predictive strategy --------------------------------------------------------------------
@dataclass(frozen=True)
class PredictiveNeed(Reason):
    kind = Kind.PREDICTIVE_NEED
    quantile: float
    lead_seconds: int
    forecast: float
    unit: str
    peak_factor: float
    step_seconds: int
    sized: float
    capacity: float
    replicas: int
    #: The service tracker's multiplier (spec.service): > 1 while demand has lately gone unserved.
    headroom: float = 1.0

    def text(self) -> str:
        p = f"P{self.quantile * 100:g}"
        peak = "" if self.peak_factor == 1 else (
            f", × {self.peak_factor:g} for the peaks inside a {self.step_seconds // 60:g}-minute step "
            f"(demand.intraStepPeakFactor)")
        if self.headroom > 1:
            peak += f", × {self.headroom:.3g} service headroom (demand went unserved lately; spec.service)"
        if peak:
            peak += f" = {self.sized:.4g} {self.unit}"
        return (f"predictive: {p} demand over the next {self.lead_seconds} s is {self.forecast:.4g} "
                f"{self.unit}{peak}; at {self.capacity:g} {self.unit} per replica that needs {self.replicas} replicas")


@dataclass(frozen=True)
class SpeculativeReplicas(Reason):
    kind = Kind.SPECULATIVE_REPLICAS
    replicas: int
    reactive: int
    gpus: int
    cost_per_hour: float | None
    currency: str

    def text(self) -> str:
        return (f"{self.replicas} replicas above the reactive need of {self.reactive} are speculative "
                f"({self.gpus} GPUs on whole nodes{_cost_text(self.cost_per_hour, self.currency)})")


@dataclass(frozen=True)
class ReleasingAhead(Reason):
    kind = Kind.RELEASING_AHEAD
    lead_seconds: int
    replicas: int
    reactive: int

    def text(self) -> str:
        return (f"the forecast over the next {self.lead_seconds} s and the demand now need {self.replicas} "
                f"replicas, fewer than the reactive rule's {self.reactive} (its scale-down window): "
                f"releasing to {self.replicas}")


@dataclass(frozen=True)
class ReleaseHeld(Reason):
    kind = Kind.RELEASE_HELD
    replicas: int
    wanted: int
    band: float
    unit: str

    def text(self) -> str:
        return (f"releasing only to {self.replicas} replicas, not {self.wanted}: the forecast's upper band "
                f"({self.band:.4g} {self.unit}) does not fit fewer")


@dataclass(frozen=True)
class ReleaseHeldRecent(Reason):
    """A release kept the one node that demand observed within the release window needed."""

    kind = Kind.RELEASE_HELD_RECENT
    replicas: int
    wanted: int
    recent: float
    window_seconds: int
    unit: str

    def text(self) -> str:
        return (f"releasing only to {self.replicas} replicas, not {self.wanted}: demand observed in the last "
                f"{self.window_seconds} s ({self.recent:.4g} {self.unit}) needed the node a release to "
                f"{self.wanted} would drop")


@dataclass(frozen=True)
class ForecastAnchored(Reason):
    """The forecast runs above the level observed now: planned on lowered by the gap."""

    kind = Kind.FORECAST_ANCHORED
    p50: float
    demand: float
    planned: float
    unit: str

    def text(self) -> str:
        return (f"the demand observed now ({self.demand:.4g} {self.unit}) is below the forecast's P50 for it "
                f"({self.p50:.4g}): the forecast is lowered by that gap to {self.planned:.4g} {self.unit}")


@dataclass(frozen=True)
class ReactiveFloor(Reason):
    kind = Kind.REACTIVE_FLOOR
    predicted: int
    reactive: int

    def text(self) -> str:
        return (f"the forecast needs {self.predicted} replicas, fewer than the reactive "
                f"{self.reactive}; keeping the reactive floor")


@dataclass(frozen=True)
class FillNodes(Reason):
    kind = Kind.FILL_NODES
    replicas: int
    nodes: int
    before: int

    def text(self) -> str:
        return (f"fill nodes: {self.replicas} replicas use every GPU of the {self.nodes} node(s) "
                f"{self.before} replicas take (a billed GPU costs the same idle or serving)")


@dataclass(frozen=True)
class Prewarm(Reason):
    """What the demand one node lead time ahead needs beyond the replicas (``extra`` 0: nothing), and
    where those ``extra`` replicas go: ``on_bound_placeholders`` are already held by this scaler's
    placeholder pods bound on existing nodes, ``on_free_gpus`` fit on free GPUs of existing nodes,
    the rest need new nodes."""

    kind = Kind.PREWARM
    quantile: float
    peak_factor: float
    lead_seconds: int
    forecast: float
    unit: str
    covered: bool
    needed: int
    replicas: int
    extra: int
    on_free_gpus: int
    on_bound_placeholders: int = 0

    def text(self) -> str:
        p = f"P{self.quantile * 100:g}"
        p = p if self.peak_factor == 1 else f"{p} × intra-step peak factor {self.peak_factor:g}"
        horizon = "" if self.covered else " (the forecast horizon ends before the node lead time)"
        head = f"prewarm: {p} demand over the next {self.lead_seconds} s is {self.forecast:.4g} {self.unit}{horizon}"
        if self.extra == 0:
            return (f"{head}, needing {self.needed} replicas; the {self.replicas} existing or starting "
                    "replicas cover it, no placeholders")
        bound = (f"{self.on_bound_placeholders} already held by placeholders bound on existing nodes, "
                 if self.on_bound_placeholders else "")
        return (f"{head}, needing {self.needed} replicas, {self.extra} more than the {self.replicas} existing "
                f"or starting; {bound}{self.on_free_gpus} fit on free GPUs of existing nodes, "
                f"{self.extra - self.on_bound_placeholders - self.on_free_gpus} need new nodes")


@dataclass(frozen=True)
class Placeholders(Reason):
    kind = Kind.PLACEHOLDERS
    gpus: int
    gpus_per_node: int
    speculative_gpus: int
    cost_per_hour: float | None
    currency: str

    def text(self) -> str:
        return (f"{self.gpus} placeholder GPUs keep capacity warm on nodes of {self.gpus_per_node} GPUs "
                f"({self.speculative_gpus} speculative GPUs in all{_cost_text(self.cost_per_hour, self.currency)})")


# -- the budget ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetLimited(Reason):
    """The prewarm budget cut the speculative ``what`` (``problem``: it allows nothing, and why)."""

    kind = Kind.BUDGET_LIMITED
    what: Literal["replicas", "prewarmed nodes"]
    wanted_gpus: int
    allowed_gpus: int
    summary: str
    problem: str | None = None

    def text(self) -> str:
        if self.problem is not None:
            return f"no speculative {self.what}: {self.problem}"
        return (f"prewarm budget limits the speculative {self.what}: they would take {self.wanted_gpus} GPUs, "
                f"the budget allows {self.allowed_gpus} ({self.summary})")


@dataclass(frozen=True)
class BudgetProblem(Reason):
    """The budget is empty or invalid (``limit``), so nothing is speculated; ``message`` says what to fix."""

    kind = Kind.BUDGET_PROBLEM
    limit: Limit
    message: str

    def text(self) -> str:
        return self.message


# -- scheduled events ---------------------------------------------------------------------------
@dataclass(frozen=True)
class EventAsk(Reason):
    """What one scheduled event in force asks for: a floor, or demand × multiplier (None: no demand)."""

    kind = Kind.EVENT_ASK
    name: str
    starts: bool
    seconds_left: int
    min_replicas: int | None = None
    multiplier: float | None = None
    demand: float | None = None
    unit: str = ""
    replicas: int = 0

    def text(self) -> str:
        when = f"{'starts in' if self.starts else 'ends in'} {self.seconds_left} s"
        if self.min_replicas is not None:
            return f"scheduled event {self.name!r} ({when}) asks for at least {self.min_replicas} replicas"
        if self.demand is not None:
            return (f"scheduled event {self.name!r} ({when}) plans for demand × {self.multiplier:g} = "
                    f"{self.demand:.4g} {self.unit}, {self.replicas} replicas")
        return (f"scheduled event {self.name!r} ({when}): demand × {self.multiplier:g} cannot be applied "
                "while demand is missing")


@dataclass(frozen=True)
class EventRaised(Reason):
    """The events in force raised the plan from ``before`` to ``to`` (or ``before`` already covered it)."""

    kind = Kind.EVENT_RAISED
    before: int
    to: int
    names: tuple[str, ...]

    def text(self) -> str:
        names = ", ".join(map(repr, self.names))
        if self.to > self.before:
            return (f"raised from {self.before} to {self.to} replicas for the scheduled event(s) {names}: asked for "
                    "in spec.events, so not speculative and not charged to the prewarm budget")
        return f"the plan's {self.before} replicas already cover the scheduled event(s) {names}"
