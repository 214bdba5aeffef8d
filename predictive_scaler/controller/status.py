"""The custom resource's ``status``: built from a ReconcileResult (or a refusal). Pure.

Conditions follow ``metav1.Condition``: ``lastTransitionTime`` changes only when
a condition's status flips, so ``kubectl describe`` shows since when a scaler
has been reactive or budget-limited. Every field written here is in the CRD's
status schema (``predictive_scaler.crd.status_json_schema``); anything else
would be pruned by the API server.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from predictive_scaler import waste
from predictive_scaler.controller.api_activity import MISSING_API, RETRY_KINDS, ApiTally
from predictive_scaler.errors import DataError
from predictive_scaler.policy.explain import Condition
from predictive_scaler.policy.saturation import ServingHistory, SignalCheck
from predictive_scaler.reconcile import ReconcileResult
from predictive_scaler.retrain.outcome import serve_learned_capacity
from predictive_scaler.spec import MAX_REQUESTS_PER_REPLICA, MIN_REQUESTS_PER_REPLICA, ScalerSpec

#: Conditions the controller adds beside the reconciler's.
CONFLICT = "ConflictingAutoscaler"
PAUSED = "Paused"
API_DEGRADED = "ApiDegraded"
#: The Warning Event posted while ApiDegraded is True (deduplicated: its message names kinds, not counts).
API_EVENT = "ClusterApiErrors"
#: dcgm-busy-gpus scalers: whether GPU utilisation measures load (policy/saturation.py); a Condition, and a
#: Warning Event of the same reason while it does not and scaling up on it is withheld.
DEMAND_SIGNAL = "DemandSignalSaturated"


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
class ApiReport:
    """Kubernetes API trouble since the status was last written: retries absorbed, reconciles failed."""

    retries: ApiTally = ApiTally()
    failed_reconciles: int = 0
    failing_since: datetime | None = None
    last_error: str | None = None
    #: Retry kinds of the errors that failed reconciles (their last error's kind).
    failed_kinds: tuple[str, ...] = ()

    @property
    def degraded(self) -> bool:
        return self.failed_reconciles > 0 or self.retries.total > 0

    def kinds(self) -> tuple[str, ...]:
        """Retry kinds in RETRY_KINDS order, then what else failed (a missing API, an HTTP status)."""
        seen = set(self.failed_kinds) | {k for k, n in self.retries.retries.items() if n}
        others = tuple(k for k in self.failed_kinds if k not in RETRY_KINDS)
        return tuple(k for k in RETRY_KINDS if k in seen) + others

    @property
    def missing_api(self) -> bool:
        return any(k.startswith(MISSING_API) for k in self.failed_kinds)

    def condition(self) -> Condition:
        if not self.degraded:
            return Condition(API_DEGRADED, "False", "ApiHealthy",
                             "every Kubernetes API call since the last status write succeeded at the first attempt")
        parts = []
        if self.failed_reconciles:
            since = f" since {rfc3339(self.failing_since)}" if self.failing_since else ""
            parts.append(f"{self.failed_reconciles} reconcile(s) failed on Kubernetes API errors{since} and were "
                         f"retried by kopf (last: {(self.last_error or 'unknown')[:400]})")
        if self.retries.total:
            parts.append(f"{self.retries.total} API call(s) retried ({self.retries.describe()})")
        reason = "ApiMissing" if self.missing_api else (
            "ReconcileFailed" if self.failed_reconciles else "RetriesAbsorbed")
        return Condition(API_DEGRADED, "True", reason,
                         "; ".join(parts) + ". The strategy is not changed by API errors. " + _api_advice(self.kinds()))

    def event_message(self) -> str:
        what = ("reconciles failed and were retried" if self.failed_reconciles
                else "calls were retried and succeeded")
        return (f"Kubernetes API errors ({', '.join(self.kinds())}): {what}; see the {API_DEGRADED} condition "
                "and predictive_scaler_api_retries_total. " + _api_advice(self.kinds()))


def _api_advice(kinds: Sequence[str]) -> str:
    advice = {
        "conflict": "409: another writer changes this object (a second controller replica, an HPA, kubectl)",
        "throttled": "429: API Priority and Fairness throttles the controller — check its flow schema",
        "server-error": "5xx: check the API server's and etcd's health",
        "unreachable": "unreachable: check the network path and the API server's endpoints",
    }
    hints = [advice[k] for k in kinds if k in advice]
    hints += [f"{k}: the API server does not serve it — Kubernetes 1.23+ serves autoscaling/v2, "
              "older servers autoscaling/v2beta2; upgrade the cluster" for k in kinds if k.startswith(MISSING_API)]
    return ("If it persists: " + "; ".join(hints) + ".") if hints else ""


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
    #: Kubernetes API trouble since the last status write (None: not reported, e.g. in unit tests).
    api: ApiReport | None = None
    #: The dcgm-busy-gpus demand-signal check of this reconcile (None: not checked).
    demand_signal: SignalCheck | None = None
    #: The capacity per replica planned on (None: no capacity.slo, nothing learned to report).
    capacity: CapacityInUse | None = None
    #: The GPU waste this reconcile could compute (empty: no evidence for any kind).
    waste: tuple[WasteKind, ...] = ()
    currency: str = "USD"


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
                               "no other HPA or ScaledObject targets the same workload (the ScaledObject whose "
                               "external trigger names this scaler, and KEDA's HPA for it, are how it acts)"
                               if spec.mode == "keda" else "no HPA or KEDA ScaledObject targets the same workload"))
    conds.append(Condition(PAUSED, "False", "NotPaused", "reconciling"))
    if extra.api is not None:
        conds.append(extra.api.condition())
    if spec.demand.kind == "dcgm-busy-gpus":
        conds.append(demand_signal_condition(extra.demand_signal))
    status: dict[str, Any] = {
        "mode": spec.mode,
        "strategy": d.strategy,
        "desiredReplicas": int(d.desired_replicas),
        "currentReplicas": int(result.cluster.ready_replicas),
        "placeholderGpus": int(d.placeholder_gpus if result.applied else result.cluster.placeholder_gpus),
        "budgetInUse": _budget(extra.budget_gpus, extra.budget_cost_per_hour, d.currency),
        "modelVersion": result.model_version,
        "lastReconcileTime": rfc3339(now),
        "reasons": list(d.sentences)[:20],  # the sentences users read; the typed reasons stay in the Decision
        "scheduledEvents": list(d.scheduled_events)[:50],
        "forecast": forecast_status(result, spec.quantile),
        "conditions": conditions_with_times(conds, _conditions_of(previous), now, generation),
        "plannerState": result.state.to_dict(),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    # Written only when there is something to say; a merge patch with null removes an old block.
    if extra.capacity is not None or "capacity" in (previous or {}):
        status["capacity"] = extra.capacity.to_status() if extra.capacity is not None else None
    if extra.waste or "waste" in (previous or {}):
        status["waste"] = waste_status(extra.waste, extra.currency)
    return status


def demand_signal_condition(check: SignalCheck | None) -> Condition:
    """DemandSignalSaturated of a dcgm-busy-gpus scaler: True while GPU utilisation does not measure load."""
    if check is None:
        return Condition(DEMAND_SIGNAL, "Unknown", "NotChecked",
                         "no serving history (served rate, latency) is wired for this scaler, so whether GPU "
                         "utilisation measures load is not checked")
    if check.verdict == "unknown":
        return Condition(DEMAND_SIGNAL, "Unknown", check.reason, check.message)
    return Condition(DEMAND_SIGNAL, "True" if check.fired else "False", check.reason, check.message)


def _budget(gpus: int, cost: float | None, currency: str) -> dict[str, Any]:
    out: dict[str, Any] = {"gpus": int(gpus), "currency": currency}
    out["costPerHour"] = float(cost) if cost is not None and math.isfinite(cost) else None
    return out


def _conditions_of(previous: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    conds = (previous or {}).get("conditions")
    return list(conds) if isinstance(conds, list) else []


def refused_status(kind: str, reason: str, message: str, previous: Mapping[str, Any] | None, now: datetime,
                   generation: int | None, *, mode: str | None = None, conflict: bool = False,
                   paused: bool = False, budget: dict[str, Any] | None = None,
                   api: ApiReport | None = None) -> dict[str, Any]:
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
    if api is not None:
        conds.append(api.condition())
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


def api_conditions_patch(report: ApiReport, previous: Mapping[str, Any] | None, now: datetime,
                         generation: int | None) -> dict[str, Any]:
    """A status patch that only sets ApiDegraded (a failing reconcile's attempt): the list is replaced
    whole by a merge patch, so the other conditions are carried over as they were."""
    before = _conditions_of(previous)
    merged = _merge_conditions(before, [report.condition()])
    return {"conditions": conditions_with_times(merged, before, now, generation)}


def _merge_conditions(previous: Sequence[Mapping[str, Any]], new: Sequence[Condition]) -> list[Condition]:
    """``new`` replaces same-type conditions; the others (Predictive, Drift …) stay as last reported."""
    replaced = {c.type for c in new}
    kept = [Condition(str(c.get("type")), str(c.get("status", "Unknown")), str(c.get("reason", "")),
                      str(c.get("message", ""))) for c in previous if c.get("type") not in replaced]
    return [*new, *kept]


# -- the capacity per replica planned on (spec.capacity.learned) ------------------------------------

@dataclass(frozen=True)
class CapacityInUse:
    """What one replica is planned to serve, and where it came from; ``status.capacity``."""

    serving: float
    #: spec.capacity.requestsPerReplica: the start value, and the floor a lower bound cannot go under.
    configured: float
    #: The learned value last taken into account (serve) or last seen (report), and its kind.
    learned: float | None
    kind: str | None
    source: str
    mode: str
    unit: str
    since: str
    reason: str

    def to_status(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"serving": self.serving, "configured": self.configured, "source": self.source,
                               "learnedMode": self.mode, "unit": self.unit, "since": self.since,
                               "reason": self.reason[:1024]}
        if self.learned is not None:
            doc["learned"], doc["kind"] = self.learned, self.kind
        return doc


def _positive(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def learned_of(previous: Mapping[str, Any] | None) -> tuple[float, str] | None:
    """The learned capacity the retraining job reported (``status.retrain.learnedCapacity``), if usable."""
    retrain = (previous or {}).get("retrain")
    lc = retrain.get("learnedCapacity") if isinstance(retrain, Mapping) else None
    if not isinstance(lc, Mapping) or lc.get("kind") not in ("point", "lower-bound"):
        return None
    value = _positive(lc.get("perReplica"))
    return None if value is None else (value, str(lc["kind"]))


def capacity_in_use(spec: ScalerSpec, previous: Mapping[str, Any] | None, now: datetime) -> CapacityInUse | None:
    """The capacity per replica to plan on this reconcile. Pure; None when ``capacity.slo`` is not set.

    ``report`` plans on ``requestsPerReplica`` and only reports what was learned. ``serve`` takes a newly
    learned value through :func:`serve_learned_capacity` (×2/÷2 from the value in use, a lower bound never
    under ``requestsPerReplica``) exactly once: the value in use and the learned value it came from are in
    ``status.capacity``, so neither a restart nor a repeated reconcile moves it again. A changed
    ``requestsPerReplica`` starts again from it (the user's word on the start value is the newest fact).
    """
    floor = spec.capacity.requests_per_replica
    if spec.capacity.slo is None or floor is None:
        return None
    learned = learned_of(previous)
    prev = (previous or {}).get("capacity")
    prev = prev if isinstance(prev, Mapping) else {}
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    unit = spec.demand_unit
    if spec.capacity.learned == "report":
        kept = prev.get("learnedMode") == "report" and _positive(prev.get("serving")) == floor
        seen = (f"; learned {learned[1]} {learned[0]:.4g} {unit} is reported only" if learned else
                "; nothing learned at the SLO yet")
        return CapacityInUse(floor, floor, learned[0] if learned else None, learned[1] if learned else None,
                             "configured", "report", unit, str(prev.get("since")) if kept else stamp,
                             f"capacity.learned is report: planning on requestsPerReplica {floor:g}{seen}")
    held = _positive(prev.get("serving")) if (prev.get("learnedMode") == "serve"
                                              and _positive(prev.get("configured")) == floor) else None
    in_use = held if held is not None else floor
    since = str(prev.get("since")) if held is not None and prev.get("since") else stamp
    prev_learned, prev_kind = _positive(prev.get("learned")), prev.get("kind")
    if learned is None or (held is not None and (prev_learned, prev_kind) == learned):
        source = "learned" if held is not None and prev_learned is not None else "configured"
        reason = (str(prev.get("reason")) if held is not None and prev.get("reason") else
                  f"no capacity learned at the SLO yet (status.retrain.learnedCapacity): planning on "
                  f"requestsPerReplica {floor:g}")
        return CapacityInUse(in_use, floor, prev_learned if held is not None else None,
                             str(prev_kind) if held is not None and prev_kind else None, source, "serve", unit,
                             since, reason)
    served, why = serve_learned_capacity(in_use, {"kind": learned[1], "value": learned[0]}, floor)
    served = min(max(served, MIN_REQUESTS_PER_REPLICA), MAX_REQUESTS_PER_REPLICA)
    return CapacityInUse(served, floor, learned[0], learned[1], "learned", "serve", unit,
                         stamp if served != in_use or held is None else since,
                         f"planning on {served:.4g} {unit} per replica: {why}")


def planned_spec(spec: ScalerSpec, capacity: CapacityInUse | None) -> ScalerSpec:
    """``spec`` with the capacity per replica in use: the planner, the KEDA answer and the metrics read it."""
    if capacity is None or capacity.serving == spec.capacity.requests_per_replica:
        return spec
    return dataclasses.replace(spec, capacity=dataclasses.replace(spec.capacity, requests_per_replica=capacity.serving))


# -- GPU waste (predictive_scaler/waste.py) on what the controller already reads ----------------------

#: What each kind needs, and whether the controller has it: the serving history is the one the
#: dcgm-busy-gpus guard pulls; the idle GPUs are the retraining job's report. The KV-cache kind needs the
#: cache usage and waiting requests, which the controller does not read, so it is never emitted here.
WASTE_EVIDENCE: Mapping[str, str] = {
    "cpu-bound": "the serving history the dcgm-busy-gpus guard reads (served rate, GPUs, utilisation, latency)",
    "saturated-at-low-load": "the serving history the dcgm-busy-gpus guard reads",
    "kv-cache-pressure": "KV-cache usage and waiting requests (not read by the controller)",
    "idle": "status.retrain.idleGpus, from the retraining job's DCGM pull",
}


@dataclass(frozen=True)
class WasteKind:
    """One kind of waste, as GPU-hours and cost a day at the rate seen over its evidence window."""

    kind: str
    fired: bool
    gpu_hours_per_day: float
    cost_per_day: float | None
    observed_hours: float | None
    message: str


def _per_day(found: waste.WasteFinding) -> WasteKind | None:
    if not found.observed_hours > 0:
        return None
    per_day = found.gpu_hours * 24.0 / found.observed_hours
    cost = None if found.cost is None else found.cost * 24.0 / found.observed_hours
    return WasteKind(found.kind, found.fired, per_day, cost, found.observed_hours, found.message)


def waste_report(history: ServingHistory | None, previous: Mapping[str, Any] | None, *,
                 price_per_gpu_hour: float | None, currency: str) -> tuple[WasteKind, ...]:
    """The waste kinds this reconcile has evidence for (:data:`WASTE_EVIDENCE`). Pure.

    A kind whose evidence is missing or too short is left out, never reported as zero."""
    out: list[WasteKind] = []
    if history is not None:
        for detect in (waste.cpu_bound, waste.saturated_at_low_load):
            try:
                found = _per_day(detect(history, price_per_gpu_hour=price_per_gpu_hour, currency=currency))
            except DataError:
                continue
            if found is not None:
                out.append(found)
    retrain = (previous or {}).get("retrain")
    idle = retrain.get("idleGpus") if isinstance(retrain, Mapping) else None
    if isinstance(idle, Mapping):
        mean = _positive(idle.get("mean")) or (0.0 if idle.get("mean") in (0, 0.0) else None)
        if mean is not None:  # 0 idle GPUs is evidence (of none); a missing or garbled mean is not
            cost = idle.get("costPerDay")
            cost_per_day = float(cost) if isinstance(cost, int | float) and math.isfinite(cost) else None
            out.append(WasteKind("idle", mean > 0, mean * 24.0, cost_per_day, None,
                                 f"{mean:.3g} allocated GPUs idle (< 5 % for ≥ 10 min) on average at the last "
                                 "retrain" if mean > 0 else "no allocated GPU stayed idle at the last retrain"))
    return tuple(out)


def waste_status(kinds: Sequence[WasteKind], currency: str) -> dict[str, Any] | None:
    if not kinds:
        return None
    rows = []
    for k in kinds:
        row: dict[str, Any] = {"kind": k.kind, "fired": k.fired, "gpuHoursPerDay": k.gpu_hours_per_day,
                               "message": k.message[:1024]}
        if k.cost_per_day is not None:
            row["costPerDay"] = k.cost_per_day
        if k.observed_hours is not None:
            row["observedHours"] = k.observed_hours
        rows.append(row)
    return {"currency": currency, "kinds": rows}
