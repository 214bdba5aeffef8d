"""Other autoscalers on the target (kube/autoscalers.py): HPAs and KEDA ScaledObjects that scale
it, KEDA absent versus forbidden."""

from __future__ import annotations

import pytest

from predictive_scaler.errors import ClusterError
from predictive_scaler.kube.autoscalers import ConflictingAutoscaler
from tests.kube.shared import DEPLOYMENT, NS


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
