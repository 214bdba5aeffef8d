"""KEDA's external scaler API, end to end: a real gRPC client (the stubs generated from
predictive_scaler/keda/externalscaler.proto) against the controller — its kopf reconcile handler
driving ControllerService on the stand-in API server, backed by the real Prometheus fixture — and
the gRPC server run.py starts beside it. The expected answers come from the backtest's path
(TraceMetrics + ServedModel through the same Reconciler) over the same trace, time and state."""

from __future__ import annotations

import contextlib
import math
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from pytest_httpserver import HTTPServer

from predictive_scaler.backtest.adapters import ServedModel, TraceMetrics
from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.handlers import Handlers, build_registry
from predictive_scaler.controller.run import keda_server
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.answer import METRIC_NAME
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeCluster
from tests.support.prometheus import BackfilledPrometheus

NS = "ml"
ONE_MINUTE = 'sum(rate(requests_total{namespace="ml",job="inference"}[1m]))'
GROUP_VERSION = "autoscaling.predictive-scaler.io/v1alpha1"
ROOT = Path(__file__).resolve().parents[2]


def at(prom: BackfilledPrometheus, offset: timedelta) -> datetime:
    """A whole minute, one minute past a 5-minute boundary, ``offset`` into the trace."""
    t = prom.history.trace.start.to_pydatetime() + offset
    return datetime.fromtimestamp(math.floor(t.timestamp() / 300) * 300 + 60, UTC)


def spec_dict(prom: BackfilledPrometheus, model: str = "llm", **over: Any) -> dict[str, Any]:
    p95 = float(np.nanpercentile(prom.history.trace.values, 95))
    return {"mode": "keda", "target": {"name": "llm"}, "demand": {"kind": "requests", "query": ONE_MINUTE},
            "capacity": {"requestsPerReplica": round(p95 / 6, 1)}, "minReplicas": 1, "maxReplicas": 50,
            "prewarm": {"budget": {"maxGpus": 100}}, "model": {"name": model}, **over}


@pytest.fixture(scope="module")
def store(prometheus_server: BackfilledPrometheus, tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A persistence model trained on the first 10 days at 5 minutes; no model named "fresh"."""
    grid = prometheus_server.history.trace.resample(300)
    history = grid.slice(0, 10 * 288)
    s = ModelStore(tmp_path_factory.mktemp("models"))
    s.publish("llm", PersistenceForecaster().fit(history), series="llm", window=TrainingWindow.of(history))
    return s


@pytest.fixture
def fake_api(httpserver: HTTPServer) -> Iterator[FakeApiServer]:
    with FakeApiServer(httpserver, keda_installed=True) as server:
        server.add_deployment(NS, "llm", replicas=5, labels={"app": "llm"})
        server.add_gpu_node("gpu-0", 8)
        for i in range(5):
            server.add_pod(NS, f"llm-x-{i}", {"app": "llm"}, node="gpu-0", gpus=1)
        yield server


@dataclass
class Controller:
    service: ControllerService
    handlers: Handlers
    clock: FakeClock
    api: FakeApiServer
    stub: pb_grpc.ExternalScalerStub

    def reconcile(self, name: str) -> dict[str, Any]:
        obj = self.api.get(GROUP_VERSION, "PredictiveScaler", NS, name)
        assert obj is not None
        meta = obj["metadata"]
        self.handlers.reconcile(name=name, namespace=NS, uid=meta["uid"], spec=obj["spec"],
                                status=obj.get("status") or {}, meta=meta)
        after = self.api.get(GROUP_VERSION, "PredictiveScaler", NS, name)
        assert after is not None
        return after["status"]


@contextlib.contextmanager
def running_controller(prom: BackfilledPrometheus, store: ModelStore, api: FakeApiServer,
                       now: datetime) -> Iterator[Controller]:
    clock = FakeClock(now)
    kube = KubeCluster(api.api_client, retry=RetryPolicy(), clock=clock, sleep=clock.advance, rng=random.Random(1))
    settings = ControllerSettings(prometheus_url=prom.url, model_store=Path(store.root), keda_port=0,
                                  metrics_host="127.0.0.1")
    service = ControllerService(settings, kube, PrometheusSource(prom.url, retries=0, clock=clock), store, clock)
    _, handlers = build_registry(service)
    server = keda_server(service).start()
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Controller(service, handlers, clock, api, pb_grpc.ExternalScalerStub(channel))
    finally:
        channel.close()
        server.stop()


def ref(scaler: str | None = "llm", name: str = "llm-so") -> Any:
    return pb.ScaledObjectRef(name=name, namespace=NS, scalerMetadata={} if scaler is None else {
        "scalerName": scaler, "scalerAddress": "predictive-scaler.predictive-scaler.svc:6000"})


def ask(stub: pb_grpc.ExternalScalerStub, r: Any) -> tuple[int, bool]:
    """The replicas KEDA's HPA computes from the answer (target one replica, metric whole replicas), and IsActive."""
    [spec] = stub.GetMetricSpec(r, timeout=5).metricSpecs
    [value] = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName=spec.metricName), timeout=5
                              ).metricValues
    assert spec.metricName == value.metricName == METRIC_NAME
    assert (spec.targetSize, spec.targetSizeFloat) == (1, 1.0)
    assert value.metricValue == value.metricValueFloat  # whole replicas in both: every KEDA release reads them
    return value.metricValue, stub.IsActive(r, timeout=5).result


def backtest_decision(prom: BackfilledPrometheus, store: ModelStore, spec: dict[str, Any], now: datetime) -> Any:
    parsed = ScalerSpec.from_dict(spec)
    served = ServedModel(store.serving("llm").model, "v", horizon_steps=parsed.horizon_seconds // 300,
                         quantiles=(0.5, 0.95))
    r = Reconciler(parsed, TraceMetrics(prom.history.trace, delay_s=60), served,
                   FakeCluster(desired=5, ready=5), FakeClock(now))
    return r.step(PlannerState()).decision


@pytest.mark.parametrize("offset", [timedelta(days=11, hours=7), timedelta(days=12, hours=20)],
                         ids=["day-11", "day-12"])
def test_a_keda_client_gets_the_planners_demand(prometheus_server: BackfilledPrometheus, store: ModelStore,
                                                fake_api: FakeApiServer, offset: timedelta) -> None:
    now = at(prometheus_server, offset)
    spec = spec_dict(prometheus_server)
    fake_api.add_scaler(NS, "llm", spec)
    fake_api.put(scaled_object("llm-so", "llm"))
    expected = backtest_decision(prometheus_server, store, spec, now)
    assert expected.strategy == "predictive"
    with running_controller(prometheus_server, store, fake_api, now) as c:
        status = c.reconcile("llm")
        replicas, active = ask(c.stub, ref())
    assert status["strategy"] == "predictive" and status["mode"] == "keda"
    ready = next(x for x in status["conditions"] if x["type"] == "Ready")
    assert ready["reason"] == "ServedToKeda"
    cap = ScalerSpec.from_dict(spec).capacity_per_replica
    planned = expected.forecast_pod_lead * ScalerSpec.from_dict(spec).demand.intra_step_peak_factor
    # The P95 plan, never below the demand observed now, in whole replicas: what KEDA's HPA then computes.
    assert replicas == math.ceil(max(planned, expected.demand) / cap - 1e-9)
    assert replicas == max(expected.predicted_replicas, math.ceil(expected.demand / cap - 1e-9))
    assert active is True
    # Mode keda writes no /scale: the Deployment keeps its 5 replicas.
    deployment = fake_api.get("apps/v1", "Deployment", NS, "llm")
    assert deployment is not None and deployment["spec"]["replicas"] == 5
    assert not [r for r in fake_api.requests if r.method == "PATCH" and r.path.endswith("/scale")]


def test_a_scaler_with_no_model_answers_the_demand_observed_now(prometheus_server: BackfilledPrometheus,
                                                               store: ModelStore, fake_api: FakeApiServer) -> None:
    now = at(prometheus_server, timedelta(days=11, hours=15))
    fake_api.add_scaler(NS, "fresh", spec_dict(prometheus_server, model="fresh"))
    fake_api.put(scaled_object("llm-so", "fresh"))
    demand_now = float(prometheus_server.history.trace.values[prometheus_server.history.trace.index_at(
        now - timedelta(minutes=1))])
    with running_controller(prometheus_server, store, fake_api, now) as c:
        status = c.reconcile("fresh")
        replicas, active = ask(c.stub, ref("fresh"))
    assert status["strategy"] == "reactive"
    assert "has no serving version" in " ".join(status["reasons"])
    cap = ScalerSpec.from_dict(spec_dict(prometheus_server)).capacity_per_replica
    assert replicas == math.ceil(demand_now / cap - 1e-9)  # the HPA rule on the demand observed now
    assert active is (demand_now > 0)


def test_missing_data_never_answers_lower(prometheus_server: BackfilledPrometheus, store: ModelStore,
                                          fake_api: FakeApiServer) -> None:
    gap_start, _ = prometheus_server.history.gap
    now = datetime.fromtimestamp(math.floor((gap_start + timedelta(minutes=20)).timestamp() / 60) * 60, UTC)
    spec = spec_dict(prometheus_server, model="fresh")
    fake_api.add_scaler(NS, "fresh", spec)
    fake_api.put(scaled_object("llm-so", "fresh"))
    with running_controller(prometheus_server, store, fake_api, now) as c:
        status = c.reconcile("fresh")
        replicas, active = ask(c.stub, ref("fresh"))
    assert status["strategy"] == "hold"
    # The 5 replicas running stay: KEDA's HPA computes 5 from the answer, not fewer.
    assert replicas == 5 and active is True


def test_errors_say_why(prometheus_server: BackfilledPrometheus, store: ModelStore,
                        fake_api: FakeApiServer) -> None:
    now = at(prometheus_server, timedelta(days=11, hours=7))
    fake_api.add_scaler(NS, "llm", spec_dict(prometheus_server))
    fake_api.put(scaled_object("llm-so", "llm"))
    fake_api.add_scaler(NS, "acting", spec_dict(prometheus_server, mode="scale", target={"name": "other"}))
    other_so = scaled_object("other-so", "acting")
    other_so["spec"]["scaleTargetRef"] = {"name": "other"}
    fake_api.put(other_so)
    with running_controller(prometheus_server, store, fake_api, now) as c:
        cases = [(ref("llm"), grpc.StatusCode.UNAVAILABLE, "has not reconciled it in mode keda"),
                 (ref(None), grpc.StatusCode.INVALID_ARGUMENT, "scalerName"),
                 (ref("missing"), grpc.StatusCode.NOT_FOUND, "no PredictiveScaler 'missing' in namespace ml"),
                 (ref("acting", name="other-so"), grpc.StatusCode.FAILED_PRECONDITION, "its mode is scale, not keda"),
                 (ref("acting"), grpc.StatusCode.PERMISSION_DENIED, "does not scale Deployment ml/other")]
        for r, code, words in cases:
            with pytest.raises(grpc.RpcError) as info:
                c.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=r, metricName=METRIC_NAME), timeout=5)
            assert info.value.code() == code and words in info.value.details()
        c.reconcile("llm")
        fake_api.add_deployment(NS, "other", replicas=1, labels={"app": "other"})
        c.reconcile("acting")
        with pytest.raises(grpc.RpcError) as info:
            c.stub.IsActive(ref("acting", name="other-so"), timeout=5)
        # Reconciled in mode scale, it refuses to fight the ScaledObject: KEDA is told that reason.
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not served to KEDA: ConflictingAutoscaler" in info.value.details()
        assert ask(c.stub, ref("llm"))[1] is True
        # A ScaledObject on another workload naming this scaler is refused, whatever the scaler's state.
        fake_api.put({**scaled_object("thief", "llm"), "spec": {"scaleTargetRef": {"name": "other"}, "triggers": []}})
        with pytest.raises(grpc.RpcError) as info:
            c.stub.IsActive(ref("llm", name="thief"), timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and "does not scale" in info.value.details()
        # The answer ages out when the controller stops reconciling the scaler.
        c.clock.advance((c.service.settings.liveness_timeout_seconds or 0) + 1)
        with pytest.raises(grpc.RpcError) as info:
            c.stub.IsActive(ref("llm"), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "old" in info.value.details()
        [kept] = c.stub.GetMetricSpec(ref("llm"), timeout=5).metricSpecs  # the target does not age
        assert kept.targetSizeFloat == 1.0
        with pytest.raises(grpc.RpcError) as info:
            c.stub.StreamMetricSpec(ref("llm"), timeout=5).next()
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # KEDA then polls GetMetricSpec


def scaled_object(name: str, scaler: str) -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": NS},
            "spec": {"scaleTargetRef": {"name": "llm"}, "triggers": [
                {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}},
                {"type": "external", "metadata": {"scalerAddress": "predictive-scaler.predictive-scaler:6000",
                                                  "scalerName": scaler}}]}}


def keda_hpa(name: str, owner: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": owner,
                                    "uid": "so-uid", "controller": True}]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                     "minReplicas": 1, "maxReplicas": 50}}


def test_its_scaledobject_and_kedas_hpa_are_not_conflicts(prometheus_server: BackfilledPrometheus,
                                                          store: ModelStore, fake_api: FakeApiServer) -> None:
    now = at(prometheus_server, timedelta(days=11, hours=7))
    fake_api.add_scaler(NS, "llm", spec_dict(prometheus_server))
    fake_api.put(scaled_object("llm-so", "llm"))
    fake_api.put(keda_hpa("keda-hpa-llm-so", "llm-so"))
    with running_controller(prometheus_server, store, fake_api, now) as c:
        status = c.reconcile("llm")
        conflict = next(x for x in status["conditions"] if x["type"] == "ConflictingAutoscaler")
        assert conflict["status"] == "False"
        assert ask(c.stub, ref("llm"))[1] is True
        # A second ScaledObject on the same Deployment would fight KEDA's HPA: refused, and KEDA is told why.
        fake_api.put(scaled_object("another-so", "someone-else"))
        c.clock.advance(60)
        status = c.reconcile("llm")
        conflict = next(x for x in status["conditions"] if x["type"] == "ConflictingAutoscaler")
        assert conflict["status"] == "True" and "another-so" in conflict["message"]
        assert "llm-so" not in conflict["message"]
        with pytest.raises(grpc.RpcError) as info:
            c.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref("llm"), metricName=METRIC_NAME), timeout=5)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "another-so" in info.value.details()
        # The spec still answers: the ScaledObject is right, and KEDA builds its HPA from the spec only once.
        assert c.stub.GetMetricSpec(ref("llm"), timeout=5).metricSpecs[0].targetSize == 1


def test_stream_is_active_sends_now_and_on_change(prometheus_server: BackfilledPrometheus, store: ModelStore,
                                                  fake_api: FakeApiServer) -> None:
    now = at(prometheus_server, timedelta(days=11, hours=7))
    fake_api.add_scaler(NS, "llm", spec_dict(prometheus_server))
    fake_api.put(scaled_object("llm-so", "llm"))
    with running_controller(prometheus_server, store, fake_api, now) as c:
        c.reconcile("llm")
        stream = c.stub.StreamIsActive(ref("llm"), timeout=10)
        assert next(stream).result is True
        # Paused: the scaler is withdrawn, and the stream ends with the reason (KEDA reconnects).
        obj = fake_api.get(GROUP_VERSION, "PredictiveScaler", NS, "llm")
        assert obj is not None
        obj["metadata"]["annotations"] = {"predictive-scaler.io/paused": "true"}
        fake_api.put(obj)
        c.reconcile("llm")
        with pytest.raises(grpc.RpcError) as info:
            next(stream)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "Paused" in info.value.details()


def test_the_committed_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    proto = "predictive_scaler/keda/externalscaler.proto"
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={tmp_path}",
                           f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", str(ROOT / proto)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr

    def body(path: Path) -> list[str]:
        # A newer grpcio-tools or protobuf stamps its own version (GRPC_GENERATED_VERSION, the
        # runtime check's numbers); only what the proto decides has to match.
        kept, in_version_call = [], False
        for line in path.read_text().splitlines():
            if line.startswith("_runtime_version.ValidateProtobufRuntimeVersion("):
                in_version_call = True
            elif in_version_call and line.startswith(")"):
                in_version_call = False
            elif not in_version_call and "version" not in line.lower():
                kept.append(line)
        return kept

    for name in ("externalscaler_pb2.py", "externalscaler_pb2.pyi", "externalscaler_pb2_grpc.py"):
        fresh = tmp_path / "predictive_scaler" / "keda" / name
        assert body(fresh) == body(ROOT / "predictive_scaler" / "keda" / name), f"{name}: run make keda-stubs"
