"""The decision → KEDA answer mapping (pure), which autoscalers are KEDA acting for a scaler, and the board."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import ConfigError
from predictive_scaler.keda.answer import answer_for, answer_from_status
from predictive_scaler.keda.board import KedaBoard
from predictive_scaler.keda.ownership import foreign
from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
SPEC = ScalerSpec.from_dict({"mode": "keda", "target": {"name": "llm"}, "demand": {"query": "q"},
                             "capacity": {"requestsPerReplica": 10}, "maxReplicas": 20})


def decision(strategy: str = "predictive", desired: int = 6, demand: float | None = 30.0,
             q_pod: float | None = 55.0, events: tuple[str, ...] = ()) -> Decision:
    return Decision(desired_replicas=desired, placeholder_gpus=0, strategy=strategy, speculative_gpus=0,
                    speculative_cost_per_hour=None, limits=(), reasons=(), demand=demand,
                    forecast_pod_lead=q_pod if strategy == "predictive" else None, scheduled_events=events)


@pytest.mark.parametrize(("d", "value", "replicas"), [
    (decision(), 55.0, 6),                                   # the P95 over the pod lead time
    (decision(desired=3, q_pod=20.0), 30.0, 3),              # never below the demand observed now
    (decision(desired=6, q_pod=95.0), 60.0, 6),              # capped at what the budget allowed
    (decision("reactive", desired=4), 30.0, 3),              # reactive: demand now; KEDA's HPA does the rest
    (decision("hold", desired=5, demand=None), 50.0, 5),     # missing demand: the held replicas, never fewer
    (decision("reactive", desired=5, demand=None), 50.0, 5),
    (decision("reactive", desired=12, events=("launch",)), 120.0, 12),  # a scheduled event's floor
    (decision(desired=0, demand=0.0, q_pod=0.0), 0.0, 0),
], ids=["p95", "demand-now-floor", "budget-cap", "reactive", "hold", "reactive-missing", "event", "idle"])
def test_the_answer_is_the_replicas_the_planner_provisions_for(d: Decision, value: float, replicas: int) -> None:
    a = answer_for(d, SPEC, namespace="ml", name="llm", decided_at=NOW)
    assert a.capacity == 10.0
    assert a.demand == pytest.approx(value, rel=1e-6)
    assert a.replicas == replicas == max(0, math.ceil(a.demand / a.capacity - 1e-9))
    assert a.active is (value > 0)
    assert a.why.startswith(f"{replicas} replicas: ")
    assert (a.target.kind, a.target.name, a.target.namespace) == ("Deployment", "llm", "ml")
    if d.demand is not None:
        assert a.demand >= d.demand
    # What the status carries gives back the same answer on another replica.
    again = answer_from_status(a.to_status(), SPEC, namespace="ml", name="llm")
    assert (again.replicas, again.decided_at, again.target, again.active) == (a.replicas, NOW, a.target, a.active)


@pytest.mark.parametrize("block", [{}, {"replicas": -1, "decidedAt": "2025-03-03T12:00:00Z"},
                                   {"replicas": 2.5, "decidedAt": "2025-03-03T12:00:00Z"},
                                   {"replicas": True, "decidedAt": "2025-03-03T12:00:00Z"},
                                   {"replicas": 2, "decidedAt": "yesterday"},
                                   {"replicas": 2, "decidedAt": "2025-03-03T12:00:00"}],
                         ids=["empty", "negative", "fraction", "bool", "not-a-time", "no-offset"])
def test_a_status_block_that_cannot_be_read_says_so(block: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        answer_from_status(block, SPEC, namespace="ml", name="llm")
    assert "status.keda cannot be read" in str(info.value)


def test_busy_gpu_demand_targets_one_replicas_busy_gpus() -> None:
    spec = ScalerSpec.from_dict({"mode": "keda", "target": {"name": "llm"}, "demand": {"kind": "dcgm-busy-gpus"},
                                 "gpusPerReplica": 2, "capacity": {"gpuUtilizationTarget": 0.7}})
    a = answer_for(decision(desired=3, demand=2.0, q_pod=3.9), spec, namespace="ml", name="llm", decided_at=NOW)
    assert (a.capacity, a.unit, a.replicas) == (pytest.approx(1.4), "busy GPUs", 3)


@dataclass(frozen=True)
class Found:
    kind: str
    name: str
    external_scalers: tuple[str, ...] = ()
    owner_scaled_object: str | None = None


@pytest.mark.parametrize(("found", "left"), [
    ([Found("ScaledObject", "so", ("llm",)), Found("HorizontalPodAutoscaler", "keda-hpa-so", (), "so")], []),
    ([Found("ScaledObject", "so", ("other",)), Found("HorizontalPodAutoscaler", "keda-hpa-so", (), "so")],
     ["so", "keda-hpa-so"]),
    ([Found("ScaledObject", "so", ("llm",)), Found("HorizontalPodAutoscaler", "hand-made")], ["hand-made"]),
    ([Found("ScaledObject", "so", ("llm",)), Found("ScaledObject", "second")], ["second"]),
], ids=["ours-and-its-hpa", "another-scalers", "a-foreign-hpa", "a-second-scaledobject"])
def test_foreign_autoscalers(found: list[Found], left: list[str]) -> None:
    assert [a.name for a in foreign(found, "llm")] == left


def test_the_board_answers_fresh_decisions_only() -> None:
    clock = FakeClock(NOW)
    board = KedaBoard(clock, stale_after_seconds=300)
    assert board.lookup("ml", "llm").code == "unavailable"
    board.publish(answer_for(decision(), SPEC, namespace="ml", name="llm", decided_at=NOW))
    found: Any = board.lookup("ml", "llm")
    assert found.code == "ok" and found.answer.replicas == 6
    clock.advance(301)
    assert board.lookup("ml", "llm").code == "unavailable"
    assert "301 s old" in board.lookup("ml", "llm").message
    assert board.lookup("ml", "llm", stale_ok=True).code == "ok"
    board.withdraw("ml", "llm", "paused")
    assert board.lookup("ml", "llm").code == "failed-precondition"
    clock.advance(301)  # a withdrawal ages out too: a process that stopped reconciling it stops refusing it
    assert board.lookup("ml", "llm").code == "unavailable"
    board.withdraw("ml", "llm", "paused")
    board.publish(answer_for(decision(), SPEC, namespace="ml", name="llm", decided_at=clock.now()))
    assert board.lookup("ml", "llm").code == "ok"
    version = board.version
    assert board.wait(version, timeout=0.01) == version  # nothing changed: times out
    board.withdraw("ml", "llm", None)
    assert board.version != version and board.lookup("ml", "llm").code == "unavailable"
    assert clock.now() - NOW == timedelta(seconds=602)


def test_streams_beyond_the_limit_are_refused_and_polling_still_answers() -> None:
    import grpc

    from predictive_scaler.keda import externalscaler_pb2 as pb
    from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
    from predictive_scaler.keda.server import KedaServer

    clock = FakeClock(NOW)
    board = KedaBoard(clock, stale_after_seconds=300)
    board.publish(answer_for(decision(), SPEC, namespace="ml", name="llm", decided_at=NOW))
    server = KedaServer(board, "127.0.0.1", 0, workers=4, polling_workers=2).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        stub = pb_grpc.ExternalScalerStub(channel)
        ref = pb.ScaledObjectRef(name="so", namespace="ml", scalerMetadata={"scalerName": "llm"})
        streams = [stub.StreamIsActive(ref, timeout=10) for _ in range(2)]
        assert [next(s).result for s in streams] == [True, True]
        with pytest.raises(grpc.RpcError) as info:
            next(stub.StreamIsActive(ref, timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.IsActive(ref, timeout=5).result is True
        # A change reaches the open streams.
        board.publish(answer_for(decision(desired=0, demand=0.0, q_pod=0.0), SPEC, namespace="ml", name="llm",
                                 decided_at=NOW))
        assert [next(s).result for s in streams] == [False, False]
        for s in streams:
            s.cancel()
    finally:
        channel.close()
        server.stop()
