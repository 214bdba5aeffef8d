"""Pods and GPU nodes (kube/pods.py): counting as the HPA does, free GPUs per usable node, GPU
quantities read as Kubernetes quantities."""

from __future__ import annotations

import pytest

from predictive_scaler.errors import ClusterError, DataError
from predictive_scaler.kube import manifests
from predictive_scaler.kube.pods import PodCounts
from tests.kube.shared import NS


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


@pytest.mark.parametrize(("value", "gpus"), [(None, 0), ("8", 8), (8, 8), ("1k", 1000), ("2.0", 2)],
                         ids=["absent", "text", "int", "suffix", "decimal-whole"])
def test_gpu_quantities_are_kubernetes_quantities(value, gpus):
    from predictive_scaler.kube.pods import quantity_int

    assert quantity_int(value) == gpus


@pytest.mark.parametrize(("value", "words"), [("500m", "whole number"), ("1.5", "whole number"),
                                              ("-1", "≥ 0"), ("eight", "not a Kubernetes quantity")],
                         ids=["milli", "fraction", "negative", "not-a-quantity"])
def test_bad_gpu_quantities_are_named(value, words):
    from predictive_scaler.kube.pods import quantity_int

    with pytest.raises(DataError, match=words):
        quantity_int(value)
