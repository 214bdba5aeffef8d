"""The real `predictive-scaler controller` process against a real Kubernetes 1.20 API server (built from
source, RBAC on, production admission plugins, deploy/ applied) and a real Prometheus.

Each scenario has its own namespace; one controller process (cluster-wide, the controller's own
ServiceAccount token) serves them all, reconciling every 5 s. What the API server did is read back
from the server itself: objects, Events, and its audit log (every request, with user and answer).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from predictive_scaler import crd
from predictive_scaler.crd import PAUSE_ANNOTATION
from predictive_scaler.kube import manifests
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.kubeconfig import api_client_from_environment
from predictive_scaler.kube.manifests import GROUP, PLURAL, VERSION
from predictive_scaler.kube.placeholders import PlaceholderSpec
from predictive_scaler.kube.workloads import WorkloadRef
from tests.deploy.test_rbac import KOPF_NEEDS, adapter_needs, admission_needs
from tests.deploy.test_servicemonitor import OPERATOR_TARGET_LABELS, SERVICE_MONITOR
from tests.e2e.conftest import (
    CONTROLLER_SA,
    MODEL,
    SCALER_API,
    ControllerProcess,
    condition,
    events,
    get_deployment,
    get_scaler,
    make_target,
    scaler_manifest,
    wait_for_events,
)
from tests.support.kubeapi import KubeApiServer
from tests.support.prometheus import running_prometheus

SA_USER = f"system:serviceaccount:{crd.CONTROLLER_NAMESPACE}:{CONTROLLER_SA}"
PLACEHOLDER = manifests.placeholder_name(MODEL)
pytestmark = pytest.mark.usefixtures("controller")


def reconciled(api: KubeApiServer, namespace: str, after: str | None = None, timeout: float = 90) -> dict[str, Any]:
    """The scaler once the controller has written a status (newer than ``after``)."""
    def done() -> dict[str, Any] | None:
        obj = get_scaler(api, namespace)
        last = ((obj or {}).get("status") or {}).get("lastReconcileTime")
        return obj if last and (after is None or last > after) else None
    return dict(api.wait_for(f"a reconcile of {namespace}/{MODEL}", done, timeout=timeout))


def replicas(api: KubeApiServer, namespace: str, name: str = MODEL) -> int | None:
    obj = get_deployment(api, namespace, name)
    return None if obj is None else int(obj["spec"]["replicas"])


def patch_scaler(api: KubeApiServer, namespace: str, patch: dict[str, Any]) -> None:
    answer = api.request("PATCH", f"{SCALER_API}/namespaces/{namespace}/{PLURAL}/{MODEL}", body=patch,
                         content_type="application/merge-patch+json")
    assert answer.status_code == 200, answer.text


def scale_writes(api: KubeApiServer, namespace: str) -> list[dict[str, Any]]:
    return [e for e in api.audit(SA_USER) if e["verb"] in ("patch", "update")
            and e["objectRef"].get("subresource") == "scale" and e["objectRef"].get("namespace") == namespace]


# -- the custom resource ---------------------------------------------------------------------------

def test_a_scaler_is_accepted_defaulted_and_listed(kube_api: KubeApiServer) -> None:
    ns = "e2e-forecast"
    make_target(kube_api, ns)
    minimal = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PredictiveScaler",
               "metadata": {"name": MODEL, "namespace": ns},
               "spec": {"mode": "forecast-only", "target": {"name": MODEL},
                        "demand": {"kind": "requests", "query": scaler_manifest(ns)["spec"]["demand"]["query"]},
                        "capacity": {"requestsPerReplica": 10}, "maxReplicas": 12, "model": {"name": MODEL},
                        "unknownField": "pruned"}}
    # Sent as is (kubectl would refuse the unknown field on the client): the server prunes it.
    answer = kube_api.request("POST", f"{SCALER_API}/namespaces/{ns}/{PLURAL}", body=minimal)
    assert answer.status_code == 201, answer.text
    stored = get_scaler(kube_api, ns)
    assert stored is not None
    spec = stored["spec"]
    # Defaulted by the API server from the CRD's structural schema; unknown fields pruned.
    assert spec["target"]["apiVersion"] == "apps/v1" and spec["target"]["kind"] == "Deployment"
    assert spec["quantile"] == 0.95 and spec["minReplicas"] == 1
    assert "unknownField" not in spec
    status = reconciled(kube_api, ns)["status"]
    listed = kube_api.kubectl("get", "pscaler", "-n", ns).stdout.splitlines()
    assert listed[0].split()[:4] == ["NAME", "TARGET", "MODE", "STRATEGY"], listed
    row = listed[1].split()
    assert row[:3] == [MODEL, MODEL, "forecast-only"] and row[3] == status["strategy"], listed


def test_forecast_only_writes_status_and_events_but_never_scale(kube_api: KubeApiServer) -> None:
    ns = "e2e-forecast"  # the scaler of the test above
    first = reconciled(kube_api, ns)["status"]["lastReconcileTime"]
    obj = reconciled(kube_api, ns, after=first, timeout=60)  # a second period, still hands off
    status = obj["status"]
    assert status["strategy"] == "predictive" and status["desiredReplicas"] >= 1
    assert status["forecast"]["p95"], "the forecast is in the status"
    assert condition(obj, "ModelInvalid")["status"] == "False"  # type: ignore[index]
    assert replicas(kube_api, ns) == 2, "forecast-only changed the target"
    assert get_deployment(kube_api, ns, PLACEHOLDER) is None
    assert scale_writes(kube_api, ns) == [], "forecast-only patched /scale"
    reasons = {e["reason"] for e in events(kube_api, ns) if e["involvedObject"]["kind"] == "PredictiveScaler"}
    assert "ForecastOnly" in reasons, reasons


def status_command(api: KubeApiServer, *args: str) -> str:
    exe = Path(sys.executable).with_name("predictive-scaler")
    done = subprocess.run([str(exe), "status", f"--kubeconfig={api.admin_kubeconfig}", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_the_status_command_shows_what_the_controller_wrote(kube_api: KubeApiServer) -> None:
    ns = "e2e-forecast"  # the forecast-only scaler above
    before = reconciled(kube_api, ns)["status"]
    (shown,) = [v for v in json.loads(status_command(kube_api, "--json")) if v["namespace"] == ns]
    after = reconciled(kube_api, ns)["status"]  # a period may have passed while the command ran: either one
    assert (shown["name"], shown["mode"]) == (MODEL, "forecast-only")
    assert any(shown["planned_replicas"] == s["desiredReplicas"] and shown["strategy"] == s["strategy"]
               and shown["forecast_upper"] == max(s["forecast"]["p95"]) and shown["model_version"] == s["modelVersion"]
               and shown["observed"] == s["plannerState"]["recentDemand"][-1][1] for s in (before, after)), shown
    assert shown["reconciled_ago"] < 120 and shown["attention"] == [], shown
    rows = status_command(kube_api, "-n", ns).splitlines()
    assert rows[0].split()[:4] == ["NAMESPACE", "NAME", "MODE", "STRATEGY"]
    assert rows[1].split()[:3] == [ns, MODEL, "forecast-only"], rows
    one = status_command(kube_api, f"{ns}/{MODEL}")
    assert one.startswith(f"{ns}/{MODEL}: mode forecast-only, strategy ") and "last decision:" in one, one
    exe = Path(sys.executable).with_name("predictive-scaler")
    missing = subprocess.run([str(exe), "status", f"--kubeconfig={kube_api.admin_kubeconfig}", f"{ns}/nothing"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and f"no PredictiveScaler {ns}/nothing" in missing.stderr, missing.stderr


# -- acting ----------------------------------------------------------------------------------------

def test_scale_mode_scales_and_prewarms_and_the_placeholder_is_resized_and_garbage_collected(
        kube_api: KubeApiServer) -> None:
    ns = "e2e-scale"
    make_target(kube_api, ns, replicas=1)
    kube_api.apply([scaler_manifest(ns)])
    owner_uid = get_scaler(kube_api, ns)["metadata"]["uid"]  # type: ignore[index]

    # Demand is ~40 req/s at 10 per replica: the target goes from 1 to at least 4 through /scale.
    kube_api.wait_for("the target scaled up", lambda: (replicas(kube_api, ns) or 0) >= 4)
    assert scale_writes(kube_api, ns), "scaled without a /scale write?"
    # Yesterday's bump, an hour ahead: the placeholder keeps nodes warm for it (blockOwnerDeletion
    # set, which OwnerReferencesPermissionEnforcement allows only with RBAC on the finalizers).
    placeholder = kube_api.wait_for("the placeholder", lambda: get_deployment(kube_api, ns, PLACEHOLDER))
    (owner,) = placeholder["metadata"]["ownerReferences"]
    assert owner["uid"] == owner_uid and owner["blockOwnerDeletion"] is True and owner["controller"] is True
    first = int(placeholder["spec"]["replicas"])
    assert first >= 2, placeholder["spec"]
    status = reconciled(kube_api, ns)["status"]
    assert status["budgetInUse"]["gpus"] <= 6 and status["strategy"] == "predictive"
    pods = kube_api.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"{manifests.ROLE_LABEL}=placeholder"})
    assert pods is not None and pods["items"], "the ReplicaSet controller made no placeholder pods"
    assert all(p["spec"].get("priorityClassName") == manifests.PLACEHOLDER_PRIORITY_CLASS for p in pods["items"])

    # A smaller budget resizes the placeholder (the whole speculative budget stays within it).
    smaller = first - 1
    patch_scaler(kube_api, ns, {"spec": {"prewarm": {"budget": {"maxGpus": smaller}}}})
    kube_api.wait_for("the placeholder resized", lambda: 1 <= (replicas(kube_api, ns, PLACEHOLDER) or 0) <= smaller)
    # The status read now may still be the one written before the resize (the reconcile that resized
    # writes its status after acting): every status written after it is planned on the smaller budget.
    seen = reconciled(kube_api, ns)["status"]["lastReconcileTime"]
    assert reconciled(kube_api, ns, after=seen)["status"]["budgetInUse"]["gpus"] <= smaller

    # Deleting the scaler: the garbage collector removes the placeholder through its ownerReference.
    assert get_deployment(kube_api, ns, PLACEHOLDER) is not None
    answer = kube_api.request("DELETE", f"{SCALER_API}/namespaces/{ns}/{PLURAL}/{MODEL}")
    assert answer.status_code == 200, answer.text
    kube_api.wait_for("the placeholder garbage-collected", lambda: get_deployment(kube_api, ns, PLACEHOLDER) is None)
    deletes = [e["userAgent"] for e in kube_api.audit() if e["verb"] == "delete"
               and e["objectRef"].get("namespace") == ns and e["objectRef"].get("name") == PLACEHOLDER]
    assert deletes and all("garbage-collector" in agent for agent in deletes), deletes
    assert replicas(kube_api, ns) is not None, "the target must outlive its scaler"


def test_a_paused_scaler_acts_on_nothing_until_resumed(kube_api: KubeApiServer) -> None:
    ns = "e2e-pause"
    make_target(kube_api, ns, replicas=1)
    manifest = scaler_manifest(ns)
    manifest["metadata"]["annotations"] = {PAUSE_ANNOTATION: "true"}
    kube_api.apply([manifest])
    obj = kube_api.wait_for("the Paused condition", lambda: condition(get_scaler(kube_api, ns), "Paused"))
    assert obj["status"] == "True" and PAUSE_ANNOTATION in obj["message"]
    time.sleep(6)  # at least one more period
    assert replicas(kube_api, ns) == 1 and get_deployment(kube_api, ns, PLACEHOLDER) is None
    assert scale_writes(kube_api, ns) == []
    kube_api.kubectl("annotate", "pscaler", MODEL, "-n", ns, f"{PAUSE_ANNOTATION}-")
    kube_api.wait_for("scaling after the pause", lambda: (replicas(kube_api, ns) or 0) >= 4)


def test_a_conflicting_hpa_is_refused_with_its_condition(kube_api: KubeApiServer) -> None:
    ns = "e2e-hpa"
    make_target(kube_api, ns, replicas=1)
    # Kubernetes 1.20 serves autoscaling/v2beta2, not v2: the controller discovers it.
    kube_api.apply([{"apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
                     "metadata": {"name": "llm-hpa", "namespace": ns},
                     "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": MODEL},
                              "minReplicas": 1, "maxReplicas": 3,
                              "metrics": [{"type": "Resource", "resource": {
                                  "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}}])
    kube_api.apply([scaler_manifest(ns)])
    conflict = kube_api.wait_for("ConflictingAutoscaler", lambda: condition(get_scaler(kube_api, ns),
                                                                              "ConflictingAutoscaler"))
    assert conflict["status"] == "True" and conflict["reason"] == "Refused", conflict
    assert "HorizontalPodAutoscaler e2e-hpa/llm-hpa" in conflict["message"]
    assert condition(get_scaler(kube_api, ns), "ApiDegraded")["status"] == "False"  # type: ignore[index]
    assert replicas(kube_api, ns) == 1 and scale_writes(kube_api, ns) == []
    refused = wait_for_events(kube_api, ns, "ConflictingAutoscaler")
    assert refused and refused[0]["type"] == "Warning"
    lists = [e["requestURI"] for e in kube_api.audit(SA_USER) if "horizontalpodautoscalers" in e["requestURI"]]
    assert lists and all("/autoscaling/v2beta2/" in u for u in lists), lists[:3]


def test_dry_run_writes_are_admitted_but_not_persisted(kube_api: KubeApiServer, controller_kubeconfig: Path) -> None:
    # `predictive-scaler controller --dry-run`: every write carries dryRun=All. The real server runs
    # RBAC and admission on it (OwnerReferencesPermissionEnforcement included) and stores nothing.
    ns = "e2e-dry-run"
    make_target(kube_api, ns, replicas=1)
    kube_api.apply([scaler_manifest(ns, mode="forecast-only")])
    uid = get_scaler(kube_api, ns)["metadata"]["uid"]  # type: ignore[index]
    kube = KubeCluster(api_client_from_environment(str(controller_kubeconfig)), dry_run=True)
    target = WorkloadRef("apps/v1", "Deployment", MODEL, ns)
    assert kube.patch_scale(target, 7).replicas == 7  # what the server would have stored
    assert kube.ensure_placeholder(PlaceholderSpec(MODEL, ns, uid, gpus_per_pod=1), 2).replicas == 2
    assert replicas(kube_api, ns) == 1 and get_deployment(kube_api, ns, PLACEHOLDER) is None
    dry = [e for e in kube_api.audit(SA_USER) if "dryRun=All" in e["requestURI"] and f"/namespaces/{ns}/" in e["requestURI"]]
    assert {(e["verb"], e["responseStatus"]["code"]) for e in dry} >= {("patch", 200), ("create", 201)}, dry


# -- the schema ------------------------------------------------------------------------------------

SCHEMA_REJECTS = [
    ("mode", {"mode": "yolo"}, 'spec.mode: Unsupported value: "yolo": supported values: "forecast-only", "scale"'),
    ("quantile", {"quantile": 1.5}, "spec.quantile: Invalid value: 1.5: spec.quantile in body should be less than 1"),
    ("max-replicas", {"maxReplicas": 0}, "spec.maxReplicas: Invalid value: 0: spec.maxReplicas in body should be "
                                         "greater than or equal to 1"),
]


@pytest.mark.parametrize(("field", "override", "message"), SCHEMA_REJECTS, ids=[r[0] for r in SCHEMA_REJECTS])
def test_the_server_rejects_what_the_schema_forbids(kube_api: KubeApiServer, field: str, override: dict[str, Any],
                                                    message: str) -> None:
    ns = "e2e-schema"
    kube_api.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
    done = kube_api.kubectl("apply", "-f", "-", stdin=json.dumps(scaler_manifest(ns, **override)), check=False)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert get_scaler(kube_api, ns) is None


def test_a_cross_field_rule_1_20_cannot_check_is_refused_by_the_controller(kube_api: KubeApiServer) -> None:
    # minReplicas > maxReplicas is a CEL rule (1.25+); without CEL the server accepts it, and the
    # controller refuses it with InvalidSpec and touches nothing.
    ns = "e2e-invalid"
    make_target(kube_api, ns, replicas=1)
    kube_api.apply([scaler_manifest(ns, minReplicas=5, maxReplicas=3)])
    ready = kube_api.wait_for("the InvalidSpec condition", lambda: (c := condition(get_scaler(kube_api, ns), "Ready"))
                              and c["reason"] == "InvalidSpec" and c)
    assert ready["status"] == "False" and "minReplicas" in ready["message"], ready
    assert replicas(kube_api, ns) == 1 and scale_writes(kube_api, ns) == []
    assert [e for e in wait_for_events(kube_api, ns, "InvalidSpec") if e["type"] == "Warning"]


def test_the_docs_show_the_schema_rejection() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes-versions.md").read_text()
    for _, _, message in SCHEMA_REJECTS[:2]:
        assert message in text


# -- RBAC ------------------------------------------------------------------------------------------

def test_rbac_allows_every_call_and_denies_the_rest(kube_api: KubeApiServer) -> None:
    # The offline RBAC tests derive these from API_CALLS, kopf and admission; here RBAC itself answers.
    token = kube_api.service_account_token(crd.CONTROLLER_NAMESPACE, CONTROLLER_SA)
    wanted = adapter_needs() | KOPF_NEEDS | admission_needs()
    assert len(wanted) > 15
    for group, resource, verb in sorted(wanted):
        plural, _, sub = resource.partition("/")
        assert kube_api.can_i(token, verb, group, plural, "e2e-scale", sub), (verb, group, resource)
    outside = [("get", "", "secrets", ""), ("list", "", "secrets", ""), ("delete", "", "pods", ""),
               ("create", "", "pods", ""), ("update", "apps", "deployments", "scale"),
               ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
               ("delete", GROUP, PLURAL, ""), ("update", GROUP, PLURAL, "")]
    for verb, group, resource, sub in outside:
        assert not kube_api.can_i(token, verb, group, resource, "e2e-scale", sub), (verb, group, resource, sub)
    denied = kube_api.request("GET", f"/api/v1/namespaces/{crd.CONTROLLER_NAMESPACE}/secrets", token=token)
    assert denied.status_code == 403 and "forbidden" in denied.text


def test_every_request_the_controller_made_was_allowed(kube_api: KubeApiServer) -> None:
    # The controller process's requests (the tests' own ones with its token send python-requests' agent).
    mine = [e for e in kube_api.audit(SA_USER) if not e.get("userAgent", "").startswith("python-requests")]
    assert len(mine) > 50, "the audit log has too few of the controller's requests"
    codes = [(e["verb"], e["requestURI"], e.get("responseStatus", {}).get("code", 200)) for e in mine]
    denied = [c for c in codes if c[2] in (401, 403)]
    assert denied == [], denied[:10]
    # The only error answers: "no placeholder yet" and "KEDA is not installed" (both 404, both expected).
    unexpected = [c for c in codes if c[2] >= 400 and not (
        c[2] == 404 and ("/keda.sh/" in c[1] or c[1].split("?")[0].endswith(f"/deployments/{PLACEHOLDER}")))]
    assert unexpected == [], unexpected[:10]
    verbs = {(e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("subresource")) for e in mine
             if e.get("objectRef")}
    for expected in [("patch", "deployments", "scale"), ("create", "deployments", None),
                     ("patch", "deployments", None), ("patch", PLURAL, "status"), ("list", PLURAL, None),
                     ("create", "events", None), ("list", "horizontalpodautoscalers", None)]:
        assert expected in verbs, (expected, sorted(map(str, verbs)))


# -- metrics ---------------------------------------------------------------------------------------

def test_scraped_as_the_service_monitor_says_each_scaler_keeps_its_namespace(
        kube_api: KubeApiServer, controller: ControllerProcess, tmp_path: Path) -> None:
    # A real Prometheus scrapes the controller process with the target labels Prometheus Operator adds
    # (the controller's own namespace among them) and the ServiceMonitor's honorLabels. Several scalers
    # here share the name "llm": each must keep its own namespace, none may become exported_namespace.
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    target_labels = {k: v for k, v in OPERATOR_TARGET_LABELS.items() if k not in ("job", "instance")}
    job = {"job_name": OPERATOR_TARGET_LABELS["job"], "scrape_interval": "1s", "scrape_timeout": "1s",
           "metrics_path": endpoint["path"], "honor_labels": bool(endpoint.get("honorLabels", False)),
           "static_configs": [{"targets": [f"127.0.0.1:{controller.metrics_port}"], "labels": target_labels}]}
    query = 'max by (namespace, scaler, exported_namespace) (predictive_scaler_last_reconcile_timestamp_seconds{scaler="llm"})'
    with running_prometheus(tmp_path / "tsdb", tmp_path / "work", scrape_configs=[job]) as prom:
        def series() -> list[dict[str, str]] | None:
            answer = requests.get(f"{prom.url}/api/v1/query", params={"query": query}, timeout=5).json()
            found = [r["metric"] for r in answer["data"]["result"]]
            return found if len(found) >= 3 else None
        found = kube_api.wait_for("scraped series of three scalers named llm", series, timeout=60)
    namespaces = {m.get("namespace") for m in found}
    assert {"e2e-forecast", "e2e-pause", "e2e-hpa"} <= namespaces, found
    assert crd.CONTROLLER_NAMESPACE not in namespaces and not any("exported_namespace" in m for m in found), found


# -- restart ---------------------------------------------------------------------------------------

def test_a_restarted_controller_resumes_from_the_status_alone(kube_api: KubeApiServer,
                                                             controller: ControllerProcess) -> None:
    ns = "e2e-restart"
    make_target(kube_api, ns, replicas=1)
    kube_api.apply([scaler_manifest(ns)])
    placeholder = kube_api.wait_for("the placeholder", lambda: get_deployment(kube_api, ns, PLACEHOLDER))
    before = reconciled(kube_api, ns)
    state = before["status"]["plannerState"]

    assert controller.restart() == 0, "SIGTERM should stop the controller cleanly"
    after = reconciled(kube_api, ns, after=before["status"]["lastReconcileTime"], timeout=120)
    # Nothing in the new process's memory: the planner state came back from the status.
    assert after["status"]["plannerState"]["strategy"] == state["strategy"] == "predictive"
    assert after["status"]["plannerState"]["strategySince"] == state["strategySince"]
    assert after["status"]["desiredReplicas"] == before["status"]["desiredReplicas"] == replicas(kube_api, ns)
    again = get_deployment(kube_api, ns, PLACEHOLDER)
    assert again is not None and again["metadata"]["uid"] == placeholder["metadata"]["uid"]  # not recreated
    reasons = {e["reason"] for e in events(kube_api, ns)}
    assert "PlannerStateReset" not in reasons and "StrategyChanged" not in reasons, reasons
