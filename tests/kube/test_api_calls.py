"""API_CALLS (kube/api_calls.py): the generated document matches, requests map to their rows."""

from __future__ import annotations

import pytest

from predictive_scaler.kube.api_calls import api_call_for, api_calls_markdown
from tests.kube.shared import REPO


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
