"""capacity.learned: serve through the controller: the capacity learned at the SLO (status.retrain.learnedCapacity)
moves planning, at most ×2/÷2 per retrain, never under requestsPerReplica on a lower bound; the value in use is
kept in status.capacity, so a restart changes nothing. ``report`` only reports.

Driven as kopf would (tests/reliability/harness.py's World: the fake API server, an injected clock), with a
steady demand of 100 req/s and no model, so each decision is the reactive one: ceil(100 ÷ capacity).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from predictive_scaler.controller.status import capacity_in_use, planned_spec
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.spec import ScalerSpec
from tests.reliability.harness import World
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics

START = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
DEMAND = 100.0
FLOOR = 10.0


def spec(learned: str = "serve") -> dict[str, Any]:
    return {
        "mode": "scale",
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "demand": {"kind": "requests", "preset": "vllm"},
        "capacity": {"requestsPerReplica": FLOOR, "learned": learned, "slo": {"noWaiting": True}},
        "minReplicas": 1, "maxReplicas": 30,
        "reactive": {"scaleDownStabilizationSeconds": 0},
        "prewarm": {"enabled": False},
        "model": {"name": "llm"},
    }


def retrained(world: World, kind: str, value: float, run: str = "r1") -> None:
    """What the retraining job writes: status.retrain with the capacity it learned."""
    obj = world.scaler()
    status = dict(obj.get("status") or {})
    status["retrain"] = {"runId": run, "time": "2026-12-07T08:00:00Z", "result": "kept", "reason": "test",
                         "learnedCapacity": {"kind": kind, "perReplica": value, "low": value,
                                             "high": value * 1.1 if kind == "point" else None,
                                             "unit": "requests/s", "slo": "no waiting", "explanation": "test"}}
    obj["status"] = status
    world.fake_api.put(obj)


@pytest.fixture
def world(fake_api: FakeApiServer, tmp_path: Path) -> World:
    return make(fake_api, tmp_path, spec())


def make(fake_api: FakeApiServer, tmp_path: Path, body: dict[str, Any]) -> World:
    return World(fake_api, ModelStore(tmp_path / "models"), "http://127.0.0.1:9", START, body, replicas=10,
                 metrics=FakeMetrics(lambda t: DEMAND))


def planned(world: World) -> tuple[int, dict[str, Any]]:
    period = world.periods[-1]
    assert period.result is not None and period.result.decision.strategy == "reactive", period
    return period.scale_replicas, dict(period.status["capacity"])


def test_a_learned_point_moves_planning_and_survives_a_restart(world: World) -> None:
    world.run(2)
    replicas, cap = planned(world)
    assert replicas == 10 and cap["serving"] == FLOOR and cap["source"] == "configured", cap
    retrained(world, "point", 20.0)
    world.run(2)
    replicas, cap = planned(world)
    assert replicas == math.ceil(DEMAND / 20.0), replicas
    assert (cap["serving"], cap["learned"], cap["kind"], cap["source"]) == (20.0, 20.0, "point", "learned"), cap
    assert world.metric("predictive_scaler_learned_capacity", kind="point") == 20.0
    assert world.metric("predictive_scaler_capacity_per_replica") == 20.0
    learned_events = [e for p in world.periods for e in p.events if e.reason == "CapacityLearned"]
    assert len(learned_events) == 1 and "20" in learned_events[0].message
    since = cap["since"]
    world.restart()
    world.run(2)
    replicas, cap = planned(world)
    assert replicas == 5 and cap["serving"] == 20.0 and cap["since"] == since, cap


def test_a_jump_of_five_times_is_taken_at_most_twice_per_retrain(world: World) -> None:
    world.run(1)
    retrained(world, "point", 50.0)
    world.run(3)  # reconciles repeat: the same learned value is applied once
    replicas, cap = planned(world)
    assert cap["serving"] == 2 * FLOOR and cap["learned"] == 50.0, cap
    assert replicas == math.ceil(DEMAND / 20.0)
    assert "at most ×2" in cap["reason"]
    retrained(world, "point", 50.5, run="r2")  # the next week's retrain learns about the same
    world.run(1)
    replicas, cap = planned(world)
    assert cap["serving"] == 40.0 and replicas == math.ceil(DEMAND / 40.0), cap


def test_a_lower_bound_below_the_floor_is_ignored(world: World) -> None:
    world.run(1)
    retrained(world, "lower-bound", 4.0)
    world.run(2)
    replicas, cap = planned(world)
    assert cap["serving"] == FLOOR and cap["kind"] == "lower-bound" and replicas == 10, cap
    assert "floor stands" in cap["reason"]
    assert world.metric("predictive_scaler_learned_capacity", kind="lower-bound") == 4.0
    assert not [e for p in world.periods for e in p.events if e.reason == "CapacityLearned"]


def test_report_only_reports(fake_api: FakeApiServer, tmp_path: Path) -> None:
    world = make(fake_api, tmp_path, spec("report"))
    world.run(1)
    retrained(world, "point", 20.0)
    world.run(2)
    replicas, cap = planned(world)
    assert replicas == 10 and cap["serving"] == FLOOR and cap["learned"] == 20.0 and cap["source"] == "configured"
    assert world.metric("predictive_scaler_learned_capacity", kind="point") == 20.0
    assert world.metric("predictive_scaler_capacity_per_replica") == FLOOR


# -- the pure decision ---------------------------------------------------------------------------

def _parsed(learned: str = "serve", floor: float = FLOOR) -> ScalerSpec:
    body = spec(learned)
    body["capacity"] = {**body["capacity"], "requestsPerReplica": floor}
    return ScalerSpec.from_dict(body)


def _status(kind: str, value: float, capacity: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"retrain": {"learnedCapacity": {"kind": kind, "perReplica": value}}}
    if capacity is not None:
        out["capacity"] = capacity
    return out


def test_capacity_in_use_is_decided_from_the_status_alone() -> None:
    now = START
    first = capacity_in_use(_parsed(), _status("point", 80.0), now)
    assert first is not None and first.serving == 20.0
    again = capacity_in_use(_parsed(), _status("point", 80.0, first.to_status()), now)
    assert again is not None and again.serving == 20.0  # the same learning is not applied twice
    changed_floor = capacity_in_use(_parsed(floor=30.0), _status("point", 80.0, first.to_status()), now)
    assert changed_floor is not None and changed_floor.serving == 60.0  # a new requestsPerReplica starts again
    assert capacity_in_use(ScalerSpec.from_dict({**spec(), "capacity": {"requestsPerReplica": 5}}), {}, now) is None
    garbage = {"retrain": {"learnedCapacity": {"kind": "point", "perReplica": "NaN"}}}
    none_yet = capacity_in_use(_parsed(), garbage, now)
    assert none_yet is not None and none_yet.serving == FLOOR and none_yet.learned is None
    assert planned_spec(_parsed(), first).capacity_per_replica == 20.0
    assert planned_spec(_parsed(), none_yet) == _parsed()


def test_the_retrain_report_shows_the_learned_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    from predictive_scaler.commands.retrain import _print_report
    from predictive_scaler.retrain.job import RetrainReport
    from predictive_scaler.retrain.outcome import ScalerOutcome, learned_capacity_record

    bound = learned_capacity_record("lower-bound", 126.0, 126.0, float("inf"), "requests/s", "no waiting", "why")
    outcome = ScalerOutcome(key="ml/llm", model="llm", result="kept", reason="r", run_id="run",
                            learned_capacity=bound)
    report = RetrainReport("run", START, 0, 1, 1, (outcome,), 0.1)
    _print_report(report)
    assert "learned capacity at no waiting: lower-bound 126 requests/s per replica (interval 126–∞)" in \
        capsys.readouterr().out
    assert report.to_dict()["scalers"][0]["learned_capacity"]["value"] == 126.0
    assert outcome.status(START)["learnedCapacity"]["perReplica"] == 126.0
