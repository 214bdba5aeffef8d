"""A decision's Events and Conditions, derived from its typed limits and reasons. Pure.

The one place a :class:`~predictive_scaler.policy.planner.Decision` becomes what
``kubectl describe`` shows. Classification is by :class:`~predictive_scaler.policy.reasons.Kind`
and :class:`~predictive_scaler.policy.reasons.Limit`, never by the sentences, so a
reworded sentence changes no Event and no Condition; the messages are the reasons'
sentences (:mod:`predictive_scaler.policy.reasons`). The ScalingLimited and
BudgetLimited Events are posted exactly when their Conditions are True, with the
Conditions' messages.

:func:`actions` are the Events of what a reconcile did to the cluster (HPA's
``SuccessfulRescale`` trail, and the placeholders): one per change, from what the
cluster held before to what it holds after, with the kind of reason that moved it. Their
messages carry counts and a kind, not the reasons' figures, so the same action repeated
is the same Event (its count is raised, see ``controller/service.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from predictive_scaler.policy.reasons import (
    BUDGET_KINDS,
    DRIFT_KINDS,
    SCALING_KINDS,
    EventRaised,
    Kind,
    Limit,
    Reason,
)
from predictive_scaler.spec import ScalerSpec

if TYPE_CHECKING:  # the planner imports nothing from here; only the types are needed
    from predictive_scaler.policy.planner import ClusterState, Decision

__all__ = ["Condition", "Event", "Held", "actions", "budget_reasons", "conditions", "events", "rescale_kind",
           "scaling_reasons", "strategy_reason"]

#: The Event reasons of actions: the target rescaled (as the HPA names it), placeholder pods added or removed.
RESCALED = "SuccessfulRescale"
PLACEHOLDERS_CREATED = "PlaceholdersCreated"
PLACEHOLDERS_REMOVED = "PlaceholdersRemoved"

#: The reasons that say why a strategy is in force (the Predictive Condition and StrategyChanged show them).
_STRATEGY_KINDS: dict[str, frozenset[Kind]] = {
    "predictive": frozenset({Kind.PREDICTIVE_NEED}),
    "reactive": frozenset({Kind.MODEL_FALLBACK, Kind.DRIFT_FALLBACK, Kind.MISSING_DATA_FALLBACK}),
    "hold": frozenset({Kind.HOLDING}),
}


@dataclass(frozen=True)
class Event:
    """A Kubernetes-style Event: ``type`` Normal|Warning, a CamelCase ``reason``, a sentence."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


@dataclass(frozen=True)
class Held:
    """What the cluster holds for a scaler: the target's replicas and the placeholder's pods."""

    replicas: int
    placeholder_pods: int


def _join(reasons: tuple[Reason, ...]) -> str:
    return "; ".join(r.text() for r in reasons)


def scaling_reasons(d: Decision) -> tuple[Reason, ...]:
    """The clamps, rate limits and stabilisation windows that shaped the decision."""
    return tuple(r for r in d.reasons if r.kind in SCALING_KINDS)


def budget_reasons(d: Decision) -> tuple[Reason, ...]:
    """The budget's cuts and problems (an empty or invalid budget)."""
    return tuple(r for r in d.reasons if r.kind in BUDGET_KINDS)


def strategy_reason(d: Decision) -> str:
    """Why the decision's strategy is in force: its own reason's sentence (never another rule's)."""
    kinds = _STRATEGY_KINDS.get(d.strategy, frozenset())
    own = next((r for r in d.reasons if r.kind in kinds), None)
    if own is not None:
        return own.text()
    return {"predictive": "predictive: forecasting", "reactive": "reactive: scaling like the HPA",
            "hold": "holding on missing data"}.get(d.strategy, d.strategy)


def rescale_kind(d: Decision) -> str:
    """The kind of reason behind the decision's replicas: ``event`` when the scheduled events raised
    them, else its strategy (``predictive``, ``reactive``, ``hold``)."""
    raised = any(isinstance(r, EventRaised) and r.to > r.before and r.to == d.desired_replicas for r in d.reasons)
    return "event" if raised else d.strategy


def _placeholder_kind(d: Decision, mode: str, grew: bool) -> str:
    if mode != "scale":
        return mode  # a scaler switched to forecast-only or keda leaves no placeholder behind
    if not grew and d.strategy == "predictive" and Limit.BUDGET in d.limits:
        return "budget"
    return d.strategy


def actions(d: Decision, before: Held, after: Held, spec: ScalerSpec) -> tuple[Event, ...]:
    """One Event per change the reconcile made: the target's replicas, the placeholder's pods.

    ``before``: what the cluster held when observed; ``after``: what it holds now that the
    reconcile wrote (nothing written, nothing changed: no Event, as in forecast-only)."""
    out: list[Event] = []
    target = f"{spec.target.kind}/{spec.target.name}"
    if after.replicas != before.replicas:
        out.append(Event("Normal", RESCALED,
                         f"New size: {after.replicas}; reason: {rescale_kind(d)} ({target} scaled from "
                         f"{before.replicas} to {after.replicas} replicas)"))
    if after.placeholder_pods != before.placeholder_pods:
        grew = after.placeholder_pods > before.placeholder_pods
        gpus = after.placeholder_pods * spec.gpus_per_replica
        out.append(Event("Normal", PLACEHOLDERS_CREATED if grew else PLACEHOLDERS_REMOVED,
                         f"New placeholder size: {after.placeholder_pods} pods, {gpus} GPUs; reason: "
                         f"{_placeholder_kind(d, spec.mode, grew)} (placeholder pods from "
                         f"{before.placeholder_pods} to {after.placeholder_pods})"))
    return tuple(out)


def _budget_state(d: Decision) -> tuple[bool, str, str]:
    """(limited, Condition reason, message) of the budget."""
    limited = Limit.BUDGET in d.limits or d.budget_problem is not None
    message = _join(budget_reasons(d)) or (d.budget_problem or "within budget")
    if d.budget_problem is not None:
        return True, "BudgetInvalid" if _invalid_problem(d) else "BudgetEmpty", message
    return limited, "BudgetReached" if limited else "WithinBudget", message


def _invalid_problem(d: Decision) -> bool:
    return d.budget_problem is not None and d.budget_problem_limit is Limit.BUDGET_INVALID


def events(d: Decision, before_strategy: str, cluster: ClusterState, spec: ScalerSpec) -> tuple[Event, ...]:
    """The Events of one decision (``before_strategy``: the strategy of the state it was decided from)."""
    out: list[Event] = []
    if d.strategy_changed:
        kind = "Normal" if d.strategy == "predictive" else "Warning"
        out.append(Event(kind, "StrategyChanged",
                         f"{before_strategy} → {d.strategy}: {strategy_reason(d)}"))
    scaling = scaling_reasons(d)
    if scaling:
        out.append(Event("Normal", "ScalingLimited", _join(scaling)))
    if Limit.BUDGET in d.limits:
        out.append(Event("Normal", "BudgetLimited", _join(budget_reasons(d))))
    if d.budget_problem is not None and _invalid_problem(d):
        out.append(Event("Warning", "BudgetInvalid", d.budget_problem))
    if spec.mode == "forecast-only" and (
        d.desired_replicas != cluster.desired_replicas or d.placeholder_gpus != cluster.placeholder_gpus
    ):
        out.append(Event("Normal", "ForecastOnly",
                         f"forecast-only: would scale {spec.target.kind}/{spec.target.name} "
                         f"from {cluster.desired_replicas} to {d.desired_replicas} replicas and hold "
                         f"{d.placeholder_gpus} placeholder GPUs ({d.strategy})"))
    return tuple(out)


def conditions(d: Decision, applied: bool, mode: str) -> tuple[Condition, ...]:
    """The reconciler's Conditions of one decision (``applied``: it was written to the cluster)."""
    def cond(kind: str, on: bool, reason: str, message: str) -> Condition:
        return Condition(kind, "True" if on else "False", reason, message)

    scaling = scaling_reasons(d)
    budget_limited, budget_reason, budget_msg = _budget_state(d)
    drift = next((r.text() for r in d.reasons if r.kind in DRIFT_KINDS), "the forecast matches demand")
    return (
        cond("Ready", True, "Scaled" if applied else "ServedToKeda" if mode == "keda" else "ForecastOnly",
             f"{d.strategy}: {d.desired_replicas} replicas, {d.placeholder_gpus} placeholder GPUs"
             + ("" if applied else " (served to KEDA's external scaler; nothing written)"
                if mode == "keda" else " (forecast-only: nothing changed)")),
        cond("Predictive", d.strategy == "predictive",
             {"predictive": "Forecasting", "reactive": "ReactiveFallback", "hold": "HoldingOnMissingData"}[d.strategy],
             strategy_reason(d)),
        cond("Drift", d.drift is not None,
             "UnderForecast" if d.drift == "under-forecast" else "OverForecast" if d.drift else "NoDrift", drift),
        cond("BudgetLimited", budget_limited, budget_reason, budget_msg),
        cond("ScalingLimited", bool(scaling), "Limited" if scaling else "NotLimited",
             _join(scaling) or "no clamp or rate limit applied"),
        cond("MetricsUnavailable", d.metrics_problem is not None,
             "MissingDemand" if d.metrics_problem else "MetricsOK", d.metrics_problem or "demand is fresh"),
        cond("ModelInvalid", d.model_problem is not None,
             "ModelUnavailable" if d.model_problem else "ModelOK", d.model_problem or "forecast is valid"),
    )
