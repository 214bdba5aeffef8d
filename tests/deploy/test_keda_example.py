"""deploy/examples/vllm-keda: the PredictiveScaler in mode keda and the ScaledObject that uses it."""

from __future__ import annotations

import pytest

from predictive_scaler.keda.ownership import foreign
from predictive_scaler.kube.autoscalers import ConflictingAutoscaler, external_scaler_names
from predictive_scaler.kube.manifests import KIND
from predictive_scaler.spec import ScalerSpec
from tests.deploy.support import OVERLAYS, one, render

EXAMPLE = OVERLAYS["example-vllm-keda"]  # every object is validated strictly in test_manifests.py


@pytest.mark.kubectl
def test_the_scaledobject_uses_the_scaler_in_keda_mode_through_the_keda_service() -> None:
    objs = render(EXAMPLE)
    scaler = one(objs, KIND)
    spec = ScalerSpec.from_dict(scaler["spec"])
    assert spec.mode == "keda" and not spec.prewarm.enabled and spec.events
    so = one(objs, "ScaledObject")
    assert so["metadata"]["namespace"] == scaler["metadata"]["namespace"]
    assert so["spec"]["scaleTargetRef"]["name"] == spec.target.name
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (spec.min_replicas, spec.max_replicas)
    [external] = [t for t in so["spec"]["triggers"] if t["type"] in ("external", "external-push")]
    assert external["metadata"]["scalerName"] == scaler["metadata"]["name"]
    host, port = external["metadata"]["scalerAddress"].rsplit(":", 1)
    service = one(render(OVERLAYS["default"]), "Service", "predictive-scaler-keda")
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) == service["spec"]["ports"][0]["port"]
    # The controller reads it as this scaler's own ScaledObject, not a conflicting autoscaler.
    found = ConflictingAutoscaler("ScaledObject", so["metadata"]["name"], so["metadata"]["namespace"],
                                  external_scalers=external_scaler_names(so))
    assert foreign([found], scaler["metadata"]["name"]) == ()
    assert foreign([found], "someone-else") == (found,)
