"""Telemetry: the forecast gauges carry the horizon they look ahead (the dashboard shifts by it)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.telemetry import Telemetry
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.ports import FakeCluster, FakeMetrics, FakeModel

START = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)
LABELS = {"namespace": "ml", "scaler": "llm"}


def _record(horizon_steps: int, step_seconds: int, *, broken: bool = False) -> Telemetry:
    spec = ScalerSpec.from_dict({
        "target": {"name": "llm"}, "demand": {"query": "sum(rate(r[2m]))"},
        "capacity": {"requestsPerReplica": 10}, "horizonSeconds": horizon_steps * step_seconds,
        "model": {"stepSeconds": step_seconds, "recentWindowSeconds": 86400}})
    model = FakeModel(lambda t: 50.0, horizon_steps=horizon_steps, step_seconds=step_seconds)
    if broken:
        model.broken = "no model yet"
    reconciler = Reconciler(spec, FakeMetrics(lambda t: 50.0), model, FakeCluster(desired=5, ready=5, free_gpus=0),
                            FakeClock(START))
    result = reconciler.step(PlannerState())
    telemetry = Telemetry()
    telemetry.record("ml", "llm", spec, result, budget_gpus=0, budget_limit=None, duration_s=0.1, period_s=60)
    return telemetry


@pytest.mark.parametrize(("steps", "step_seconds", "horizon"), [(6, 300, 1800), (12, 300, 3600), (1, 600, 600)],
                         ids=["30-min", "60-min", "one-10-min-step"])
def test_the_horizon_gauge_is_how_far_the_forecast_looks(steps, step_seconds, horizon):
    telemetry = _record(steps, step_seconds)
    got = telemetry.registry.get_sample_value("predictive_scaler_forecast_horizon_seconds", LABELS)
    assert got == horizon
    assert telemetry.registry.get_sample_value("predictive_scaler_forecast_demand", {**LABELS, "quantile": "0.95"})


def test_no_forecast_no_horizon():
    telemetry = _record(6, 300, broken=True)
    assert telemetry.registry.get_sample_value("predictive_scaler_forecast_horizon_seconds", LABELS) is None
