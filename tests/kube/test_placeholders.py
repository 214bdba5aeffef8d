"""The placeholder Deployment (kube/placeholders.py): create, resize, re-template, delete, owner
references, a foreign Deployment refused, convergence despite faults."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictive_scaler.errors import ClusterError
from predictive_scaler.kube import manifests
from tests.kube.shared import NS, placeholder_spec


def test_placeholder_create_resize_retemplate_delete(fake_api, cluster):
    spec = placeholder_spec(fake_api)
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

    bigger = cluster.ensure_placeholder(placeholder_spec(fake_api, gpus_per_pod=8, image="vllm:1"), 5)
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
    spec = placeholder_spec(fake_api)
    cluster.ensure_placeholder(spec, 3)
    assert cluster.ensure_placeholder(spec, 0).gpus == 0
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["replicas"] == 0


def test_deleting_the_scaler_garbage_collects_its_placeholder(fake_api, cluster):
    cluster.ensure_placeholder(placeholder_spec(fake_api), 2)
    fake_api.delete(manifests.API_VERSION, manifests.KIND, NS, "llm")
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm") is None


def test_a_new_owner_uid_replaces_the_owner_reference(fake_api, cluster):
    cluster.ensure_placeholder(placeholder_spec(fake_api), 2)
    cluster.ensure_placeholder(placeholder_spec(fake_api, owner_uid="recreated-scaler-uid"), 2)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "recreated-scaler-uid"


def test_placeholder_name_clash_with_a_foreign_deployment_is_refused(fake_api, cluster):
    fake_api.add_deployment(NS, "llm-prewarm", replicas=1)
    with pytest.raises(ClusterError, match="not the placeholder"):
        cluster.ensure_placeholder(placeholder_spec(fake_api), 3)
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
    spec = placeholder_spec(fake_api)
    if existing is not None:
        cluster.ensure_placeholder(spec, existing)
    fake_api.requests.clear()
    inject(fake_api)
    assert cluster.ensure_placeholder(spec, 3).replicas == 3
    assert fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["replicas"] == 3
    assert [r.status for r in fake_api.requests] == statuses


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
    spec = placeholder_spec(fake_api)
    for replicas, gpus, fault in steps:
        if fault == 429:
            fake_api.throttle(429, retry_after=1)
        elif fault is not None:
            fake_api.fail_next("llm-prewarm", fault)
        info = cluster.ensure_placeholder(placeholder_spec(fake_api, gpus_per_pod=gpus), replicas)
        assert (info.replicas, info.gpus_per_pod) == (replicas, gpus)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")
    last_replicas, last_gpus, _ = steps[-1]
    assert stored["spec"]["replicas"] == last_replicas
    requests = stored["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == str(last_gpus)
    assert spec.owner_uid == stored["metadata"]["ownerReferences"][0]["uid"]
