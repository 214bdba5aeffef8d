"""The PredictiveScaler and its Events (kube/scalers.py): core/v1 Events, status merge patches,
get and list."""

from __future__ import annotations

import math

import pytest

from predictive_scaler.errors import ClusterError, DataError
from predictive_scaler.kube import manifests
from tests.kube.shared import NOW, NS


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
