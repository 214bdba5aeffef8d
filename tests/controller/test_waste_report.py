"""GPU waste surfaced by the controller: the waste.py detectors on what it already reads (the dcgm-busy-gpus
guard's serving history, the retraining job's idle-GPU report), as status.waste, as
predictive_scaler_waste_gpu_hours{kind} / _waste_cost{kind}, and on the dashboard. A kind without evidence
is left out, never reported as 0."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from predictive_scaler.controller.status import WASTE_EVIDENCE, waste_report, waste_status
from predictive_scaler.controller.telemetry import Telemetry
from predictive_scaler.metrics_catalog import exported_series_names
from predictive_scaler.policy.saturation import ServingHistory
from predictive_scaler.series import Series
from tests.controller.test_demand_guard import replay
from tests.support.fakes.apiserver import FakeApiServer

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "dashboards" / "predictive-scaler.json"
IDLE = {"retrain": {"idleGpus": {"mean": 0.5, "costPerDay": 30.0, "currency": "USD"}}}


def _ladder_history(name: str) -> ServingHistory:
    from benchmarks.gpu_ladders import ladder_series
    s = ladder_series(name, 15, 5)
    ones = Series(np.ones(len(s.served)), s.served.start, 5)
    return ServingHistory(s.served, ones, s.gpu_util, s.mean_latency)


def test_each_kind_needs_its_evidence() -> None:
    assert set(WASTE_EVIDENCE) == {"cpu-bound", "saturated-at-low-load", "kv-cache-pressure", "idle"}
    assert waste_report(None, {}, price_per_gpu_hour=2.0, currency="USD") == ()
    only_idle = waste_report(None, IDLE, price_per_gpu_hour=2.0, currency="USD")
    assert [(w.kind, w.fired, w.gpu_hours_per_day, w.cost_per_day) for w in only_idle] == [("idle", True, 12.0, 30.0)]
    batched = {w.kind: w for w in waste_report(_ladder_history("decoder-batched"), IDLE, price_per_gpu_hour=2.0,
                                               currency="USD")}
    assert set(batched) == {"cpu-bound", "saturated-at-low-load", "idle"}  # never kv-cache-pressure here
    pinned = batched["saturated-at-low-load"]
    assert pinned.fired and pinned.gpu_hours_per_day > 0 and pinned.cost_per_day == 2.0 * pinned.gpu_hours_per_day
    assert not batched["cpu-bound"].fired
    serial = {w.kind: w for w in waste_report(_ladder_history("encoder-serial"), None, price_per_gpu_hour=None,
                                              currency="USD")}
    assert serial["cpu-bound"].fired and serial["cpu-bound"].cost_per_day is None
    status = waste_status(tuple(serial.values()), "USD")
    assert status is not None and {r["kind"] for r in status["kinds"]} == set(serial)
    assert all("costPerDay" not in r for r in status["kinds"])


def test_the_guarded_controller_reports_the_waste_it_can_compute(fake_api: FakeApiServer, tmp_path: Path) -> None:
    world = replay(fake_api, tmp_path / "models", "decoder-batched", guarded=True, replicas=2)
    last = world.periods[-1]
    kinds = {r["kind"]: r for r in last.status["waste"]["kinds"]}
    assert kinds["saturated-at-low-load"]["fired"] and kinds["saturated-at-low-load"]["gpuHoursPerDay"] > 0
    assert "idle" not in kinds and "kv-cache-pressure" not in kinds  # no retrain report, no KV-cache series
    hours = world.metric("predictive_scaler_waste_gpu_hours", kind="saturated-at-low-load")
    assert hours == kinds["saturated-at-low-load"]["gpuHoursPerDay"]
    assert world.metric("predictive_scaler_waste_gpu_hours", kind="idle") is None


def test_a_kind_that_loses_its_evidence_is_removed_from_the_metrics() -> None:
    telemetry = Telemetry()
    kinds = waste_report(None, IDLE, price_per_gpu_hour=2.0, currency="EUR")
    telemetry.capacity_and_waste("ml", "llm", None, kinds, "EUR")
    get = telemetry.registry.get_sample_value
    assert get("predictive_scaler_waste_gpu_hours", {"namespace": "ml", "scaler": "llm", "kind": "idle"}) == 12.0
    assert get("predictive_scaler_waste_cost", {"namespace": "ml", "scaler": "llm", "kind": "idle",
                                                "currency": "EUR"}) == 30.0
    telemetry.capacity_and_waste("ml", "llm", None, (), "EUR")
    assert get("predictive_scaler_waste_gpu_hours", {"namespace": "ml", "scaler": "llm", "kind": "idle"}) is None
    assert get("predictive_scaler_waste_cost", {"namespace": "ml", "scaler": "llm", "kind": "idle",
                                                "currency": "EUR"}) is None


def test_the_dashboard_shows_waste_and_learned_capacity_from_exported_metrics() -> None:
    panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
    exprs = {title: " ".join(t["expr"] for t in p.get("targets", [])) for title, p in panels.items()}
    waste = next(e for t, e in exprs.items() if "waste" in t.lower() and "GPU" in t)
    capacity = next(e for t, e in exprs.items() if "learned" in t.lower())
    assert "predictive_scaler_waste_gpu_hours" in waste and "predictive_scaler_waste_cost" in waste
    assert "predictive_scaler_learned_capacity" in capacity and "predictive_scaler_capacity_per_replica" in capacity
    names = exported_series_names()
    for metric in ("predictive_scaler_waste_gpu_hours", "predictive_scaler_waste_cost",
                   "predictive_scaler_learned_capacity", "predictive_scaler_capacity_per_replica"):
        assert metric in names
