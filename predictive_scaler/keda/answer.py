"""A reconcile's decision as KEDA's external scaler answer. Pure.

KEDA's HPA scales an external metric of type ``AverageValue``: replicas =
ceil(metric ÷ target), computed in milli-units from the fields the KEDA release reads
(docs/keda.md has the arithmetic of each release). The planner's demand and capacity are
floats, and the releases read them differently: 2.12–2.16 read only the integer fields
(``targetSize``, ``metricValue``), 2.17 and later the float ones, cut to milli-units.
So the answer is made of whole numbers that every release reads exactly:

- the **target** (GetMetricSpec) is one replica: ``targetSize`` 1 and ``targetSizeFloat`` 1.0;
- the **metric** (GetMetrics) is the replicas the plan provisions for, as a whole number in
  both fields: ceil(demand ÷ one replica's planned capacity), where the demand is, when
  predictive, the P95 over the pod lead time (× the intra-step peak factor), never below the
  demand observed now and never above the replicas the budget allowed; when reactive (no
  model, drift), the demand observed now — KEDA's HPA then applies the HPA rule the reactive
  planner applies; when a scheduled event is in force, at least its floor; when demand is
  missing, the replicas the planner holds, so a scaler never answers lower because data is
  missing;
- **active** (IsActive) while those replicas are above zero.

The answer is also what the status reports (``status.keda``, :meth:`KedaAnswer.to_status`), so
that any replica can serve it (:func:`answer_from_status`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from predictive_scaler.errors import ConfigError
from predictive_scaler.kube.workloads import WorkloadRef
from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec

#: Name of the one metric each scaler serves (KEDA prefixes it with the trigger index).
METRIC_NAME = "predicted-demand"

#: The target of every answer: one replica. Whole numbers survive every release's reading.
TARGET_REPLICAS = 1

#: Where the answer goes in the PredictiveScaler's status.
STATUS_FIELD = "keda"

#: A ratio within this of a whole number is that number (float noise in demand ÷ capacity).
_EPSILON = 1e-9


@dataclass(frozen=True)
class KedaAnswer:
    namespace: str
    name: str
    #: The replicas KEDA's HPA is to compute: the metric it is sent (the target is one replica).
    replicas: int
    #: The demand the plan provisions for, in the demand's unit (what ``replicas`` is made of).
    demand: float
    #: One replica's planned capacity, in the same unit.
    capacity: float
    unit: str
    decided_at: datetime
    strategy: str
    desired_replicas: int
    why: str
    #: The workload the scaler plans for: a ScaledObject using this answer must scale it.
    target: WorkloadRef

    @property
    def active(self) -> bool:
        return self.replicas > 0

    def to_status(self) -> dict[str, Any]:
        """The ``status.keda`` block: what another replica needs to give the same answer."""
        return {"replicas": int(self.replicas), "demand": float(self.demand), "capacity": float(self.capacity),
                "unit": self.unit, "decidedAt": self.decided_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "strategy": self.strategy, "desiredReplicas": int(self.desired_replicas), "why": self.why[:1024]}


def replicas_for(demand: float, capacity: float) -> int:
    """ceil(demand ÷ capacity), a ratio within float noise of a whole number counting as it."""
    if not (math.isfinite(demand) and demand > 0 and math.isfinite(capacity) and capacity > 0):
        return 0
    return max(0, math.ceil(demand / capacity - _EPSILON))


def workload_of(spec: ScalerSpec, namespace: str) -> WorkloadRef:
    t = spec.target
    return WorkloadRef(api_version=t.api_version, kind=t.kind, name=t.name, namespace=namespace)


def answer_for(decision: Decision, spec: ScalerSpec, *, namespace: str, name: str,
               decided_at: datetime) -> KedaAnswer:
    cap = spec.capacity_per_replica
    unit = spec.demand_unit
    held = decision.desired_replicas * cap
    now = decision.demand
    if now is None:
        value = held
        why = (f"demand missing: the {decision.desired_replicas} replicas the planner holds "
               "(never lower because data is missing)")
    elif decision.strategy == "predictive" and decision.forecast_pod_lead is not None:
        planned = decision.forecast_pod_lead * spec.demand.intra_step_peak_factor
        value = max(now, min(planned, max(held, now)))
        p = f"P{spec.quantile * 100:g}"
        why = (f"{p} over the next {spec.lead_times.pod_start_seconds} s is {planned:.4g} {unit}, demand now "
               f"{now:.4g} {unit}")
        if planned > held and held > now:
            why += f"; capped at the {decision.desired_replicas} replicas the budget and maxReplicas allow"
    else:
        value = now
        why = f"{decision.strategy}: the demand observed now, {now:.4g} {unit}"
    value = value if math.isfinite(value) and value > 0 else 0.0
    replicas = replicas_for(value, cap)
    if decision.scheduled_events and decision.desired_replicas > replicas:
        replicas, value = decision.desired_replicas, held
        why += f"; raised to {decision.desired_replicas} replicas for {', '.join(decision.scheduled_events)}"
    return KedaAnswer(namespace=namespace, name=name, replicas=int(replicas), demand=float(value),
                      capacity=float(cap), unit=unit, decided_at=decided_at, strategy=decision.strategy,
                      desired_replicas=decision.desired_replicas, why=f"{replicas} replicas: {why}",
                      target=workload_of(spec, namespace))


def answer_from_status(block: Mapping[str, Any], spec: ScalerSpec, *, namespace: str, name: str) -> KedaAnswer:
    """The answer another replica wrote to ``status.keda``; ConfigError when it cannot be read."""
    try:
        replicas = block["replicas"]
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas {replicas!r} is not a whole number ≥ 0")
        decided_at = datetime.fromisoformat(str(block["decidedAt"]).replace("Z", "+00:00"))
        if decided_at.tzinfo is None:
            raise ValueError("decidedAt has no UTC offset")
        return KedaAnswer(namespace=namespace, name=name, replicas=replicas, demand=float(block.get("demand", 0.0)),
                          capacity=float(block.get("capacity", spec.capacity_per_replica)),
                          unit=str(block.get("unit", spec.demand_unit)), decided_at=decided_at,
                          strategy=str(block.get("strategy", "")), desired_replicas=int(block.get("desiredReplicas",
                                                                                                     replicas)),
                          why=str(block.get("why", "")), target=workload_of(spec, namespace))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"PredictiveScaler {namespace}/{name}: status.{STATUS_FIELD} cannot be read ({exc})",
                          field=f"status.{STATUS_FIELD}") from exc
