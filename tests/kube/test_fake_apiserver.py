"""The fake API server must behave like the real one where the adapter could
get it wrong: otherwise the adapter's tests prove nothing. These tests speak
raw HTTP (and the typed kubernetes client) to it."""

from __future__ import annotations

import json

import pytest
from kubernetes.client import AppsV1Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from tests.support.fakes.apiserver import FakeApiServer

NS = "ml"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
SCALERS = f"/apis/autoscaling.predictive-scaler.io/v1alpha1/namespaces/{NS}/predictivescalers"


def _call(
    fake: FakeApiServer,
    method: str,
    path: str,
    body=None,
    content_type: str = "application/json",
    query=None,
):
    api = fake.api_client
    _, url, headers, body, _ = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list((query or {}).items()) or None,
        header_params={"Accept": "application/json", "Content-Type": content_type},
        body=body,
    )
    response = api.call_api(method, url, header_params=headers, body=body)
    data = response.read()
    return response.status, (json.loads(data) if data else None), response.headers


def _deployment(name="web", labels=None, template_labels=None, **spec):
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": template_labels or labels},
                "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]},
            },
            **spec,
        },
    }


def test_create_assigns_server_fields_and_refuses_duplicates(fake_api):
    status, created, _ = _call(fake_api, "POST", DEPLOYMENTS, _deployment())
    assert status == 201
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    status, body, _ = _call(fake_api, "POST", DEPLOYMENTS, _deployment())
    assert (status, body["reason"], body["kind"]) == (409, "AlreadyExists", "Status")


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (_deployment(template_labels={"app": "other"}), 422, "Invalid"),
        (_deployment(unknownField=1), 422, "Invalid"),
        ({**_deployment(), "kind": "StatefulSet"}, 400, "BadRequest"),
        ({**_deployment(), "metadata": {"name": "web", "namespace": "other"}}, 400, "BadRequest"),
        ({**_deployment(), "metadata": {"namespace": NS}}, 422, "Invalid"),
        (
            {**_deployment(), "metadata": {"name": "w", "ownerReferences": [{"kind": "X"}]}},
            422,
            "Invalid",
        ),
        ([1, 2], 400, "BadRequest"),
    ],
    ids=[
        "selector-mismatch",
        "unknown-field-strict",
        "wrong-kind",
        "namespace-mismatch",
        "no-name",
        "owner-reference-without-uid",
        "not-an-object",
    ],
)
def test_create_checks_the_body(fake_api, body, status, reason):
    got_status, got, _ = _call(fake_api, "POST", DEPLOYMENTS, body)
    assert (got_status, got["reason"]) == (status, reason)
    assert fake_api.objects("apps/v1", "Deployment") == []


def test_stale_resource_version_is_a_conflict_on_put_patch_and_scale(fake_api):
    stored = fake_api.add_deployment(NS, "web", replicas=1)
    stale = stored["metadata"]["resourceVersion"]
    fake_api.touch("apps/v1", "Deployment", NS, "web")
    body = _deployment()
    body["metadata"]["resourceVersion"] = stale
    assert _call(fake_api, "PUT", f"{DEPLOYMENTS}/web", body)[0] == 409
    patch = {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 3}}
    for path in (f"{DEPLOYMENTS}/web", f"{DEPLOYMENTS}/web/scale"):
        status, answer, _ = _call(fake_api, "PATCH", path, patch, "application/merge-patch+json")
        assert (status, answer["reason"]) == (409, "Conflict")
    assert fake_api.get("apps/v1", "Deployment", NS, "web")["spec"]["replicas"] == 1


def test_every_write_bumps_the_resource_version(fake_api):
    fake_api.add_deployment(NS, "web", replicas=1)
    versions = []
    for replicas in (2, 3, 4):
        _, scale, _ = _call(
            fake_api,
            "PATCH",
            f"{DEPLOYMENTS}/web/scale",
            {"spec": {"replicas": replicas}},
            "application/merge-patch+json",
        )
        versions.append(int(scale["metadata"]["resourceVersion"]))
    assert versions == sorted(set(versions))
    assert fake_api.get("apps/v1", "Deployment", NS, "web")["metadata"]["generation"] == 4


@pytest.mark.parametrize(
    ("path", "content_type", "status"),
    [
        (f"{SCALERS}/s/status", "application/strategic-merge-patch+json", 415),
        (f"{SCALERS}/s/status", "application/json", 415),
        (f"{SCALERS}/s/status", "application/merge-patch+json", 200),
        (f"{DEPLOYMENTS}/web", "application/strategic-merge-patch+json", 200),
        (f"{DEPLOYMENTS}/web", "text/plain", 415),
    ],
    ids=[
        "strategic-on-custom-resource",
        "plain-json-patch",
        "merge-on-custom-resource",
        "strategic-on-built-in",
        "text",
    ],
)
def test_patch_content_types_are_checked(fake_api, path, content_type, status):
    fake_api.add_scaler(NS, "s")
    fake_api.add_deployment(NS, "web")
    body = {"status": {"x": 1}} if "status" in path else {"spec": {"replicas": 2}}
    if content_type.startswith("text/"):
        body = json.dumps(body)  # the client only sends pre-serialised text bodies
    assert _call(fake_api, "PATCH", path, body, content_type)[0] == status


def test_status_subresource_and_main_resource_own_their_halves(fake_api):
    fake_api.add_scaler(NS, "s", {"mode": "scale"})
    _call(
        fake_api,
        "PATCH",
        f"{SCALERS}/s/status",
        {"spec": {"mode": "hacked"}, "status": {"ready": True}},
        "application/merge-patch+json",
    )
    _call(
        fake_api,
        "PATCH",
        f"{SCALERS}/s",
        {"status": {"ready": False}},
        "application/merge-patch+json",
    )
    stored = fake_api.get("autoscaling.predictive-scaler.io/v1alpha1", "PredictiveScaler", NS, "s")
    assert stored["spec"] == {"mode": "scale"}
    assert stored["status"] == {"ready": True}


def test_json_patch_is_applied(fake_api):
    fake_api.add_deployment(NS, "web", replicas=1)
    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": "/spec/replicas", "value": 5},
    ]
    assert (
        _call(fake_api, "PATCH", f"{DEPLOYMENTS}/web", ops, "application/json-patch+json")[0] == 200
    )
    assert fake_api.get("apps/v1", "Deployment", NS, "web")["spec"]["replicas"] == 5


def test_negative_scale_is_invalid(fake_api):
    fake_api.add_deployment(NS, "web")
    status, body, _ = _call(
        fake_api,
        "PATCH",
        f"{DEPLOYMENTS}/web/scale",
        {"spec": {"replicas": -1}},
        "application/merge-patch+json",
    )
    assert (status, body["reason"]) == (422, "Invalid")


def test_delete_checks_the_uid_precondition(fake_api):
    fake_api.add_deployment(NS, "web")
    options = {"preconditions": {"uid": "someone-else"}}
    assert _call(fake_api, "DELETE", f"{DEPLOYMENTS}/web", options)[0] == 409
    assert fake_api.get("apps/v1", "Deployment", NS, "web") is not None
    assert _call(fake_api, "DELETE", f"{DEPLOYMENTS}/web")[0] == 200
    assert _call(fake_api, "DELETE", f"{DEPLOYMENTS}/web")[0] == 404


def test_dry_run_validates_but_persists_nothing(fake_api):
    assert _call(fake_api, "POST", DEPLOYMENTS, _deployment(), query={"dryRun": "All"})[0] == 201
    assert fake_api.objects("apps/v1", "Deployment") == []
    bad = _deployment(template_labels={"app": "x"})
    assert _call(fake_api, "POST", DEPLOYMENTS, bad, query={"dryRun": "All"})[0] == 422


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("", ["a", "b", "c", "d"]),
        ("app=llm", ["a", "b"]),
        ("app==llm,tier=gpu", ["a"]),
        ("app!=llm", ["c", "d"]),
        ("app in (llm, web)", ["a", "b", "c"]),
        ("app notin (llm)", ["c", "d"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b", "d"]),
    ],
    ids=["all", "equals", "double-equals-and", "not-equals", "in", "notin", "exists", "not-exists"],
)
def test_label_selectors(fake_api, selector, names):
    fake_api.add_pod(NS, "a", {"app": "llm", "tier": "gpu"})
    fake_api.add_pod(NS, "b", {"app": "llm"})
    fake_api.add_pod(NS, "c", {"app": "web", "tier": "cpu"})
    fake_api.add_pod(NS, "d", {})
    _, listing, _ = _call(
        fake_api,
        "GET",
        f"/api/v1/namespaces/{NS}/pods",
        query={"labelSelector": selector} if selector else None,
    )
    assert [p["metadata"]["name"] for p in listing["items"]] == names
    assert listing["kind"] == "PodList"
    assert all("kind" not in p for p in listing["items"])  # like the real typed lists


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"fieldSelector": "spec.nodeName=n1"}, 200),
        ({"fieldSelector": "spec.priority=1"}, 400),
        ({"labelSelector": "a in (b"}, 400),
    ],
    ids=["supported-field", "unsupported-field", "unbalanced-selector"],
)
def test_selector_errors_are_bad_requests(fake_api, query, status):
    assert _call(fake_api, "GET", "/api/v1/pods", query=query)[0] == status


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/apis/apps/v1", 200),
        ("/apis/keda.sh/v1alpha1", 404),
        ("/apis/keda.sh/v1alpha1/namespaces/ml/scaledobjects", 404),
        ("/apis/apps/v1/namespaces/ml/deployments/web/exec", 404),
        ("/api/v1/namespaces/ml/nodes", 404),
        ("/healthz", 404),
    ],
    ids=[
        "discovery",
        "absent-group-discovery",
        "absent-crd",
        "unknown-subresource",
        "cluster-scoped-in-namespace",
        "non-api",
    ],
)
def test_routing(fake_api, path, status):
    assert _call(fake_api, "GET", path)[0] == status


def test_discovery_lists_scale_and_status_subresources(fake_api):
    _, listing, _ = _call(fake_api, "GET", "/apis/apps/v1")
    names = {r["name"] for r in listing["resources"]}
    assert {"deployments", "deployments/scale", "deployments/status"} <= names
    assert listing["groupVersion"] == "apps/v1"


def test_faults_are_counted_and_recorded(fake_api):
    fake_api.add_deployment(NS, "web")
    fake_api.fail_next(r"/web$", 500, times=2, method="GET")
    fake_api.throttle(429, retry_after=3, times=1)
    statuses = [_call(fake_api, "GET", f"{DEPLOYMENTS}/web")[0] for _ in range(4)]
    assert statuses == [500, 500, 429, 200]
    assert fake_api.requests[2].status == 429
    fake_api.throttle(429, retry_after=3)
    assert _call(fake_api, "GET", f"{DEPLOYMENTS}/web")[2]["Retry-After"] == "3"
    fake_api.outage(503, requests=3)
    assert [_call(fake_api, "GET", "/api/v1/nodes")[0] for _ in range(4)] == [503] * 3 + [200]
    fake_api.fail_every_nth_patch(2, 409)

    def patch() -> int:
        body = {"spec": {"replicas": 2}}
        return int(_call(fake_api, "PATCH", f"{DEPLOYMENTS}/web", body, "application/merge-patch+json")[0])

    assert [patch() for _ in range(4)] == [200, 409, 200, 409]
    fake_api.clear_faults()
    assert patch() == 200
    assert fake_api.calls()[0] == ("GET", f"{DEPLOYMENTS}/web")


def test_typed_kubernetes_client_understands_the_responses(fake_api):
    fake_api.add_deployment(NS, "web", replicas=2)
    fake_api.add_pod(NS, "web-1", {"app": "web"}, node="n1", gpus=1)
    fake_api.add_scaler(NS, "s")
    scale = AppsV1Api(fake_api.api_client).read_namespaced_deployment_scale("web", NS)
    assert (scale.spec.replicas, scale.status.selector) == (2, "app=web")
    pods = CoreV1Api(fake_api.api_client).list_namespaced_pod(NS, label_selector="app=web")
    assert pods.items[0].spec.node_name == "n1"
    scaler = CustomObjectsApi(fake_api.api_client).get_namespaced_custom_object(
        "autoscaling.predictive-scaler.io", "v1alpha1", NS, "predictivescalers", "s"
    )
    assert scaler["spec"] == {"mode": "forecast-only"}
    with pytest.raises(ApiException) as info:
        AppsV1Api(fake_api.api_client).read_namespaced_deployment("missing", NS)
    assert info.value.status == 404
