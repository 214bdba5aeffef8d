"""The watch-fed cluster cache answers what the direct reads answer, follows changes, and says when it is stale."""

from __future__ import annotations

import time

import pytest

from predictive_scaler.errors import ClusterError
from predictive_scaler.kube.cache import (
    HPAS,
    NODES,
    PODS,
    SCALED_OBJECTS,
    ClusterCache,
    parse_selector,
)
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.workloads import WorkloadRef
from tests.support.fakes.apiserver import FakeApiServer


def _eventually(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("the cache did not catch up within 10 s")
        time.sleep(0.05)


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    ("app=llm", {"app": "llm"}, True),
    ("app==llm", {"app": "other"}, False),
    ("app=llm,tier!=batch", {"app": "llm", "tier": "batch"}, False),
    ("app=llm,tier!=batch", {"app": "llm"}, True),
    ("tier in (a, b),app", {"tier": "b", "app": "x"}, True),
    ("tier notin (a,b)", {"tier": "a"}, False),
    ("!canary", {"canary": "1"}, False),
    ("!canary", {}, True),
], ids=["eq", "double-eq-miss", "neq-present", "neq-absent", "in-and-exists", "notin", "not-exists-miss",
        "not-exists"])
def test_selector(selector, labels, matches):
    assert all(r.matches(labels) for r in parse_selector(selector)) is matches


@pytest.mark.parametrize("selector", ["app in a", "app=(a,b)", "!app=x", "a b"], ids=["in-no-set", "eq-set",
                                                                                   "neg-op", "space"])
def test_bad_selector_is_named(selector):
    with pytest.raises(ClusterError, match="label selector"):
        parse_selector(selector)


@pytest.fixture
def cache(fake_api: FakeApiServer, cluster: KubeCluster):
    c = ClusterCache(cluster, watch_timeout_seconds=1, resync_seconds=300.0)
    yield c
    c.stop(join_seconds=10)


def test_cache_answers_what_the_direct_reads_answer_and_follows_changes(fake_api, cluster, cache):
    fake_api.add_gpu_node("gpu-a", 8, {"pool": "a100"})
    fake_api.add_gpu_node("gpu-b", 8, {"pool": "h100"})
    fake_api.add_gpu_node("gpu-down", 8, ready=False)
    for k in range(3):
        fake_api.add_pod("ml", f"llm-{k}", {"app": "llm"}, node="gpu-a", gpus=2)
    fake_api.add_pod("ml", "llm-pending", {"app": "llm"}, ready=False)
    fake_api.add_pod("ml", "other", {"app": "other"}, node="gpu-b", gpus=1)
    fake_api.add_pod("ml", "done", {"app": "llm"}, phase="Succeeded", node="gpu-b", gpus=4)
    fake_api.add_hpa("ml", "hpa", "Deployment", "llm")
    fake_api.install_keda()
    target = WorkloadRef("apps/v1", "Deployment", "llm", "ml")
    cache.start()
    assert cache.wait_synced(10)
    assert cache.fresh()
    assert cache.pod_counts("ml", "app=llm") == cluster.list_pods("ml", "app=llm")
    assert cache.gpu_capacity() == cluster.list_gpu_nodes()
    assert cache.gpu_capacity({"pool": "h100"}) == cluster.list_gpu_nodes("pool=h100")
    assert cache.conflicts(target) == cluster.list_conflicting_autoscalers(target)
    assert cache.reflectors[SCALED_OBJECTS].synced.is_set() and not cache.reflectors[SCALED_OBJECTS].absent

    # Changes arrive through the watch, not through a new list.
    lists_before = {name: r.lists for name, r in cache.reflectors.items()}
    fake_api.add_pod("ml", "llm-3", {"app": "llm"}, node="gpu-a", gpus=2)
    fake_api.add_scaled_object("ml", "so", "llm")
    _eventually(lambda: cache.pod_counts("ml", "app=llm").ready == 4 and len(cache.conflicts(target)) == 2)
    assert cache.gpu_capacity() == cluster.list_gpu_nodes()
    assert cache.conflicts(target) == cluster.list_conflicting_autoscalers(target)
    assert {name: r.lists for name, r in cache.reflectors.items()} == lists_before


def test_lists_are_paginated_and_keda_absent_is_empty(fake_api, cluster, cache):
    cache.start()
    assert cache.wait_synced(10)
    pod_lists = [r for r in fake_api.requests if r.path == "/api/v1/pods" and "watch" not in r.query]
    assert pod_lists and all(r.query.get("limit") == "500" for r in pod_lists)
    # The watch from the list's resourceVersion opens just after the list synced the cache.
    _eventually(lambda: any(r.query.get("watch") == "true" and r.query.get("resourceVersion")
                            for r in list(fake_api.requests) if r.path == "/api/v1/pods"))
    assert cache.reflectors[SCALED_OBJECTS].absent and cache.fresh(SCALED_OBJECTS)
    # Absent stays known-current: asked again at every watch timeout (1 s here), so never stale.
    _eventually(lambda: cache.reflectors[SCALED_OBJECTS].absent_checks >= 3)
    assert cache.conflicts(WorkloadRef("apps/v1", "Deployment", "llm", "ml")) == ()


def test_staleness_is_bounded_and_reported(fake_api, cluster):
    now = [1000.0]
    c = ClusterCache(cluster, max_staleness_seconds=120, clock=lambda: now[0])
    assert not c.fresh(), "nothing listed yet: stale"
    assert c.stale_for()[PODS] == float("inf")
    for reflector in c.reflectors.values():
        reflector.synced.set()
        reflector.last_ok = 1000.0
    now[0] += 60
    assert c.fresh() and c.stale_for()[NODES] == 60
    now[0] += 61
    assert not c.fresh(PODS) and not c.fresh(HPAS)
    c.reflectors[PODS].connected = True
    assert c.fresh(PODS) and c.stale_for()[PODS] == 0


def test_a_broken_watch_is_re_listed(fake_api, cluster, cache):
    fake_api.add_gpu_node("gpu-a", 8)
    cache.start()
    assert cache.wait_synced(10)
    fake_api.outage(status=503, requests=3)
    fake_api.add_pod("ml", "late", {"app": "late"}, node="gpu-a", gpus=8)
    _eventually(lambda: cache.pod_counts("ml", "app=late").ready == 1)
    assert cache.gpu_capacity().free_gpus == 0
