"""Discovery (kube/discovery.py): kinds without ``/scale`` are config errors; the HPA version is
discovered, not assumed, and discovered again when it disappears."""

from __future__ import annotations

import pytest

from predictive_scaler.errors import ConfigError, MissingApiError
from predictive_scaler.kube.autoscalers import ConflictingAutoscaler
from predictive_scaler.kube.workloads import WorkloadRef
from tests.kube.shared import DEPLOYMENT, INFERENCE_CR, NO_SCALE_CR, NS, serve_hpa_versions


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


@pytest.mark.parametrize(
    ("versions", "listed"),
    [(("v2", "v2beta2"), "v2"), (("v2",), "v2"), (("v2beta2",), "v2beta2")],
    ids=["1.23-1.25-both", "1.26+-v2-only", "1.12-1.22-v2beta2-only"],
)
def test_hpa_version_is_discovered_not_assumed(fake_api, cluster, versions, listed):
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", "llm")
    serve_hpa_versions(fake_api, versions)
    found = cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert found == (ConflictingAutoscaler("HorizontalPodAutoscaler", "llm-hpa", NS),)
    hpa_lists = [r.path for r in fake_api.requests if r.path.endswith("/horizontalpodautoscalers")]
    assert hpa_lists == [f"/apis/autoscaling/{listed}/namespaces/{NS}/horizontalpodautoscalers"]
    cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert [r.path for r in fake_api.requests].count("/apis/autoscaling") == 1  # remembered


def test_no_hpa_api_served_names_the_missing_api(fake_api, cluster):
    serve_hpa_versions(fake_api, ())
    with pytest.raises(MissingApiError) as info:
        cluster.list_conflicting_autoscalers(DEPLOYMENT)
    assert info.value.api == "autoscaling/v2 or autoscaling/v2beta2"
    assert "serves neither autoscaling/v2 nor autoscaling/v2beta2" in str(info.value)
    assert not info.value.retryable


def test_a_version_that_disappears_is_discovered_again(fake_api, cluster):
    assert cluster.list_conflicting_autoscalers(DEPLOYMENT) == ()
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", "llm")
    serve_hpa_versions(fake_api, ("v2beta2",))  # the server was replaced by one without v2
    assert len(cluster.list_conflicting_autoscalers(DEPLOYMENT)) == 1
    assert cluster.hpa_version() == "v2beta2"
