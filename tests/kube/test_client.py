"""KubeCluster as a whole (kube/client.py): dry-run writes nothing, and a tour of the adapter uses
every documented call. Each concern's own tests are in the test module named after it."""

from __future__ import annotations

import time

import pytest

from predictive_scaler.errors import ConfigError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.api_calls import API_CALLS, api_call_for
from predictive_scaler.kube.cache import ClusterCache
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.workloads import WorkloadRef
from tests.kube.shared import (
    DEPLOYMENT,
    INFERENCE_CR,
    NOW,
    NS,
    add_target,
    placeholder_spec,
    serve_hpa_versions,
)
from tests.support.fakes.apiserver import ResourceType


def test_dry_run_writes_nothing(fake_api, clock):
    fake_api.add_deployment(NS, "llm", replicas=1)
    dry = KubeCluster(fake_api.api_client, clock=clock, sleep=clock.advance, dry_run=True)
    assert dry.patch_scale(DEPLOYMENT, 9).replicas == 9  # what the server would do
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 1
    assert dry.ensure_placeholder(placeholder_spec(fake_api), 2).replicas == 2
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm") is None
    assert all(r.query.get("dryRun") == "All" for r in fake_api.writes())


def test_a_tour_of_the_adapter_uses_every_documented_call(fake_api, cluster):
    fake_api.register_type(INFERENCE_CR)
    fake_api.install_keda()
    for kind in ("Deployment", "ReplicationController", "InferenceService"):
        add_target(fake_api, kind)
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
    spec = placeholder_spec(fake_api)
    cluster.ensure_placeholder(spec, 1)
    cluster.ensure_placeholder(spec, 2)
    cluster.ensure_placeholder(placeholder_spec(fake_api, gpus_per_pod=8), 2)
    cluster.delete_placeholder("llm", NS)
    assert cluster.priority_class_value(manifests.PLACEHOLDER_PRIORITY_CLASS) == -10
    cluster.list_conflicting_autoscalers(DEPLOYMENT)
    posted = cluster.create_event(
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
    cluster.repeat_event(NS, posted, 2, NOW)
    cluster.get_scaler("llm", NS)
    cluster.list_scalers(NS)
    cluster.list_scalers()
    cluster.namespace_labels(NS)
    cluster.patch_status("llm", NS, {"ok": True})
    assert cluster.ping(timeout=2.0) is None
    serve_hpa_versions(fake_api, ("v2beta2",))  # an older server: the v2beta2 row
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
