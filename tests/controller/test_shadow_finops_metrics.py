"""The shadow and FinOps series a reconcile records (docs/shadow.md, docs/finops.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.finops import node_pool, price_for
from predictive_scaler.controller.telemetry import Telemetry
from predictive_scaler.metrics_catalog import NAMES
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.ports import FakeCluster, FakeMetrics, FakeModel

START = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)
LABELS = {"namespace": "ml", "scaler": "llm"}


def _spec(**extra: object) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"}, "demand": {"query": "sum(rate(r[2m]))"}, "mode": "forecast-only",
        "capacity": {"requestsPerReplica": 10}, "gpusPerReplica": 2,
        "prewarm": {"nodeSelector": {"karpenter.sh/nodepool": "h100"}, "budget": {"pricePerGpuHour": 3.0}},
        **extra})


def _recorded(telemetry: Telemetry, live: tuple[tuple[str, str], ...], team: str = "search") -> None:
    spec = _spec()
    reconciler = Reconciler(spec, FakeMetrics(lambda t: 50.0), FakeModel(lambda t: 50.0),
                            FakeCluster(desired=3, ready=2, free_gpus=0), FakeClock(START))
    result = reconciler.step(PlannerState())
    telemetry.record("ml", "llm", spec, result, budget_gpus=0, budget_limit=None, duration_s=0.1, period_s=60,
                     live=live, team=team)


def test_forecast_only_records_the_live_autoscaler_beside_its_own_decision():
    telemetry = Telemetry()
    _recorded(telemetry, (("HorizontalPodAutoscaler", "llm-hpa"),))
    value = telemetry.registry.get_sample_value
    assert value("predictive_scaler_target_replicas", LABELS) == 3
    assert value("predictive_scaler_current_replicas", LABELS) == 2
    assert value("predictive_scaler_gpus_per_replica", LABELS) == 2
    assert value("predictive_scaler_desired_replicas", LABELS) is not None
    assert value("predictive_scaler_planned_placeholder_gpus", LABELS) is not None
    assert value("predictive_scaler_live_autoscaler",
                 {**LABELS, "kind": "HorizontalPodAutoscaler", "autoscaler": "llm-hpa"}) == 1
    _recorded(telemetry, ())  # the HPA was deleted: its series goes
    assert value("predictive_scaler_live_autoscaler",
                 {**LABELS, "kind": "HorizontalPodAutoscaler", "autoscaler": "llm-hpa"}) is None


def test_billed_gpu_hours_and_cost_count_what_the_target_holds():
    telemetry = Telemetry()
    _recorded(telemetry, ())
    _recorded(telemetry, ())
    where = {**LABELS, "team": "search", "node_pool": "h100"}
    value = telemetry.registry.get_sample_value
    # 3 replicas × 2 GPUs for two 60-s periods, nothing held as placeholders in forecast-only.
    assert value("predictive_scaler_gpu_hours_billed_total", where) == 2 * 6 * 60 / 3600
    assert value("predictive_scaler_gpu_cost_total", {**where, "currency": "USD"}) == 2 * 6 * 60 / 3600 * 3.0
    assert value("predictive_scaler_gpu_hours_used_total", where) == 0  # requests demand: DCGM not read
    assert value("predictive_scaler_gpu_price_per_hour", {**LABELS, "currency": "USD", "source": "spec"}) == 3.0
    _recorded(telemetry, (), team="ads")  # a relabelled namespace moves the series
    assert value("predictive_scaler_gpu_hours_billed_total", where) is None


def test_the_node_pool_and_the_price_come_from_the_known_labels_and_opencost_first():
    assert node_pool({"cloud.google.com/gke-nodepool": "a100"}) == "a100"
    assert node_pool({"karpenter.sh/nodepool": "h100", "cloud.google.com/gke-nodepool": "x"}) == "h100"
    assert node_pool({}) == ""
    assert price_for(_spec(), 2.25).source == "opencost" and price_for(_spec(), None).per_gpu_hour == 3.0


def test_every_new_series_is_in_the_catalogue():
    assert {"predictive_scaler_target_replicas", "predictive_scaler_planned_placeholder_gpus",
            "predictive_scaler_live_autoscaler", "predictive_scaler_gpu_hours_billed_total",
            "predictive_scaler_gpu_hours_used_total", "predictive_scaler_gpu_cost_total",
            "predictive_scaler_gpu_price_per_hour"} <= NAMES
