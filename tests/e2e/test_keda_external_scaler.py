"""KEDA's external scaler API served by the real `predictive-scaler controller` process.

The session's controller (tests/e2e/conftest.py: the real process as its ServiceAccount, on the
real 1.20 API server, reading the real Prometheus that holds recent demand) serves KEDA's gRPC
API on its default port. A gRPC client built from the project's copy of KEDA's
externalscaler.proto asks what KEDA's HPA would ask, for a scaler in `mode: keda` with a model
and for one whose model does not exist yet — through a real ScaledObject (KEDA's CRD reduced to
its kind: the test server runs no KEDA) whose scaleTargetRef the controller checks; a ScaledObject
pointing elsewhere is refused.
"""

from __future__ import annotations

import math
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

#: KEDA's ScaledObject kind, its schema left open: the controller reads only scaleTargetRef and triggers.
SCALED_OBJECT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {"group": "keda.sh", "scope": "Namespaced",
             "names": {"kind": "ScaledObject", "listKind": "ScaledObjectList", "plural": "scaledobjects",
                       "singular": "scaledobject", "shortNames": ["so"]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


def scaled_object(namespace: str, name: str, target: str, scaler: str) -> dict[str, Any]:
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"scaleTargetRef": {"name": target},
                     "triggers": [{"type": "external", "metricType": "AverageValue",
                                   "metadata": {"scalerAddress": f"127.0.0.1:{DEFAULT_KEDA_PORT}",
                                                "scalerName": scaler}}]}}


def install_scaled_object_crd(api: KubeApiServer) -> None:
    api.apply([SCALED_OBJECT_CRD])
    api.wait_for("the ScaledObject kind served",
                 lambda: api.get("/apis/keda.sh/v1alpha1/scaledobjects") is not None, timeout=30)


def reconciled(api: KubeApiServer, namespace: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        obj = get_scaler(api, namespace, name)
        return obj if ((obj or {}).get("status") or {}).get("lastReconcileTime") else None
    return dict(api.wait_for(f"a reconcile of {namespace}/{name}", done, timeout=90))


def ask(stub: pb_grpc.ExternalScalerStub, namespace: str, scaler: str,
        scaled_object: str | None = None) -> tuple[float, float, bool]:
    ref = pb.ScaledObjectRef(name=scaled_object or f"{scaler}-so", namespace=namespace,
                             scalerMetadata={"scalerName": scaler})
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
    install_scaled_object_crd(kube_api)
    make_target(kube_api, ns)
    kube_api.apply([scaler_manifest(ns, mode="keda", prewarm={"enabled": False}, model={"name": model}),
                    scaled_object(ns, f"{MODEL}-so", MODEL, MODEL),
                    scaled_object(ns, "elsewhere-so", "another-workload", MODEL)])
    status = reconciled(kube_api, ns, MODEL)["status"]
    assert controller.alive(), controller.log_text()[-3000:]
    with grpc.insecure_channel(f"127.0.0.1:{DEFAULT_KEDA_PORT}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        target, value, active = ask(stub, ns, MODEL)
        # A ScaledObject that scales another workload may not read this scaler's plan.
        with pytest.raises(grpc.RpcError) as refused:
            ask(stub, ns, MODEL, scaled_object="elsewhere-so")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    assert "does not scale Deployment" in str(refused.value.details())
    # KEDA's HPA computes ceil(value / target) replicas: the target is one replica, the value the
    # replicas planned — whole numbers, which every KEDA version reads alike (integer fields or float).
    assert target == 1.0 and value == int(value) >= 1
    assert active
    # Demand now is LEVEL (5 % noise) req/s: never answered lower — with no model the answer is
    # that demand itself, with a model the plan over the pod lead time, which is at least it.
    assert value >= math.ceil(0.8 * LEVEL / PER_REPLICA), (value, status)
    if model != MODEL:
        assert status["strategy"] == "reactive"
        assert value <= math.ceil(1.2 * LEVEL / PER_REPLICA), (value, status)
    # Any replica can give the same answer: it is in the status.
    keda = reconciled(kube_api, ns, MODEL)["status"]["keda"]
    assert keda["replicas"] >= 1 and keda["why"]
    # mode keda never writes /scale: KEDA's HPA scales the workload.
    deployment = kube_api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{MODEL}")
    assert deployment is not None and deployment["spec"]["replicas"] == 2
