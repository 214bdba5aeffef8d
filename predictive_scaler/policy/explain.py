"""A decision's Events and Conditions, derived from its typed limits and reasons. Pure.

The one place a :class:`~predictive_scaler.policy.planner.Decision` becomes what
``kubectl describe`` shows. Classification is by :class:`~predictive_scaler.policy.reasons.Kind`
and :class:`~predictive_scaler.policy.reasons.Limit`, never by the sentences, so a
reworded sentence changes no Event and no Condition; the messages are the reasons'
sentences (:mod:`predictive_scaler.policy.reasons`). The ScalingLimited and
BudgetLimited Events are posted exactly when their Conditions are True, with the
Conditions' messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from predictive_scaler.policy.reasons import BUDGET_KINDS, DRIFT_KINDS, SCALING_KINDS, Limit, Reason
from predictive_scaler.spec import ScalerSpec

if TYPE_CHECKING:  # the planner imports nothing from here; only the types are needed
    from predictive_scaler.policy.planner import ClusterState, Decision

__all__ = ["Condition", "Event", "budget_reasons", "conditions", "events", "scaling_reasons"]


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


def _join(reasons: tuple[Reason, ...]) -> str:
    return "; ".join(r.text() for r in reasons)


def scaling_reasons(d: Decision) -> tuple[Reason, ...]:
    """The clamps, rate limits and stabilisation windows that shaped the decision."""
    return tuple(r for r in d.reasons if r.kind in SCALING_KINDS)


def budget_reasons(d: Decision) -> tuple[Reason, ...]:
    """The budget's cuts and problems (an empty or invalid budget)."""
    return tuple(r for r in d.reasons if r.kind in BUDGET_KINDS)


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
                         f"{before_strategy} → {d.strategy}: {d.reasons[0].text() if d.reasons else ''}"))
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

    first = d.reasons[0].text() if d.reasons else d.strategy
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
             first),
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
