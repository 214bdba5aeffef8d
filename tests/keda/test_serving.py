"""The gRPC server's answers and errors, from this process's decisions or the scalers' status, over real gRPC.

A fake API (scaler objects with their status, the namespace's ScaledObjects) stands behind the
ports the server is given (``get_scaler``, the ScaledObject list); the client is the committed
stubs (generated from the proto tests/keda/test_proto.py shows is KEDA's). Two servers over one
API show the high-availability story (one stops, the other keeps answering) and sharding (each
process decides some scalers, both answer all).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import NotFoundError, ServerError
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.answer import METRIC_NAME, answer_for
from predictive_scaler.keda.board import KedaBoard
from predictive_scaler.keda.server import KedaServer
from predictive_scaler.keda.status import ScalerStatusReader
from predictive_scaler.keda.targets import TargetCheck
from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec

NOW = datetime(2025, 3, 3, 12, 0, tzinfo=UTC)
NS = "ml"
STALE = 300.0
INTERVAL = 60.0
SPEC = {"mode": "keda", "target": {"name": "llm"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": 10},
        "maxReplicas": 20}
Code = grpc.StatusCode


def decision(demand: float | None = 30.0, p95: float = 55.0, desired: int = 6) -> Decision:
    return Decision(desired_replicas=desired, placeholder_gpus=0, strategy="predictive", speculative_gpus=0,
                    speculative_cost_per_hour=None, limits=(), reasons=(), demand=demand, forecast_pod_lead=p95,
                    scheduled_events=())


def scaled_object(name: str, target: str) -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": NS},
            "spec": {"scaleTargetRef": {"name": target}, "triggers": [
                {"type": "external", "metricType": "AverageValue", "metadata": {"scalerName": "llm"}}]}}


@dataclass
class FakeApi:
    """PredictiveScalers (spec + status) and ScaledObjects, as the kube layer would read them."""

    clock: FakeClock
    scalers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    scaled_objects: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    lists_down: bool = False
    gets: int = 0
    lists: int = 0

    def add(self, name: str, spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> None:
        self.scalers[(NS, name)] = {"metadata": {"name": name, "namespace": NS}, "spec": spec or SPEC,
                                    "status": status or {}}

    def decide(self, name: str, d: Decision, at: datetime) -> Any:
        """What the reconciling controller writes: the answer in status.keda, Ready True."""
        obj = self.scalers[(NS, name)]
        answer = answer_for(d, ScalerSpec.from_dict(obj["spec"]), namespace=NS, name=name, decided_at=at)
        obj["status"] = {"mode": "keda", "keda": answer.to_status(), "conditions": [
            {"type": "Ready", "status": "True", "reason": "ServedToKeda", "message": "…"}]}
        return answer

    def get_scaler(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        if self.down:
            raise ServerError("connection refused")
        if (namespace, name) not in self.scalers:
            raise NotFoundError(f"predictivescalers {name} not found", status=404)
        return copy.deepcopy(self.scalers[(namespace, name)])

    def list_scaled_objects(self, namespace: str) -> list[dict[str, Any]]:
        self.lists += 1
        if self.down or self.lists_down:
            raise ServerError("connection refused")
        return [copy.deepcopy(o) for o in self.scaled_objects if o["metadata"]["namespace"] == namespace]


@contextlib.contextmanager
def serving(api: FakeApi, board: KedaBoard | None = None, **kw: Any) -> Iterator[KedaServer]:
    board = board or KedaBoard(api.clock, STALE)
    status = ScalerStatusReader(api.get_scaler, api.clock, stale_after_seconds=STALE, interval_seconds=INTERVAL)
    targets = TargetCheck(api.list_scaled_objects, api.clock)
    server = KedaServer(board, "127.0.0.1", 0, workers=8, polling_workers=4, status=status, targets=targets,
                        **kw).start()
    try:
        yield server
    finally:
        server.stop(0.5)


@contextlib.contextmanager
def client(*ports: int) -> Iterator[pb_grpc.ExternalScalerStub]:
    target = f"ipv4:{','.join(f'127.0.0.1:{p}' for p in ports)}"
    with grpc.insecure_channel(target, options=[("grpc.lb_policy_name", "round_robin")]) as channel:
        yield pb_grpc.ExternalScalerStub(channel)


def ref(so: str = "llm-so", **metadata: str) -> Any:
    return pb.ScaledObjectRef(name=so, namespace=NS, scalerMetadata=metadata if metadata else {"scalerName": "llm"})


def replicas(stub: pb_grpc.ExternalScalerStub, r: Any) -> int:
    [value] = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName=METRIC_NAME), timeout=5).metricValues
    assert value.metricValue == value.metricValueFloat
    return int(value.metricValue)


def error(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.fixture
def api() -> FakeApi:
    a = FakeApi(FakeClock(NOW))
    a.add("llm")
    a.scaled_objects.append(scaled_object("llm-so", "llm"))
    return a


def test_answers_come_from_the_status_any_process_reads(api: FakeApi) -> None:
    api.decide("llm", decision(), NOW)
    with serving(api) as server, client(server.port) as stub:
        assert replicas(stub, ref()) == 6
        assert stub.IsActive(ref(), timeout=5).result is True
        [spec] = stub.GetMetricSpec(ref(), timeout=5).metricSpecs
        assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (METRIC_NAME, 1, 1.0)
        # Read once, kept until the next decision is due: many calls, one read.
        for _ in range(20):
            replicas(stub, ref())
        assert api.gets == 1
        api.decide("llm", decision(p95=75.0, desired=8), NOW + timedelta(seconds=60))
        api.clock.advance(61)
        assert replicas(stub, ref()) == 8 and api.gets == 2
        # No controller reconciles it: the answer ages out (UNAVAILABLE) after 5 intervals, the spec does not.
        api.clock.advance(STALE + 1)
        code, words = error(lambda: replicas(stub, ref()))
        assert code == Code.UNAVAILABLE and "old" in words
        assert stub.GetMetricSpec(ref(), timeout=5).metricSpecs[0].targetSize == 1


def test_metric_spec_before_the_first_decision_and_for_a_scaler_not_there_yet(api: FakeApi) -> None:
    with serving(api) as server, client(server.port) as stub:
        # Not decided yet: KEDA builds its HPA now, so the spec is answered; the metric is not, for now.
        assert stub.GetMetricSpec(ref(), timeout=5).metricSpecs[0].targetSizeFloat == 1.0
        code, words = error(lambda: replicas(stub, ref()))
        assert code == Code.UNAVAILABLE and "not reconciled it in mode keda" in words
        # The ScaledObject applied before its PredictiveScaler: the spec still answers, the metric is NOT_FOUND.
        missing = ref(scalerName="later")
        assert stub.GetMetricSpec(missing, timeout=5).metricSpecs[0].targetSize == 1
        for call in (lambda: replicas(stub, missing), lambda: stub.IsActive(missing, timeout=5)):
            code, words = error(call)
            assert code == Code.NOT_FOUND and "no PredictiveScaler 'later' in namespace ml" in words


@pytest.mark.parametrize(("metadata", "words"), [
    ({}, "has no scalerName"),
    ({"scalerName": "  "}, "has no scalerName"),
    ({"scalerAddress": "x:6000"}, "KEDA sends nothing when that variable is unset"),
    ({"scalerName": "llm", "scalerNameFromEnv": "other"}, "name different PredictiveScalers"),
    ({"scalerName": "ml/llm"}, "names a namespace"),
    ({"scalerName": "LLM_server"}, "is not a Kubernetes object name"),
    ({"scalerName": "a" * 254}, "is not a Kubernetes object name"),
], ids=["none", "blank", "from-env-unresolved", "both-differ", "namespaced", "bad-chars", "too-long"])
def test_malformed_metadata_is_invalid_argument_on_every_call(api: FakeApi, metadata: dict[str, str],
                                                               words: str) -> None:
    r = pb.ScaledObjectRef(name="llm-so", namespace=NS, scalerMetadata=metadata)
    with serving(api) as server, client(server.port) as stub:
        for call in (lambda: stub.GetMetricSpec(r, timeout=5), lambda: replicas(stub, r),
                     lambda: stub.IsActive(r, timeout=5)):
            code, details = error(call)
            assert code == Code.INVALID_ARGUMENT and words in details


def test_scaler_name_from_env_is_the_value_keda_resolved(api: FakeApi) -> None:
    """KEDA replaces the value of a ``…FromEnv`` key by the scale target's env var (external_scaler.go,
    parseExternalScalerMetadata, every tag 2.12–2.20): the key stays, the value is the scaler's name."""
    api.decide("llm", decision(), NOW)
    with serving(api) as server, client(server.port) as stub:
        assert replicas(stub, ref(scalerNameFromEnv="llm", scalerAddress="a:6000")) == 6
        assert replicas(stub, ref(scalerNameFromEnv="llm", scalerName="llm")) == 6
        assert replicas(stub, ref(scalerNameFromEnv="llm", scalerName=" ")) == 6


@pytest.mark.parametrize(("spec", "status", "code", "words"), [
    ({**SPEC, "mode": "scale"}, {}, Code.FAILED_PRECONDITION, "its mode is scale, not keda"),
    ({**SPEC, "maxReplicas": -1}, {}, Code.FAILED_PRECONDITION, "its spec is invalid"),
    (SPEC, {"conditions": [{"type": "Ready", "status": "False", "reason": "Paused", "message": "paused by the …"}]},
     Code.FAILED_PRECONDITION, "Paused: paused by the"),
    (SPEC, {"mode": "keda", "keda": {"replicas": "six"}}, Code.UNAVAILABLE, "status.keda cannot be read"),
], ids=["other-mode", "invalid-spec", "refused-paused", "unreadable-status"])
def test_a_scaler_not_served_says_why(api: FakeApi, spec: dict[str, Any], status: dict[str, Any],
                                      code: grpc.StatusCode, words: str) -> None:
    api.add("llm", spec, status)
    with serving(api) as server, client(server.port) as stub:
        found, details = error(lambda: replicas(stub, ref()))
        assert found == code and words in details
        if code == Code.FAILED_PRECONDITION and "invalid" not in words:
            assert stub.GetMetricSpec(ref(), timeout=5).metricSpecs[0].targetSize == 1  # fixable without the SO


def test_the_api_unreachable_is_unavailable_and_known_answers_stay(api: FakeApi) -> None:
    with serving(api) as server, client(server.port) as stub:
        api.down = True
        code, words = error(lambda: replicas(stub, ref()))
        assert code == Code.UNAVAILABLE and "cannot read PredictiveScaler ml/llm" in words
        assert stub.GetMetricSpec(ref(), timeout=5).metricSpecs[0].targetSize == 1


def test_a_scaledobject_on_another_workload_is_refused(api: FakeApi) -> None:
    api.decide("llm", decision(), NOW)
    api.scaled_objects.append(scaled_object("thief", "other"))
    with serving(api) as server, client(server.port) as stub:
        for call in (lambda: stub.GetMetricSpec(ref("thief"), timeout=5), lambda: replicas(stub, ref("thief")),
                     lambda: stub.IsActive(ref("thief"), timeout=5), lambda: replicas(stub, ref("no-such-so"))):
            code, words = error(call)
            assert code == Code.PERMISSION_DENIED
            assert "does not scale Deployment ml/llm, the workload PredictiveScaler ml/llm plans for" in words
        assert replicas(stub, ref("llm-so")) == 6
        # One namespace list serves every check within its time: refusals do not turn into a read per call.
        lists = api.lists
        for _ in range(10):
            error(lambda: replicas(stub, ref("thief")))
            replicas(stub, ref("llm-so"))
        assert api.lists == lists
        # A ScaledObject pointed at the workload afterwards is answered once the short refusal memory ends.
        api.scaled_objects[-1] = scaled_object("thief", "llm")
        api.clock.advance(6)
        assert replicas(stub, ref("thief")) == 6
        # The API cannot say what it scales: the metric waits (UNAVAILABLE), the spec is answered.
        api.clock.advance(61)
        api.lists_down = True
        api.scaled_objects.append(scaled_object("new", "llm"))
        code, words = error(lambda: stub.IsActive(ref("new"), timeout=5))
        assert code == Code.UNAVAILABLE and "cannot read the ScaledObjects of namespace ml" in words
        assert stub.GetMetricSpec(ref("new"), timeout=5).metricSpecs[0].targetSize == 1


def test_the_watch_cache_answers_first_and_the_list_covers_what_it_has_not_seen(api: FakeApi) -> None:
    api.decide("llm", decision(), NOW)
    seen: set[str] = {"llm-so"}
    check = TargetCheck(api.list_scaled_objects, api.clock, cached=lambda target: seen)
    target = ScalerSpec.from_dict(SPEC).target
    from predictive_scaler.kube.workloads import WorkloadRef

    workload = WorkloadRef(target.api_version, target.kind, target.name, NS)
    assert check.check("llm-so", "llm", workload).verdict == "ok" and api.lists == 0
    api.scaled_objects.append(scaled_object("fresh", "llm"))  # created; the watch has not delivered it yet
    assert check.check("fresh", "llm", workload).verdict == "ok" and api.lists == 1


def test_two_replicas_one_stops_the_other_keeps_answering(api: FakeApi) -> None:
    """High availability: the controller (its own decisions on its board) and a second replica that only
    serves KEDA (``--keda-only``: an empty board, every answer from status), behind one round-robin
    client as KEDA's gRPC client (round_robin from KEDA 2.13) or a Service gives. The controller stops:
    every answer still comes, and it is the controller's last decision."""
    board = KedaBoard(api.clock, STALE)
    answer = api.decide("llm", decision(p95=75.0, desired=8), NOW)
    board.publish(answer)
    with serving(api, board) as controller, serving(api) as standby, client(controller.port, standby.port) as stub:
        assert {replicas(stub, ref()) for _ in range(10)} == {8}
        gets = api.gets
        assert gets == 1  # round robin: the standby answered some (from status), the controller from memory
        controller.stop(0.2)
        answered: list[int] = []
        deadline = time.monotonic() + 10
        while len(answered) < 20 and time.monotonic() < deadline:
            try:
                answered.append(replicas(stub, ref()))
            except grpc.RpcError as exc:  # the one call in flight as the port closed, at most
                assert exc.code() == Code.UNAVAILABLE
        assert answered == [8] * 20
        assert api.gets == gets  # the standby had already read it


def test_shards_each_decide_some_and_both_answer_all(api: FakeApi) -> None:
    """Sharding: shard 0 decides llm, shard 1 decides chat; KEDA reaches either through the Service."""
    api.add("chat", {**SPEC, "target": {"name": "chat"}})
    api.scaled_objects.append(scaled_object("chat-so", "chat"))
    boards = [KedaBoard(api.clock, STALE), KedaBoard(api.clock, STALE)]
    boards[0].publish(api.decide("llm", decision(), NOW))
    boards[1].publish(api.decide("chat", decision(p95=95.0, desired=10), NOW))
    with serving(api, boards[0]) as s0, serving(api, boards[1]) as s1:
        for port in (s0.port, s1.port):
            with client(port) as stub:
                assert replicas(stub, ref("llm-so")) == 6
                assert replicas(stub, ref("chat-so", scalerName="chat")) == 10
                # chat's ScaledObject naming llm's scaler is refused on either shard.
                assert error(lambda stub=stub: replicas(stub, ref("chat-so")))[0] == Code.PERMISSION_DENIED
        # A shard that refused a scaler it no longer reconciles stops refusing it once that ages out.
        boards[0].withdraw(NS, "chat", "ConflictingAutoscaler: …")
        with client(s0.port) as stub:
            assert error(lambda: replicas(stub, ref("chat-so", scalerName="chat")))[0] == Code.FAILED_PRECONDITION
            boards[1].publish(api.decide("chat", decision(p95=95.0, desired=10), NOW + timedelta(seconds=STALE)))
            api.clock.advance(STALE + 1)
            assert replicas(stub, ref("chat-so", scalerName="chat")) == 10


def test_a_keda_only_replica_answers_from_status_through_the_kube_layer(fake_api: Any, clock: FakeClock) -> None:
    """``controller --keda-only`` as run.py wires it (an empty board, the scaler and ScaledObject reads
    through KubeCluster), against the stand-in API server holding what the controller wrote."""
    from pathlib import Path

    from predictive_scaler.controller.run import KedaOnly, keda_server
    from predictive_scaler.controller.settings import ControllerSettings
    from predictive_scaler.kube.client import KubeCluster

    fake_api.install_keda()
    obj = fake_api.add_scaler(NS, "llm", SPEC)
    answer = answer_for(decision(p95=75.0, desired=8), ScalerSpec.from_dict(SPEC), namespace=NS, name="llm",
                        decided_at=clock.now())
    fake_api.put({**obj, "status": {"mode": "keda", "keda": answer.to_status(), "conditions": [
        {"type": "Ready", "status": "True", "reason": "ServedToKeda", "message": "…"}]}})
    fake_api.put(scaled_object("llm-so", "llm"))
    settings = ControllerSettings(prometheus_url="http://prometheus:9090", model_store=Path("/models"), keda_port=0,
                                  metrics_host="127.0.0.1", keda_only=True)
    kube = KubeCluster(fake_api.api_client, clock=clock, sleep=clock.advance)
    server = keda_server(KedaOnly(settings, clock, KedaBoard(clock, STALE)), kube).start()
    try:
        with client(server.port) as stub:
            assert replicas(stub, ref()) == 8
            assert error(lambda: replicas(stub, ref(scalerName="nope")))[0] == Code.NOT_FOUND
            fake_api.put(scaled_object("thief", "elsewhere"))
            assert error(lambda: replicas(stub, ref("thief")))[0] == Code.PERMISSION_DENIED
    finally:
        server.stop(0.2)
