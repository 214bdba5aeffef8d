"""The replicas each claimed KEDA release computes from this server's answers are the planner's.

KEDA's arithmetic is re-implemented below from its source, read at the release tags (kedacore/keda,
Apache-2.0; read, not copied):

- ``pkg/scalers/external_scaler.go`` at v2.12.0 … v2.16.1: ``GetMetricSpecForScaling`` makes the
  HPA's target with ``GetMetricTarget(s.metricType, spec.TargetSize)`` — the int64 field only;
  ``GetMetricsAndActivity`` sends ``GenerateMetricInMili(metricName, float64(metricResult.MetricValue))``
  — the int64 field only (the proto has no float fields before 2.17).
- the same file at v2.17.0 … v2.20.2: the target is ``GetMetricTargetMili(s.metricType,
  spec.TargetSizeFloat)`` when ``spec.TargetSizeFloat > 0``, else ``GetMetricTarget(…, spec.TargetSize)``;
  the value is ``MetricValueFloat`` when it is ``> 0``, else ``float64(MetricValue)``, then
  ``GenerateMetricInMili``.
- ``pkg/scalers/scaler.go``: ``GetMetricTarget`` is ``resource.NewQuantity(v, DecimalSI)`` (v whole
  units = 1000·v milli) at every tag; ``GetMetricTargetMili`` and ``GenerateMetricInMili`` are
  ``NewMilliQuantity(int64(v * 1000))`` up to v2.19.0 — Go's int64(float64) truncates toward zero —
  and from v2.20.0 ``resource.MustParse(fmt.Sprintf("%.3f", v))`` (``quantityFromFloat64``: rounded
  to the nearest milli; NaN, ±Inf and negatives are 0). ``GetMetricTargetType``: a trigger without
  ``metricType`` gets ``AverageValue``.
- ``controllers/keda/hpa.go`` ``getScaledObjectMetricSpecs``: the HPA's external metrics are those
  specs, as they are (the name prefixed ``s<index>-``).
- kubernetes/kubernetes ``pkg/controller/podautoscaler/replica_calculator.go``
  ``GetExternalPerPodMetricReplicas`` (the HPA's rule for an external ``AverageValue`` metric, given
  the target's ``MilliValue()`` and the metric values' ``MilliValue()``): usage = Σ values;
  ratio = usage ÷ (target × current replicas); outside the tolerance (0.1) the replicas are
  ceil(usage ÷ target), within it the current replicas stay.

The releases claimed are the tags in keda_scaledobject_schemas.json (derived from KEDA's repository
for the claimed range; SOURCE.md) — every release from 2.12.0 to 2.20.2.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda.answer import answer_for, replicas_for
from predictive_scaler.keda.server import metric_spec, metric_values
from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TAGS = sorted(json.loads((HERE / "fixtures" / "keda_scaledobject_schemas.json").read_text())["tags"],
              key=lambda t: tuple(int(p) for p in t[1:].split(".")))
NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
TOLERANCE = 0.1


def release(tag: str) -> tuple[int, int, int]:
    major, minor, patch = (int(p) for p in tag.lstrip("v").split("."))
    return major, minor, patch


def reads_floats(tag: str) -> bool:
    """metricValueFloat / targetSizeFloat exist and are read from 2.17.0 on (external_scaler.go at v2.17.0)."""
    return release(tag) >= (2, 17, 0)


def milli(tag: str, v: float) -> int:
    """A float as KEDA ``tag`` makes it a milli-quantity (GetMetricTargetMili, GenerateMetricInMili)."""
    if release(tag) >= (2, 20, 0):
        if math.isnan(v) or math.isinf(v) or v < 0:
            return 0
        return int(Decimal(f"{v:.3f}") * 1000)  # MustParse(Sprintf("%.3f")): correctly rounded, as Python's
    return math.trunc(v * 1000)  # NewMilliQuantity(int64(v * 1000))


def target_milli(tag: str, spec: Any) -> int:
    """The HPA's AverageValue target, in milli-units, as KEDA ``tag`` builds it from one MetricSpec."""
    if reads_floats(tag) and spec.targetSizeFloat > 0:
        return milli(tag, spec.targetSizeFloat)  # GetMetricTargetMili
    return spec.targetSize * 1000  # GetMetricTarget: NewQuantity(targetSize)


def value_milli(tag: str, value: Any) -> int:
    """The metric value KEDA ``tag`` hands the HPA, in milli-units (GenerateMetricInMili)."""
    v = float(value.metricValue)
    if reads_floats(tag) and value.metricValueFloat > 0:
        v = value.metricValueFloat
    return milli(tag, v)


def hpa_replicas(usage_milli: int, target: int, current: int) -> int:
    """GetExternalPerPodMetricReplicas."""
    ratio = usage_milli / (target * current)
    if abs(1.0 - ratio) > TOLERANCE:
        return math.ceil(usage_milli / target)
    return current


def keda_replicas(tag: str, spec_response: Any, values_response: Any, current: int) -> int:
    [spec] = spec_response.metricSpecs
    usage = sum(value_milli(tag, v) for v in values_response.metricValues)
    return hpa_replicas(usage, target_milli(tag, spec), current)


def intended(replicas: int, current: int) -> int:
    """The HPA's own rule applied to the planner's replicas: what an exact answer makes it do."""
    return current if abs(1.0 - replicas / current) <= TOLERANCE else replicas


@dataclass(frozen=True)
class Case:
    id: str
    capacity: dict[str, Any]
    gpus_per_replica: int
    kind: str
    decision: Decision
    replicas: int


def reactive(demand: float | None, desired: int = 1) -> Decision:
    return Decision(desired_replicas=desired, placeholder_gpus=0, strategy="reactive" if demand is not None else "hold",
                    speculative_gpus=0, speculative_cost_per_hour=None, limits=(), reasons=(), demand=demand,
                    forecast_pod_lead=None, scheduled_events=())


def predictive(demand: float, p95: float, desired: int) -> Decision:
    return Decision(desired_replicas=desired, placeholder_gpus=0, strategy="predictive", speculative_gpus=0,
                    speculative_cost_per_hour=None, limits=(), reasons=(), demand=demand, forecast_pod_lead=p95,
                    scheduled_events=())


REQ, GPU = "requests", "dcgm-busy-gpus"
CASES = [
    # The four that the integer fields of 2.12–2.16 got wrong with the answer in demand units, or that
    # 2.17–2.20's milli-units got wrong (truncated, from 2.20 rounded): the old answer gave 6, 4, 5 and 3.
    Case("gpu-0.7x1-5.2-busy", {"gpuUtilizationTarget": 0.7}, 1, GPU, reactive(5.2), 8),
    Case("0.5-rps-per-replica-3.1-rps", {"requestsPerReplica": 0.5}, 1, REQ, reactive(3.1), 7),
    Case("2.5-rps-round-half-even", {"requestsPerReplica": 2.5}, 1, REQ, reactive(10.0), 4),
    Case("1-rps-3.0004-rps-milli-truncation", {"requestsPerReplica": 1}, 1, REQ, reactive(3.0004), 4),
    # docs/keda.md's table (and tests/keda/test_answer.py's).
    Case("p95-55-cap-10", {"requestsPerReplica": 10}, 1, REQ, predictive(30.0, 55.0, 6), 6),
    Case("budget-cap", {"requestsPerReplica": 10}, 1, REQ, predictive(30.0, 95.0, 6), 6),
    Case("hold-5-demand-missing", {"requestsPerReplica": 10}, 1, REQ, reactive(None, desired=5), 5),
    Case("gpu-0.7x2-p95-3.9", {"gpuUtilizationTarget": 0.7}, 2, GPU, predictive(2.0, 3.9, 3), 3),
    Case("idle", {"requestsPerReplica": 10}, 1, REQ, reactive(0.0, desired=0), 0),
]


def spec_of(case: Case) -> ScalerSpec:
    demand: dict[str, Any] = {"kind": case.kind} if case.kind == GPU else {"query": "q"}
    return ScalerSpec.from_dict({"mode": "keda", "target": {"name": "llm"}, "demand": demand,
                                 "gpusPerReplica": case.gpus_per_replica, "capacity": case.capacity,
                                 "maxReplicas": 50})


def old_answer(demand: float, capacity: float) -> tuple[Any, Any]:
    """The answer before the whole-replica shape: the demand and one replica's capacity, rounded for 2.12–2.16."""
    return (pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
                metricName="predicted-demand", targetSizeFloat=capacity, targetSize=max(1, round(capacity)))]),
            pb.GetMetricsResponse(metricValues=[pb.MetricValue(
                metricName="predicted-demand", metricValueFloat=demand, metricValue=math.ceil(demand))]))


def test_the_claimed_releases_are_every_tag_from_2_12_to_2_20_and_the_docs_say_so() -> None:
    assert TAGS[0] == "v2.12.0" and TAGS[-1] == "v2.20.2" and len(TAGS) == 22
    assert [t for t in TAGS if not reads_floats(t)][-1] == "v2.16.1"
    docs = (ROOT / "docs" / "keda.md").read_text()
    assert "KEDA 2.12.0 to 2.20.2" in docs
    assert re.search(r"2\.12[–-]2\.16.*integer", docs) and re.search(r"2\.17.*float", docs)


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_claimed_release_computes_the_planners_replicas(tag: str, case: Case) -> None:
    answer = answer_for(case.decision, spec_of(case), namespace="ml", name="llm", decided_at=NOW)
    assert answer.replicas == case.replicas
    for current in (1, 2, 3, 5, 8, 13, 40):
        assert keda_replicas(tag, metric_spec(), metric_values("predicted-demand", answer), current) == \
            intended(case.replicas, current), (tag, current)


@pytest.mark.parametrize(("case", "tag", "wrong"), [
    (CASES[0], "v2.12.0", 6), (CASES[1], "v2.16.1", 4), (CASES[2], "v2.14.0", 5), (CASES[3], "v2.17.0", 3),
    (CASES[3], "v2.20.2", 3)], ids=["gpu-0.7", "0.5-rps", "round-half-even", "truncation-2.17", "rounding-2.20"])
def test_the_model_reproduces_what_the_old_answer_got_wrong(case: Case, tag: str, wrong: int) -> None:
    """The re-implementation is checked against the failures seen with the old answer, so a model
    that always agreed could not pass."""
    answer = answer_for(case.decision, spec_of(case), namespace="ml", name="llm", decided_at=NOW)
    spec, values = old_answer(answer.demand, answer.capacity)
    assert keda_replicas(tag, spec, values, current=1) == wrong != case.replicas


@given(demand=st.floats(0, 5_000), capacity=st.floats(0.01, 500), tag=st.sampled_from(TAGS),
       current=st.integers(1, 200))
def test_any_demand_and_capacity_on_any_claimed_release(demand: float, capacity: float, tag: str,
                                                        current: int) -> None:
    spec = ScalerSpec.from_dict({"mode": "keda", "target": {"name": "llm"}, "demand": {"query": "q"},
                                 "capacity": {"requestsPerReplica": capacity}, "maxReplicas": 1000})
    answer = answer_for(reactive(demand), spec, namespace="ml", name="llm", decided_at=NOW)
    assert answer.replicas == replicas_for(demand, spec.capacity_per_replica)
    assert keda_replicas(tag, metric_spec(), metric_values("predicted-demand", answer), current) == \
        intended(answer.replicas, current)


def test_milli_units_are_truncated_up_to_2_19_and_rounded_from_2_20() -> None:
    assert (milli("v2.19.0", 2.9996), milli("v2.20.0", 2.9996)) == (2999, 3000)
    assert milli("v2.17.0", 0.7) == milli("v2.20.2", 0.7) == 700
