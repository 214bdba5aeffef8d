"""KEDA's external scaler API served by the real `predictive-scaler controller` process.

The session's controller (tests/e2e/conftest.py: the real process as its ServiceAccount, on the
real 1.20 API server, reading the real Prometheus that holds recent demand) serves KEDA's gRPC
API on its default port. A gRPC client built from the project's copy of KEDA's
externalscaler.proto asks what KEDA's HPA would ask, for a scaler in `mode: keda` with a model
and for one whose model does not exist yet.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from predictive_scaler.controller.settings import DEFAULT_KEDA_PORT
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from tests.e2e.conftest import (
    LEVEL,
    MODEL,
    PER_REPLICA,
    ControllerProcess,
    get_scaler,
    make_target,
    scaler_manifest,
)
from tests.support.kubeapi import KubeApiServer


def reconciled(api: KubeApiServer, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        obj = get_scaler(api, namespace, name)
        return obj if ((obj or {}).get("status") or {}).get("lastReconcileTime") else None
    return dict(api.wait_for(f"a reconcile of {namespace}/{name}", done, timeout=90))


def ask(stub: pb_grpc.ExternalScalerStub, namespace: str, scaler: str) -> tuple[float, float, bool]:
    ref = pb.ScaledObjectRef(name=f"{scaler}-so", namespace=namespace, scalerMetadata={"scalerName": scaler})
    deadline = time.monotonic() + 60
    while True:  # the first answer exists once the controller has reconciled the scaler
        try:
            [spec] = stub.GetMetricSpec(ref, timeout=5).metricSpecs
            [value] = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricName),
                                      timeout=5).metricValues
            active = stub.IsActive(ref, timeout=5).result
            return spec.targetSizeFloat, value.metricValueFloat, active
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.prometheus
@pytest.mark.parametrize("model", [MODEL, "not-trained-yet"], ids=["with-model", "no-model-yet"])
def test_a_keda_client_gets_the_plan_from_the_running_controller(
        kube_api: KubeApiServer, controller: ControllerProcess, model: str) -> None:
    ns = f"e2e-keda-{'model' if model == MODEL else 'fresh'}"
    make_target(kube_api, ns)
    kube_api.apply([scaler_manifest(ns, mode="keda", prewarm={"enabled": False}, model={"name": model})])
    status = reconciled(kube_api, ns, MODEL)["status"]
    assert controller.alive(), controller.log_text()[-3000:]
    with grpc.insecure_channel(f"127.0.0.1:{DEFAULT_KEDA_PORT}") as channel:
        target, value, active = ask(pb_grpc.ExternalScalerStub(channel), ns, MODEL)
    # KEDA's HPA computes ceil(value / target) replicas: the target is one replica's capacity.
    assert target == pytest.approx(PER_REPLICA)
    assert active
    # Demand now is LEVEL (5 % noise) req/s: never answered lower — with no model the answer is
    # that demand itself, with a model the plan over the pod lead time, which is at least it.
    assert value >= 0.8 * LEVEL, (value, status)
    if model != MODEL:
        assert status["strategy"] == "reactive"
        assert value <= 1.2 * LEVEL, (value, status)
    # mode keda never writes /scale: KEDA's HPA scales the workload.
    deployment = kube_api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{MODEL}")
    assert deployment is not None and deployment["spec"]["replicas"] == 2
