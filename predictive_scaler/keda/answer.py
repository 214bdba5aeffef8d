"""A reconcile's decision as KEDA's external scaler answer. Pure.

KEDA's HPA scales an external metric of type ``AverageValue``: replicas =
ceil(metric ÷ target). So that it computes the replicas the planner would:

- the **target** (GetMetricSpec) is one replica's planned capacity in the demand's
  unit — ``capacity.requestsPerReplica`` (already the per-replica rate at the SLO), or
  ``gpuUtilizationTarget × gpusPerReplica`` busy GPUs;
- the **metric** (GetMetrics) is the demand the plan provisions for: when predictive,
  the P95 over the pod lead time (× the intra-step peak factor), never below the
  demand observed now and never above the replicas the budget allowed; when reactive
  (no model, drift), the demand observed now — KEDA's HPA then applies the HPA rule
  the reactive planner applies; when a scheduled event is in force, at least its
  floor; when demand is missing, the capacity of the replicas the planner holds, so a
  scaler never answers lower because data is missing;
- **active** (IsActive) while that metric is above zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec

#: Name of the one metric each scaler serves (KEDA prefixes it with the trigger index).
METRIC_NAME = "predicted-demand"

#: A floor given as replicas × capacity is shaved by this fraction, so ceil(metric ÷ target)
#: is that many replicas and not one more because of float rounding.
_SHAVE = 1e-9


@dataclass(frozen=True)
class KedaAnswer:
    namespace: str
    name: str
    #: The demand the plan provisions for (GetMetrics), in the demand's unit.
    metric_value: float
    #: One replica's planned capacity (GetMetricSpec), in the same unit.
    target_size: float
    unit: str
    decided_at: datetime
    strategy: str
    desired_replicas: int
    why: str

    @property
    def active(self) -> bool:
        return self.metric_value > 0

    @property
    def replicas(self) -> int:
        """What KEDA's HPA computes from this answer (before its own min/max and behaviour)."""
        return max(0, math.ceil(self.metric_value / self.target_size - 1e-9))


def answer_for(decision: Decision, spec: ScalerSpec, *, namespace: str, name: str,
               decided_at: datetime) -> KedaAnswer:
    cap = spec.capacity_per_replica
    unit = spec.demand_unit
    held = decision.desired_replicas * cap * (1 - _SHAVE)
    now = decision.demand
    if now is None:
        value = held
        why = (f"demand missing: the capacity of the {decision.desired_replicas} replicas the planner holds "
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
    if decision.scheduled_events and held > value:
        value = held
        why += f"; raised to {decision.desired_replicas} replicas for {', '.join(decision.scheduled_events)}"
    value = value if math.isfinite(value) and value > 0 else 0.0
    return KedaAnswer(namespace=namespace, name=name, metric_value=float(value), target_size=float(cap),
                      unit=unit, decided_at=decided_at, strategy=decision.strategy,
                      desired_replicas=decision.desired_replicas, why=why)
