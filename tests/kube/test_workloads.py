"""The target's ``/scale`` (kube/workloads.py) against the stateful fake API server: any scalable
kind, merge patches with a resourceVersion precondition, conflicts re-read, a missing target named."""

from __future__ import annotations

import pytest

from predictive_scaler.errors import ClusterError
from predictive_scaler.kube.workloads import WorkloadRef
from tests.kube.shared import DEPLOYMENT, NS, SCALE_PATH, add_target


@pytest.mark.parametrize(
    ("ref", "scale_path", "discovery"),
    [
        (DEPLOYMENT, SCALE_PATH, None),
        (
            WorkloadRef("apps/v1", "StatefulSet", "llm", NS),
            "/apis/apps/v1/namespaces/ml/statefulsets/llm/scale",
            None,
        ),
        (
            WorkloadRef("v1", "ReplicationController", "llm", NS),
            "/api/v1/namespaces/ml/replicationcontrollers/llm/scale",
            None,
        ),
        (
            WorkloadRef("serving.example.com/v1", "InferenceService", "llm", NS),
            "/apis/serving.example.com/v1/namespaces/ml/inferenceservices/llm/scale",
            "/apis/serving.example.com/v1",
        ),
        (
            WorkloadRef(
                "serving.example.com/v1", "InferenceService", "llm", NS, plural="inferenceservices"
            ),
            "/apis/serving.example.com/v1/namespaces/ml/inferenceservices/llm/scale",
            None,
        ),
    ],
    ids=[
        "deployment",
        "statefulset",
        "replicationcontroller",
        "custom-resource-discovered",
        "custom-resource-plural-given",
    ],
)
def test_get_and_patch_scale_of_any_scalable_kind(fake_api, cluster, ref, scale_path, discovery):
    add_target(fake_api, ref.kind)
    info = cluster.get_scale(ref)
    assert (info.replicas, info.status_replicas, info.selector) == (3, 3, "app=llm")
    after = cluster.patch_scale(ref, 5)
    assert after.replicas == 5
    assert int(after.resource_version) > int(info.resource_version)
    stored = fake_api.get(ref.api_version, ref.kind, NS, "llm")
    assert stored["spec"]["replicas"] == 5
    paths = [path for _, path in fake_api.calls()]
    assert set(paths) - {discovery} == {scale_path}
    assert paths.count(discovery) == (1 if discovery else 0)  # discovery is cached


def test_patch_scale_sends_a_merge_patch_with_a_resource_version_precondition(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=2)
    before = cluster.get_scale(DEPLOYMENT)
    cluster.patch_scale(DEPLOYMENT, 4, current=before)
    (patch,) = [r for r in fake_api.requests if r.method == "PATCH"]
    assert patch.path == SCALE_PATH
    assert patch.content_type == "application/merge-patch+json"
    assert patch.body == {
        "spec": {"replicas": 4},
        "metadata": {"resourceVersion": before.resource_version},
    }
    assert [m for m, _ in fake_api.calls()] == ["GET", "PATCH"]  # current saved a GET


def test_patch_scale_is_a_no_op_when_already_there(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=4)
    cluster.patch_scale(DEPLOYMENT, 4)
    assert fake_api.writes() == []


def test_patch_scale_rereads_after_a_stale_resource_version(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=2)
    stale = cluster.get_scale(DEPLOYMENT)
    fake_api.touch("apps/v1", "Deployment", NS, "llm")  # e.g. the deployment controller
    after = cluster.patch_scale(DEPLOYMENT, 6, current=stale)
    assert after.replicas == 6
    assert [(r.method, r.status) for r in fake_api.requests[1:]] == [
        ("PATCH", 409),
        ("GET", 200),
        ("PATCH", 200),
    ]


def test_patch_scale_survives_409_on_every_second_patch(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=1)
    fake_api.fail_every_nth_patch(2, 409)
    for replicas in range(2, 8):
        assert cluster.patch_scale(DEPLOYMENT, replicas).replicas == replicas
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 7
    assert any(r.status == 409 for r in fake_api.requests)


@pytest.mark.parametrize("method", ["get_scale", "patch_scale"], ids=["get", "patch"])
def test_missing_target_says_target_not_found(fake_api, cluster, method):
    args = (DEPLOYMENT, 3) if method == "patch_scale" else (DEPLOYMENT,)
    with pytest.raises(ClusterError, match="target not found") as info:
        getattr(cluster, method)(*args)
    assert info.value.status == 404
    assert not info.value.retryable
    assert len(fake_api.requests) == 1  # a 404 is not retried
