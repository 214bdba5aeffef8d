"""The custom resource's ``status``: built from a ReconcileResult (or a refusal). Pure.

Conditions follow ``metav1.Condition``: ``lastTransitionTime`` changes only when
a condition's status flips, so ``kubectl describe`` shows since when a scaler
has been reactive or budget-limited. Every field written here is in the CRD's
status schema (``predictive_scaler.crd.status_json_schema``); anything else
would be pruned by the API server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from predictive_scaler.reconcile import Condition, ReconcileResult
from predictive_scaler.spec import ScalerSpec

#: Conditions the controller adds beside the reconciler's.
CONFLICT = "ConflictingAutoscaler"
PAUSED = "Paused"


def rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions_with_times(conditions: Iterable[Condition], previous: Sequence[Mapping[str, Any]] | None,
                          now: datetime, generation: int | None) -> list[dict[str, Any]]:
    """Conditions as status entries, keeping ``lastTransitionTime`` of those that did not flip."""
    before = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    out = []
    for c in conditions:
        old = before.get(c.type)
        since = old.get("lastTransitionTime") if old and old.get("status") == c.status else None
        entry: dict[str, Any] = {"type": c.type, "status": c.status, "reason": c.reason,
                                 "message": c.message[:32768], "lastTransitionTime": since or rfc3339(now)}
        if generation is not None:
            entry["observedGeneration"] = generation
        out.append(entry)
    return out


def _finite(values: Iterable[float]) -> list[float]:
    return [float(v) if math.isfinite(float(v)) else 0.0 for v in values]


def forecast_status(result: ReconcileResult, quantile: float) -> dict[str, Any] | None:
    f = result.forecast
    if f is None:
        return None
    try:
        p50, pq = f.quantile(0.5), f.quantile(quantile)
    except Exception:  # noqa: BLE001 — a forecast without these rows is not reported, not fatal
        return None
    return {"issuedAt": rfc3339(f.issued_at.to_pydatetime()), "stepSeconds": int(f.step_seconds),
            "quantile": float(quantile), "model": f.model, "p50": _finite(p50), "p95": _finite(pq)}


@dataclass(frozen=True)
class Extra:
    """What the controller knows beside the ReconcileResult."""

    conflicts: tuple[str, ...] = ()
    #: Speculative GPUs / cost booked against the budgets (0 in forecast-only: nothing is held).
    budget_gpus: int = 0
    budget_cost_per_hour: float | None = None
    #: A kept-previous-model warning from the model port.
    model_warning: str | None = None
    #: Savings text of a forecast-only run (what scaling would have saved now).
    savings: str | None = None


def reconciled_status(result: ReconcileResult, spec: ScalerSpec, extra: Extra,
                      previous: Mapping[str, Any] | None, now: datetime, generation: int | None) -> dict[str, Any]:
    d = result.decision
    conds = list(result.conditions)
    if extra.model_warning and not any(c.type == "ModelInvalid" and c.status == "True" for c in conds):
        conds = [Condition("ModelInvalid", "False", "PreviousVersionKept", extra.model_warning)
                 if c.type == "ModelInvalid" else c for c in conds]
    if extra.savings:
        conds = [Condition(c.type, c.status, c.reason, f"{c.message}; {extra.savings}")
                 if c.type == "Ready" else c for c in conds]
    if extra.conflicts:
        conds.append(Condition(CONFLICT, "True", "ForecastOnly",
                               f"{', '.join(extra.conflicts)} also scales {spec.target.kind}/{spec.target.name}; "
                               "forecast-only is fine beside it, but mode 'scale' will be refused until it is "
                               "removed"))
    else:
        conds.append(Condition(CONFLICT, "False", "NoOtherAutoscaler",
                               "no HPA or KEDA ScaledObject targets the same workload"))
    conds.append(Condition(PAUSED, "False", "NotPaused", "reconciling"))
    status: dict[str, Any] = {
        "mode": spec.mode,
        "strategy": d.strategy,
        "desiredReplicas": int(d.desired_replicas),
        "currentReplicas": int(result.cluster.ready_replicas),
        "placeholderGpus": int(d.placeholder_gpus if result.applied else result.cluster.placeholder_gpus),
        "budgetInUse": _budget(extra.budget_gpus, extra.budget_cost_per_hour, d.currency),
        "modelVersion": result.model_version,
        "lastReconcileTime": rfc3339(now),
        "reasons": [str(r) for r in d.reasons][:20],
        "forecast": forecast_status(result, spec.quantile),
        "conditions": conditions_with_times(conds, _conditions_of(previous), now, generation),
        "plannerState": result.state.to_dict(),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _budget(gpus: int, cost: float | None, currency: str) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": int(gpus), "currency": currency}
    out["costPerHour"] = float(cost) if cost is not None and math.isfinite(cost) else None
    return out


def _conditions_of(previous: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    conds = (previous or {}).get("conditions")
    return list(conds) if isinstance(conds, list) else []


def refused_status(kind: str, reason: str, message: str, previous: Mapping[str, Any] | None, now: datetime,
                   generation: int | None, *, mode: str | None = None, conflict: bool = False,
                   paused: bool = False, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """Status when nothing was reconciled: invalid spec, paused, conflicting autoscaler, missing target.

    The planner state and the last forecast are left as they are (a merge patch only
    touches what it names), so resuming continues where the scaler stopped.
    """
    conds = [Condition("Ready", "False", reason, message)]
    conds.append(Condition(CONFLICT, "True" if conflict else "False",
                           "Refused" if conflict else "NoOtherAutoscaler",
                           message if conflict else "no HPA or KEDA ScaledObject targets the same workload"))
    conds.append(Condition(PAUSED, "True" if paused else "False", "PausedByAnnotation" if paused else "NotPaused",
                           message if paused else kind))
    status: dict[str, Any] = {
        "lastReconcileTime": rfc3339(now),
        "conditions": conditions_with_times(
            _merge_conditions(_conditions_of(previous), conds), _conditions_of(previous), now, generation),
    }
    if mode is not None:
        status["mode"] = mode
    if budget is not None:
        status["budgetInUse"] = budget
    if generation is not None:
        status["observedGeneration"] = generation
    return status


def _merge_conditions(previous: Sequence[Mapping[str, Any]], new: Sequence[Condition]) -> list[Condition]:
    """``new`` replaces same-type conditions; the others (Predictive, Drift …) stay as last reported."""
    replaced = {c.type for c in new}
    kept = [Condition(str(c.get("type")), str(c.get("status", "Unknown")), str(c.get("reason", "")),
                      str(c.get("message", ""))) for c in previous if c.get("type") not in replaced]
    return [*new, *kept]
