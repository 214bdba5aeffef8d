"""KubeCluster against the stateful fake API server: request and response
shapes, state changes, error mapping, retries and conflicts."""

from __future__ import annotations

import json
import math
import random
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient, Configuration

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    DataError,
    MissingApiError,
    ThrottledError,
)
from predictive_scaler.kube import manifests
from predictive_scaler.kube.api_calls import API_CALLS, api_call_for, api_calls_markdown
from predictive_scaler.kube.autoscalers import ConflictingAutoscaler
from predictive_scaler.kube.cache import ClusterCache
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.kubeconfig import api_client_from_environment
from predictive_scaler.kube.placeholders import PlaceholderSpec
from predictive_scaler.kube.pods import PodCounts
from predictive_scaler.kube.retry import NO_RETRY
from predictive_scaler.kube.workloads import WorkloadRef

from .fake_apiserver import ResourceType

NS = "ml"
DEPLOYMENT = WorkloadRef("apps/v1", "Deployment", "llm", NS)
SCALE_PATH = "/apis/apps/v1/namespaces/ml/deployments/llm/scale"
INFERENCE_CR = ResourceType(
    "serving.example.com",
    "v1",
    "InferenceService",
    "inferenceservices",
    scale=True,
    status=True,
    builtin=False,
)
NO_SCALE_CR = ResourceType("serving.example.com", "v1", "Model", "models", builtin=False)
NOW = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def _scaler_spec(fake_api, **overrides):
    scaler = fake_api.get(manifests.API_VERSION, manifests.KIND, NS, "llm") or fake_api.add_scaler(
        NS, "llm"
    )
    args = dict(
        scaler_name="llm", namespace=NS, owner_uid=scaler["metadata"]["uid"], gpus_per_pod=4
    )
    args.update(overrides)
    return PlaceholderSpec(**args)


# ------------------------------------------------------------------ scale ---


def _add_target(fake_api, kind):
    if kind == "Deployment":
        fake_api.add_deployment(NS, "llm", replicas=3)
    elif kind == "StatefulSet":
        fake_api.put(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": "llm"}},
                    "serviceName": "llm",
                    "template": {
                        "metadata": {"labels": {"app": "llm"}},
                        "spec": {"containers": [{"name": "s", "image": "i"}]},
                    },
                },
                "status": {"replicas": 3},
            }
        )
    elif kind == "ReplicationController":
        fake_api.put(
            {
                "apiVersion": "v1",
                "kind": "ReplicationController",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {"replicas": 3, "selector": {"app": "llm"}},
                "status": {"replicas": 3},
            }
        )
    else:
        fake_api.register_type(INFERENCE_CR)
        fake_api.put(
            {
                "apiVersion": "serving.example.com/v1",
                "kind": "InferenceService",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {"replicas": 3},
                "status": {"replicas": 3, "selector": "app=llm"},
            }
        )


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
    _add_target(fake_api, ref.kind)
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


@pytest.mark.parametrize(
    ("inject", "min_total_sleep"),
    [
        (lambda f: f.outage(503, requests=2), 0.25 + 0.5),
        (lambda f: f.fail_next(r"/scale$", 500, times=3), 0.25 + 0.5 + 1.0),
        (lambda f: f.throttle(429, retry_after=2, times=1), 2.0),
        (lambda f: f.fail_next(r"/scale$", 504, times=1, method="PATCH"), 0.25),
    ],
    ids=["503-outage", "500-three-times", "429-retry-after", "504-on-patch"],
)
def test_transient_failures_back_off_then_succeed(
    fake_api, cluster, sleeps, inject, min_total_sleep
):
    fake_api.add_deployment(NS, "llm", replicas=1)
    inject(fake_api)
    assert cluster.patch_scale(DEPLOYMENT, 3).replicas == 3
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 3
    assert sum(sleeps) >= min_total_sleep
    assert len(sleeps) == sum(1 for r in fake_api.requests if r.status >= 500 or r.status == 429)


def test_a_long_outage_gives_up_within_budget_with_a_retryable_error(fake_api, cluster, clock):
    fake_api.add_deployment(NS, "llm", replicas=1)
    fake_api.outage(503, requests=1000)
    started = clock.now()
    with pytest.raises(ClusterError) as info:
        cluster.patch_scale(DEPLOYMENT, 3)
    assert info.value.status == 503 and info.value.retryable
    assert (clock.now() - started).total_seconds() <= 20
    assert len(fake_api.requests) == 5  # RetryPolicy.max_attempts
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 1


def test_throttling_longer_than_allowed_raises_throttled_error(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=1)
    fake_api.throttle(429, retry_after=120, times=1)
    with pytest.raises(ThrottledError) as info:
        cluster.get_scale(DEPLOYMENT)
    assert info.value.retry_after == 120
    assert len(fake_api.requests) == 1


@pytest.mark.parametrize("method", ["get_scale", "patch_scale"], ids=["get", "patch"])
def test_missing_target_says_target_not_found(fake_api, cluster, method):
    args = (DEPLOYMENT, 3) if method == "patch_scale" else (DEPLOYMENT,)
    with pytest.raises(ClusterError, match="target not found") as info:
        getattr(cluster, method)(*args)
    assert info.value.status == 404
    assert not info.value.retryable
    assert len(fake_api.requests) == 1  # a 404 is not retried


@pytest.mark.parametrize(
    ("ref", "field", "message"),
    [
        (
            WorkloadRef("serving.example.com/v1", "Model", "m", NS),
            "spec.target.kind",
            "no /scale subresource",
        ),
        (WorkloadRef("v1", "Pod", "p", NS), "spec.target.kind", "no /scale subresource"),
        (
            WorkloadRef("serving.example.com/v1", "Inferenceservice", "m", NS),
            "spec.target.kind",
            "serves no kind",
        ),
        (
            WorkloadRef("nothere.example.com/v1", "Thing", "m", NS),
            "spec.target.apiVersion",
            "does not serve",
        ),
    ],
    ids=[
        "custom-kind-without-scale",
        "core-kind-without-scale",
        "misspelt-kind",
        "group-not-installed",
    ],
)
def test_targets_without_scale_are_config_errors(fake_api, cluster, ref, field, message):
    fake_api.register_type(INFERENCE_CR)
    fake_api.register_type(NO_SCALE_CR)
    with pytest.raises(ConfigError, match=message) as info:
        cluster.get_scale(ref)
    assert info.value.field == field
    assert fake_api.writes() == []


def test_dry_run_writes_nothing(fake_api, clock):
    fake_api.add_deployment(NS, "llm", replicas=1)
    dry = KubeCluster(fake_api.api_client, clock=clock, sleep=clock.advance, dry_run=True)
    assert dry.patch_scale(DEPLOYMENT, 9).replicas == 9  # what the server would do
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 1
    assert dry.ensure_placeholder(_scaler_spec(fake_api), 2).replicas == 2
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm") is None
    assert all(r.query.get("dryRun") == "All" for r in fake_api.writes())


# ------------------------------------------------------------ pods, nodes ---


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], PodCounts(0, 0, 0, 0)),
        ([dict(), dict(), dict()], PodCounts(3, 0, 0, 0)),
        ([dict(ready=False), dict(phase="Pending", ready=False)], PodCounts(0, 2, 0, 0)),
        ([dict(phase="Pending", scheduled=False)], PodCounts(0, 1, 1, 0)),
        ([dict(terminating=True), dict()], PodCounts(1, 0, 0, 1)),
        (
            [dict(phase="Succeeded", ready=False), dict(phase="Failed", ready=False)],
            PodCounts(0, 0, 0, 0),
        ),
        ([dict(phase="Pending", ready=True)], PodCounts(0, 1, 0, 0)),
    ],
    ids=[
        "none",
        "all-ready",
        "not-ready-and-pending",
        "unscheduled",
        "terminating",
        "finished",
        "ready-condition-but-not-running",
    ],
)
def test_list_pods_counts_ready_and_starting(fake_api, cluster, pods, expected):
    for i, kwargs in enumerate(pods):
        fake_api.add_pod(NS, f"llm-{i}", {"app": "llm"}, **kwargs)
    fake_api.add_pod(NS, "other", {"app": "other"})
    fake_api.add_pod("elsewhere", "llm-x", {"app": "llm"})
    assert cluster.list_pods(NS, "app=llm") == expected
    (request,) = fake_api.requests
    assert request.query == {"labelSelector": "app=llm", "limit": "500"}  # paginated


def test_list_pods_refuses_an_empty_selector(fake_api, cluster):
    with pytest.raises(ClusterError, match="selector"):
        cluster.list_pods(NS, "")
    assert fake_api.requests == []


def test_list_gpu_nodes_sums_free_gpus_per_usable_node(fake_api, cluster):
    fake_api.add_gpu_node("a", 8, {"pool": "gpu"})
    fake_api.add_gpu_node("b", 8, {"pool": "gpu"})
    fake_api.add_gpu_node("not-ready", 8, {"pool": "gpu"}, ready=False)
    fake_api.add_gpu_node("cordoned", 8, {"pool": "gpu"}, unschedulable=True)
    fake_api.add_gpu_node("cpu-only", 0, {"pool": "gpu"})
    fake_api.add_gpu_node("other-pool", 8, {"pool": "other"})
    fake_api.add_pod(NS, "llm-0", {"app": "llm"}, node="a", gpus=4)
    fake_api.add_pod("team", "big", {"app": "big"}, node="a", gpus=6)  # over-committed view
    fake_api.add_pod(NS, "llm-prewarm-x", manifests.placeholder_labels("llm"), node="b", gpus=2)
    fake_api.add_pod(NS, "done", {"app": "batch"}, node="b", gpus=8, phase="Succeeded", ready=False)
    fake_api.add_pod(NS, "other", {"app": "x"}, node="other-pool", gpus=8)
    capacity = cluster.list_gpu_nodes("pool=gpu")
    assert capacity.nodes == 2
    assert capacity.allocatable_gpus == 16
    assert capacity.requested_gpus == 12
    assert capacity.placeholder_gpus == 2
    assert capacity.free_gpus == 0 + 6  # node a cannot lend its deficit to node b
    pods_request = fake_api.requests[-1]
    assert pods_request.path == "/api/v1/pods"
    assert pods_request.query == {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed", "limit": "500"}


def test_no_gpu_nodes_skips_the_cluster_wide_pod_list(fake_api, cluster):
    fake_api.add_gpu_node("cpu", 0)
    capacity = cluster.list_gpu_nodes()
    assert (capacity.nodes, capacity.free_gpus) == (0, 0)
    assert [path for _, path in fake_api.calls()] == ["/api/v1/nodes"]


# ------------------------------------------------------------ placeholder ---


def test_placeholder_create_resize_retemplate_delete(fake_api, cluster):
    spec = _scaler_spec(fake_api)
    assert cluster.get_placeholder("llm", NS) is None

    created = cluster.ensure_placeholder(spec, 2)
    assert (created.replicas, created.gpus_per_pod, created.gpus) == (2, 4, 8)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")
    (owner,) = stored["metadata"]["ownerReferences"]
    assert owner["uid"] == spec.owner_uid and owner["controller"] and owner["blockOwnerDeletion"]
    assert stored["spec"]["template"]["spec"]["priorityClassName"] == (
        "predictive-scaler-placeholder"
    )

    resized = cluster.ensure_placeholder(spec, 5)
    assert resized.replicas == 5
    patch = fake_api.writes()[-1]
    assert (patch.method, patch.content_type) == ("PATCH", "application/merge-patch+json")
    assert patch.body["spec"] == {"replicas": 5}

    writes = len(fake_api.writes())
    assert cluster.ensure_placeholder(spec, 5).replicas == 5
    assert len(fake_api.writes()) == writes  # nothing to do, nothing written

    bigger = cluster.ensure_placeholder(_scaler_spec(fake_api, gpus_per_pod=8, image="vllm:1"), 5)
    assert (bigger.gpus_per_pod, bigger.gpus) == (8, 40)
    assert fake_api.writes()[-1].method == "PUT"
    container = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["template"][
        "spec"
    ]["containers"][0]
    assert container["image"] == "vllm:1"

    assert cluster.get_placeholder("llm", NS).gpus == 40
    assert cluster.delete_placeholder("llm", NS) is True
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm") is None
    delete = fake_api.writes()[-1]
    assert delete.body["preconditions"] == {"uid": stored["metadata"]["uid"]}
    assert cluster.delete_placeholder("llm", NS) is False


def test_placeholder_can_be_kept_at_zero(fake_api, cluster):
    spec = _scaler_spec(fake_api)
    cluster.ensure_placeholder(spec, 3)
    assert cluster.ensure_placeholder(spec, 0).gpus == 0
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["replicas"] == 0


def test_deleting_the_scaler_garbage_collects_its_placeholder(fake_api, cluster):
    cluster.ensure_placeholder(_scaler_spec(fake_api), 2)
    fake_api.delete(manifests.API_VERSION, manifests.KIND, NS, "llm")
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm") is None


def test_a_new_owner_uid_replaces_the_owner_reference(fake_api, cluster):
    cluster.ensure_placeholder(_scaler_spec(fake_api), 2)
    cluster.ensure_placeholder(_scaler_spec(fake_api, owner_uid="recreated-scaler-uid"), 2)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "recreated-scaler-uid"


def test_placeholder_name_clash_with_a_foreign_deployment_is_refused(fake_api, cluster):
    fake_api.add_deployment(NS, "llm-prewarm", replicas=1)
    with pytest.raises(ClusterError, match="not the placeholder"):
        cluster.ensure_placeholder(_scaler_spec(fake_api), 3)
    with pytest.raises(ClusterError, match="not the placeholder"):
        cluster.delete_placeholder("llm", NS)
    assert fake_api.writes() == []
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["replicas"] == 1


@pytest.mark.parametrize(
    ("existing", "inject", "statuses"),
    [
        (None, lambda f: f.fail_next(r"/deployments$", 409, method="POST"), [404, 409, 404, 201]),
        (1, lambda f: f.fail_next(r"llm-prewarm$", 409, method="PATCH"), [200, 409, 200, 200]),
        (
            1,
            lambda f: f.fail_next(r"llm-prewarm$", 503, times=2, method="GET"),
            [503, 503, 200, 200],
        ),
    ],
    ids=["create-already-exists", "patch-conflict", "read-outage"],
)
def test_ensure_placeholder_rereads_and_retries(fake_api, cluster, existing, inject, statuses):
    spec = _scaler_spec(fake_api)
    if existing is not None:
        cluster.ensure_placeholder(spec, existing)
    fake_api.requests.clear()
    inject(fake_api)
    assert cluster.ensure_placeholder(spec, 3).replicas == 3
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["replicas"] == 3
    assert [r.status for r in fake_api.requests] == statuses


# ------------------------------------------------------- other autoscalers ---


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda f: None, ()),
        (
            lambda f: f.add_hpa(NS, "llm-hpa", "Deployment", "llm"),
            (ConflictingAutoscaler("HorizontalPodAutoscaler", "llm-hpa", NS),),
        ),
        (
            lambda f: f.add_hpa(NS, "legacy", "Deployment", "llm", target_api_version=None),
            (ConflictingAutoscaler("HorizontalPodAutoscaler", "legacy", NS),),
        ),
        (
            lambda f: f.add_hpa(NS, "old", "Deployment", "llm", "extensions/v1beta1"),
            (ConflictingAutoscaler("HorizontalPodAutoscaler", "old", NS),),
        ),
        (lambda f: f.add_hpa(NS, "other", "Deployment", "other"), ()),
        (lambda f: f.add_hpa(NS, "sts", "StatefulSet", "llm"), ()),
        (lambda f: f.add_hpa("elsewhere", "llm-hpa", "Deployment", "llm"), ()),
        (
            lambda f: (f.install_keda(), f.add_scaled_object(NS, "llm-so", "llm")),
            (ConflictingAutoscaler("ScaledObject", "llm-so", NS),),
        ),
        (
            lambda f: (
                f.install_keda(),
                f.add_scaled_object(NS, "so", "llm", "StatefulSet", "apps/v1"),
            ),
            (),
        ),
        (
            lambda f: (
                f.install_keda(),
                f.add_scaled_object(NS, "so", "llm"),
                f.add_hpa(NS, "keda-hpa-so", "Deployment", "llm"),
            ),
            (
                ConflictingAutoscaler("HorizontalPodAutoscaler", "keda-hpa-so", NS),
                ConflictingAutoscaler("ScaledObject", "so", NS),
            ),
        ),
    ],
    ids=[
        "none",
        "hpa",
        "hpa-without-apiversion",
        "hpa-legacy-group",
        "hpa-other-name",
        "hpa-other-kind",
        "hpa-other-namespace",
        "keda-default-kind",
        "keda-other-kind",
        "keda-and-its-hpa",
    ],
)
def test_conflicting_autoscalers(fake_api, cluster, setup, expected):
    setup(fake_api)
    assert cluster.list_conflicting_autoscalers(DEPLOYMENT) == expected


HPA_V2BETA2 = ResourceType(
    "autoscaling", "v2beta2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", status=True
)


def _serve_hpa_versions(fake_api, versions):
    """Make the stand-in serve exactly these HorizontalPodAutoscaler versions (e.g. Kubernetes 1.20)."""
    if "v2beta2" in versions:
        fake_api.register_type(HPA_V2BETA2)
    if "v2" not in versions:
        fake_api.unregister_type("autoscaling", "v2", "horizontalpodautoscalers")


@pytest.mark.parametrize(
    ("versions", "listed"),
    [(("v2", "v2beta2"), "v2"), (("v2",), "v2"), (("v2beta2",), "v2beta2")],
    ids=["1.23-1.25-both", "1.26+-v2-only", "1.12-1.22-v2beta2-only"],
)
def test_hpa_version_is_discovered_not_assumed(fake_api, cluster, versions, listed):
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", "llm")
    _serve_hpa_versions(fake_api, versions)
    found = cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert found == (ConflictingAutoscaler("HorizontalPodAutoscaler", "llm-hpa", NS),)
    hpa_lists = [r.path for r in fake_api.requests if r.path.endswith("/horizontalpodautoscalers")]
    assert hpa_lists == [f"/apis/autoscaling/{listed}/namespaces/{NS}/horizontalpodautoscalers"]
    cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert [r.path for r in fake_api.requests].count("/apis/autoscaling") == 1  # remembered


def test_no_hpa_api_served_names_the_missing_api(fake_api, cluster):
    _serve_hpa_versions(fake_api, ())
    with pytest.raises(MissingApiError) as info:
        cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert info.value.api == "autoscaling/v2 or autoscaling/v2beta2"
    assert "serves neither autoscaling/v2 nor autoscaling/v2beta2" in str(info.value)
    assert not info.value.retryable


def test_a_version_that_disappears_is_discovered_again(fake_api, cluster):
    assert cluster.list_conflicting_autoscalers(DEPLOYMENT) == ()
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", "llm")
    _serve_hpa_versions(fake_api, ("v2beta2",))  # the server was replaced by one without v2
    assert len(cluster.list_conflicting_autoscalers(DEPLOYMENT)) == 1
    assert cluster.hpa_version() == "v2beta2"


def test_keda_not_installed_means_no_scaled_objects(fake_api, cluster):
    assert cluster.list_conflicting_autoscalers(DEPLOYMENT) == ()
    keda = [r for r in fake_api.requests if "keda.sh" in r.path]
    assert [r.status for r in keda] == [404]  # asked once, not retried


def test_forbidden_scaled_objects_is_an_error_not_absence(fake_api, cluster):
    fake_api.install_keda()
    fake_api.fail_next("scaledobjects", 403)
    with pytest.raises(ClusterError, match="RBAC") as info:
        cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert info.value.status == 403 and not info.value.retryable


# --------------------------------------------------- events and the scaler ---


def test_create_event_posts_a_core_v1_event(fake_api, cluster):
    scaler = fake_api.add_scaler(NS, "llm")
    ref = {
        "apiVersion": manifests.API_VERSION,
        "kind": manifests.KIND,
        "name": "llm",
        "namespace": NS,
        "uid": scaler["metadata"]["uid"],
    }
    cluster.create_event(
        ref, "ConflictingAutoscaler", "HPA ml/llm-hpa also scales llm", "Warning", NOW
    )
    (event,) = fake_api.objects("v1", "Event", NS)
    assert event["involvedObject"]["uid"] == scaler["metadata"]["uid"]
    assert (event["reason"], event["type"]) == ("ConflictingAutoscaler", "Warning")
    assert fake_api.requests[-1].path == "/api/v1/namespaces/ml/events"


def test_patch_status_merges_into_the_status_subresource_only(fake_api, cluster):
    fake_api.add_scaler(NS, "llm", {"mode": "scale"})
    cluster.patch_status("llm", NS, {"desiredReplicas": 4, "conditions": [{"type": "Ready"}]})
    cluster.patch_status("llm", NS, {"placeholderGpus": 8})
    stored = fake_api.get(manifests.API_VERSION, manifests.KIND, NS, "llm")
    assert stored["status"] == {
        "desiredReplicas": 4,
        "conditions": [{"type": "Ready"}],
        "placeholderGpus": 8,
    }
    assert stored["spec"] == {"mode": "scale"}
    patch = fake_api.requests[-1]
    assert patch.path.endswith("/predictivescalers/llm/status")
    assert patch.content_type == "application/merge-patch+json"


def test_patch_status_retries_a_conflict(fake_api, cluster):
    fake_api.add_scaler(NS, "llm")
    fake_api.fail_next("/status$", 409, method="PATCH")
    cluster.patch_status("llm", NS, {"desiredReplicas": 2})
    assert [r.status for r in fake_api.requests] == [409, 200]
    stored = fake_api.get(manifests.API_VERSION, manifests.KIND, NS, "llm")
    assert stored["status"] == {"desiredReplicas": 2}


def test_patch_status_refuses_nan_before_sending(fake_api, cluster):
    fake_api.add_scaler(NS, "llm")
    with pytest.raises(DataError, match="forecastP95"):
        cluster.patch_status("llm", NS, {"forecastP95": math.nan})
    assert fake_api.requests == []


def test_get_and_list_scalers(fake_api, cluster):
    fake_api.add_scaler(NS, "a")
    fake_api.add_scaler(NS, "b")
    fake_api.add_scaler("other", "c")
    assert cluster.get_scaler("a", NS)["metadata"]["name"] == "a"
    assert [s["metadata"]["name"] for s in cluster.list_scalers(NS)] == ["a", "b"]
    assert sorted(s["metadata"]["name"] for s in cluster.list_scalers()) == ["a", "b", "c"]
    assert all(s["kind"] == "PredictiveScaler" for s in cluster.list_scalers())
    with pytest.raises(ClusterError) as info:
        cluster.get_scaler("missing", NS)
    assert info.value.status == 404


# --------------------------------------------------------------- transport ---


def test_unreachable_api_server_is_a_retryable_cluster_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    config = Configuration(host=f"http://127.0.0.1:{port}")
    config.retries = False
    clock = FakeClock(NOW)
    with ApiClient(config) as api:
        cluster = KubeCluster(
            api, retry=NO_RETRY, clock=clock, sleep=clock.advance, rng=random.Random(0)
        )
        with pytest.raises(ClusterError, match="cannot reach the API server") as info:
            cluster.get_scale(DEPLOYMENT)
    assert info.value.retryable and info.value.status is None


# --------------------------------------------------------------- API_CALLS ---


def test_docs_list_exactly_the_api_calls():
    doc = (REPO / "docs" / "kube-api-calls.md").read_text()
    assert doc == api_calls_markdown(), (
        "regenerate: python -m predictive_scaler.kube.api_calls > docs/kube-api-calls.md"
    )


@pytest.mark.parametrize(
    ("method", "path", "resource"),
    [
        ("GET", "/apis/apps/v1/namespaces/ml/deployments/llm/scale", "{plural}/scale"),
        ("PATCH", "/api/v1/namespaces/ml/replicationcontrollers/x/scale", "{plural}/scale"),
        ("DELETE", "/apis/apps/v1/namespaces/ml/deployments/llm-prewarm", "deployments"),
        ("GET", "/api/v1/secrets", None),
        ("DELETE", "/api/v1/namespaces/ml/pods/x", None),
        (
            "PATCH",
            "/apis/autoscaling.predictive-scaler.io/v1alpha1/namespaces/ml/predictivescalers/x",
            None,
        ),
    ],
    ids=[
        "scale",
        "core-scale",
        "delete-placeholder",
        "no-secrets",
        "no-pod-delete",
        "no-spec-patch",
    ],
)
def test_api_call_for(method, path, resource):
    call = api_call_for(method, path)
    assert (call.resource if call else None) == resource


def test_a_tour_of_the_adapter_uses_every_documented_call(fake_api, cluster):
    fake_api.register_type(INFERENCE_CR)
    fake_api.install_keda()
    for kind in ("Deployment", "ReplicationController", "InferenceService"):
        _add_target(fake_api, kind)
    fake_api.add_gpu_node("a", 8)
    for ref in (
        DEPLOYMENT,
        WorkloadRef("v1", "ReplicationController", "llm", NS),
        WorkloadRef("serving.example.com/v1", "InferenceService", "llm", NS),
    ):
        cluster.patch_scale(ref, 7)
    with pytest.raises(ConfigError):
        cluster.get_scale(WorkloadRef("v1", "Pod", "llm", NS))
    cluster.list_pods(NS, "app=llm")
    cluster.list_gpu_nodes()
    spec = _scaler_spec(fake_api)
    cluster.ensure_placeholder(spec, 1)
    cluster.ensure_placeholder(spec, 2)
    cluster.ensure_placeholder(_scaler_spec(fake_api, gpus_per_pod=8), 2)
    cluster.delete_placeholder("llm", NS)
    assert cluster.priority_class_value(manifests.PLACEHOLDER_PRIORITY_CLASS) == -10
    cluster.list_conflicting_autoscalers(DEPLOYMENT)
    cluster.create_event(
        {
            "apiVersion": manifests.API_VERSION,
            "kind": manifests.KIND,
            "name": "llm",
            "namespace": NS,
        },
        "Test",
        "tour",
        "Normal",
        NOW,
    )
    cluster.get_scaler("llm", NS)
    cluster.list_scalers(NS)
    cluster.list_scalers()
    cluster.patch_status("llm", NS, {"ok": True})
    assert cluster.ping(timeout=2.0) is None
    _serve_hpa_versions(fake_api, ("v2beta2",))  # an older server: the v2beta2 row
    cluster.list_conflicting_autoscalers(DEPLOYMENT)
    # Shard Leases: create, list, renew (replace with the resourceVersion read).
    fake_api.register_type(ResourceType("coordination.k8s.io", "v1", "Lease", "leases", builtin=False))
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "predictive-scaler-shard-0", "namespace": "predictive-scaler-system",
                          "labels": {"predictive-scaler.io/shard": "0"}}, "spec": {"holderIdentity": "me"}}
    created = cluster.write_lease("predictive-scaler-system", lease)
    (listed,) = cluster.list_leases("predictive-scaler-system", "predictive-scaler.io/shard")
    assert listed["metadata"]["name"] == created["metadata"]["name"]
    cluster.write_lease("predictive-scaler-system", {**lease, "metadata": {
        **lease["metadata"], "resourceVersion": created["metadata"]["resourceVersion"]}})
    # The watch-fed cache: cluster-wide lists, then a watch of each collection.
    cache = ClusterCache(cluster, watch_timeout_seconds=1, resync_seconds=300.0).start()
    try:
        assert cache.wait_synced(10)
        deadline = time.monotonic() + 10
        while len({r.path for r in fake_api.requests if r.query.get("watch") == "true"}) < 4:
            assert time.monotonic() < deadline, "the cache did not watch its four collections within 10 s"
            time.sleep(0.05)
    finally:
        cache.stop(join_seconds=10)
    used = {api_call_for(r.method, r.path, watch=r.query.get("watch") == "true") for r in fake_api.requests}
    assert used == set(API_CALLS)


# ------------------------------------------------------ properties, config ---


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=6),  # placeholder replicas
            st.sampled_from([1, 2, 4, 8]),  # GPUs per pod
            st.sampled_from([None, 409, 429, 500, 503]),  # fault before the step
        ),
        min_size=1,
        max_size=5,
    )
)
def test_placeholder_converges_to_the_last_request_despite_faults(fake_api, cluster, steps):
    fake_api.delete_all_placeholders()
    spec = _scaler_spec(fake_api)
    for replicas, gpus, fault in steps:
        if fault == 429:
            fake_api.throttle(429, retry_after=1)
        elif fault is not None:
            fake_api.fail_next("llm-prewarm", fault)
        info = cluster.ensure_placeholder(_scaler_spec(fake_api, gpus_per_pod=gpus), replicas)
        assert (info.replicas, info.gpus_per_pod) == (replicas, gpus)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")
    last_replicas, last_gpus, _ = steps[-1]
    assert stored["spec"]["replicas"] == last_replicas
    requests = stored["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == str(last_gpus)
    assert spec.owner_uid == stored["metadata"]["ownerReferences"][0]["uid"]


def test_api_client_from_a_kubeconfig(tmp_path, monkeypatch, fake_api):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake_api.add_deployment(NS, "llm", replicas=2)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [
                    {"name": "fake", "cluster": {"server": fake_api.api_client.configuration.host}}
                ],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
            }
        )
    )
    with api_client_from_environment(str(kubeconfig)) as api:
        clock = FakeClock(NOW)
        cluster = KubeCluster(api, clock=clock, sleep=clock.advance)
        assert cluster.get_scale(DEPLOYMENT).replicas == 2
    (request,) = fake_api.requests
    assert request.path == SCALE_PATH


def test_api_client_without_credentials_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="--kubeconfig") as info:
        api_client_from_environment(str(tmp_path / "missing"))
    assert info.value.field == "kubeconfig"



@pytest.mark.parametrize(("status", "reachable"), [(None, True), (404, True), (401, False), (403, False),
                                                   (500, False), (503, False)],
                         ids=["answers", "answers-404", "unauthorised", "forbidden", "server-error", "unavailable"])
def test_ping_says_whether_the_api_server_is_reachable(fake_api, cluster, status, reachable):
    if status is not None:
        fake_api.fail_next("^/version$", status)
    problem = cluster.ping(timeout=2.0)
    assert (problem is None) is reachable, problem
    if not reachable:
        assert "check the API server" in problem


@pytest.mark.parametrize(("value", "gpus"), [(None, 0), ("8", 8), (8, 8), ("1k", 1000), ("2.0", 2)],
                         ids=["absent", "text", "int", "suffix", "decimal-whole"])
def test_gpu_quantities_are_kubernetes_quantities(value, gpus):
    from predictive_scaler.kube.pods import quantity_int

    assert quantity_int(value) == gpus


@pytest.mark.parametrize(("value", "words"), [("500m", "whole number"), ("1.5", "whole number"),
                                              ("-1", "≥ 0"), ("eight", "not a Kubernetes quantity")],
                         ids=["milli", "fraction", "negative", "not-a-quantity"])
def test_bad_gpu_quantities_are_named(value, words):
    from predictive_scaler.errors import DataError
    from predictive_scaler.kube.pods import quantity_int

    with pytest.raises(DataError, match=words):
        quantity_int(value)
