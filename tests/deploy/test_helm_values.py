"""Where each value platform charts accept lands, in the chart's render, and that every render validates.

The chart takes the values KEDA's and Karpenter's charts take — scheduling, pod metadata,
security contexts, ServiceAccounts, RBAC, extra arguments, environment and volumes, a
PodDisruptionBudget, the release's name and namespace, CRD handling, ServiceMonitor
relabelings and alert thresholds (docs/install.md, "Install with Helm"). Pod values are per
component, the same keys under ``controller`` (the Deployment, or the StatefulSet with shards)
and ``retrain`` (the CronJob's pod). Each test renders with Helm's own library, offline, checks
the field the value must land in, and validates every object strictly against the oldest
Kubernetes the chart claims and the newest bundled (tests/deploy/helm_support.py). No kubectl.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from predictive_scaler import cli, crd
from predictive_scaler.kube.manifests import KIND
from predictive_scaler.spec import ScalerSpec

from .helm_support import NAMESPACE, RELEASE, helm_notes, helm_render, validate_all
from .schemas import MONITORING_SCHEMAS
from .support import DEPLOY, find, one, openapi_to_jsonschema

SHARDED: dict[str, Any] = {"sharding": {"replicas": 3}}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}

#: The controller runs as a Deployment, or a StatefulSet with shards; the retraining pod in a CronJob.
WORKLOADS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "controller": ("controller", "Deployment", {}),
    "controller-sharded": ("controller", "StatefulSet", SHARDED),
    "retrain": ("retrain", "CronJob", {}),
}
TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"},
               {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
NODE_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "node-role.example.com/platform", "operator": "Exists"}]}]}}}
SPREAD = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
          {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
           "labelSelector": {"matchLabels": {"team": "ml-platform"}}}]
ENV = [{"name": "AWS_REGION", "value": "eu-west-1"},
       {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
ENV_FROM = [{"secretRef": {"name": "prometheus-credentials"}}]
EXTRA_VOLUMES = [{"name": "corporate-ca", "configMap": {"name": "corporate-ca"}}]
EXTRA_MOUNTS = [{"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}]
EXTRA_ARGS = {"controller": ["--namespace=inference"], "retrain": ["--processes=2"]}
PULL_SECRETS = [{"name": "registry-credentials"}]


def _platform(component: str) -> dict[str, Any]:
    """Every pod value a platform team sets, for one component."""
    return {"tolerations": TOLERATIONS, "affinity": NODE_AFFINITY, "topologySpreadConstraints": SPREAD,
            "nodeSelector": {"node-role.example.com/platform": "true"}, "priorityClassName": "platform-critical",
            "podAnnotations": {"example.com/owner": "ml-platform"}, "podLabels": {"team": "ml-platform"},
            "env": ENV, "envFrom": ENV_FROM, "extraArgs": EXTRA_ARGS[component],
            "extraVolumes": EXTRA_VOLUMES, "extraVolumeMounts": EXTRA_MOUNTS}


def _template(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The pod template of the one workload of this kind."""
    spec = one(objs, kind)["spec"]
    return spec["jobTemplate"]["spec"]["template"] if kind == "CronJob" else spec["template"]


def _selector(component: str, name: str = "predictive-scaler") -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": component}


@pytest.mark.parametrize("workload", WORKLOADS, ids=list(WORKLOADS))
def test_the_pod_values_land_in_the_pod(workload: str) -> None:
    component, kind, extra = WORKLOADS[workload]
    objs = helm_render({**extra, component: _platform(component), "imagePullSecrets": PULL_SECRETS})
    validate_all(objs)
    default = _template(helm_render(extra), kind)
    template = _template(objs, kind)
    pod, (container,) = template["spec"], template["spec"]["containers"]
    (default_container,) = default["spec"]["containers"]

    assert pod["tolerations"] == TOLERATIONS
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["imagePullSecrets"] == PULL_SECRETS
    # A map value merges with the chart's default (`null` removes a key): the os label stays.
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role.example.com/platform": "true"}
    if component == "controller":
        assert pod["affinity"] == NODE_AFFINITY
    else:  # the chart's own podAffinity (the controller's node, for the ReadWriteOnce store) stays
        assert pod["affinity"] == {**NODE_AFFINITY, "podAffinity": default["spec"]["affinity"]["podAffinity"]}
    # A spread constraint without a selector spreads this component's own pods.
    assert pod["topologySpreadConstraints"] == [{**SPREAD[0], "labelSelector": {"matchLabels": _selector(component)}},
                                                SPREAD[1]]
    meta = template["metadata"]
    assert meta["annotations"]["example.com/owner"] == "ml-platform"
    assert ("checksum/settings" in meta["annotations"]) == (component == "controller")
    assert meta["labels"] == {**default["metadata"]["labels"], "team": "ml-platform"}
    # Appended after the chart's own: its settings and hardening stay.
    assert container["env"] == default_container["env"] + ENV
    assert container["envFrom"] == default_container["envFrom"] + ENV_FROM
    assert container["args"] == default_container["args"] + EXTRA_ARGS[component]
    assert container["volumeMounts"] == default_container["volumeMounts"] + EXTRA_MOUNTS
    assert pod["volumes"] == default["spec"]["volumes"] + EXTRA_VOLUMES
    assert container["securityContext"] == default_container["securityContext"]
    assert pod["securityContext"] == default["spec"]["securityContext"]


@pytest.mark.parametrize("component", ["controller", "retrain"])
def test_extra_args_are_accepted_by_the_cli(component: str) -> None:
    objs = helm_render({component: {"extraArgs": EXTRA_ARGS[component]}})
    (container,) = _template(objs, "Deployment" if component == "controller" else "CronJob")["spec"]["containers"]
    settings = one(objs, "ConfigMap", "predictive-scaler-settings")["data"]
    args = [re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: settings[m.group(1)], a) for a in container["args"]]
    parsed = cli.build_parser().parse_args(args)
    if component == "controller":
        assert parsed.namespace == "inference"
    else:
        assert parsed.processes == 2


def test_the_chart_labels_win_over_pod_labels() -> None:
    # A podLabels entry may not move a pod out of its Service, selector or NetworkPolicy.
    objs = helm_render({"controller": {"podLabels": {"app.kubernetes.io/component": "x",
                                                     "app.kubernetes.io/part-of": "y"}}})
    labels = _template(objs, "Deployment")["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "controller"
    assert labels["app.kubernetes.io/part-of"] == "predictive-scaler"


SECURITY_DEFAULTS = {
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                           "seccompProfile": {"type": "RuntimeDefault"}},
    "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "runAsUser": 65532, "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"}},
}


@pytest.mark.parametrize("workload", WORKLOADS, ids=list(WORKLOADS))
def test_security_contexts_are_values_with_todays_defaults(workload: str) -> None:
    component, kind, extra = WORKLOADS[workload]
    template = _template(helm_render(extra or None), kind)
    assert template["spec"]["securityContext"] == SECURITY_DEFAULTS["podSecurityContext"]
    assert template["spec"]["containers"][0]["securityContext"] == SECURITY_DEFAULTS["securityContext"]
    with helm.Chart.load(DEPLOY / "helm" / "predictive-scaler") as chart:
        defaults = chart.values[component]
    assert {k: defaults[k] for k in SECURITY_DEFAULTS} == SECURITY_DEFAULTS


OPENSHIFT = {"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
             "securityContext": {"runAsUser": None}}


@pytest.mark.parametrize("workload", WORKLOADS, ids=list(WORKLOADS))
def test_openshift_lets_the_scc_assign_the_ids(workload: str) -> None:
    # restricted-v2 assigns user and group IDs from the namespace's range: the chart names none.
    component, kind, extra = WORKLOADS[workload]
    objs = helm_render({**extra, component: OPENSHIFT})
    validate_all(objs)
    pod = _template(objs, kind)["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = pod["containers"][0]["securityContext"]
    assert "runAsUser" not in container and container["capabilities"] == {"drop": ["ALL"]}
    assert container["readOnlyRootFilesystem"] is True and container["allowPrivilegeEscalation"] is False
    # null for the whole value leaves the field out (the SCC then sets all of it).
    bare = _template(helm_render({**extra, component: {"podSecurityContext": None, "securityContext": None}}), kind)
    assert "securityContext" not in bare["spec"] and "securityContext" not in bare["spec"]["containers"][0]


def test_service_accounts_carry_their_annotations() -> None:
    # IRSA for the retraining job, Workload Identity for the controller.
    objs = helm_render({"serviceAccount": {
        "controller": {"annotations": {"iam.gke.io/gcp-service-account": "ps@project.iam.gserviceaccount.com"}},
        "retrain": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ps-retrain"}}}})
    validate_all(objs)
    controller = one(objs, "ServiceAccount", "predictive-scaler-controller")
    retrain = one(objs, "ServiceAccount", "predictive-scaler-retrain")
    assert controller["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "ps@project.iam.gserviceaccount.com"}
    assert retrain["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/ps-retrain"}
    assert "annotations" not in one(helm_render(), "ServiceAccount", "predictive-scaler-controller")["metadata"]


def test_an_existing_service_account_is_used_and_bound() -> None:
    objs = helm_render({"serviceAccount": {"controller": {"create": False, "name": "platform-autoscaler"},
                                           "retrain": {"name": "trainer"}}})
    validate_all(objs)
    assert [a["metadata"]["name"] for a in find(objs, "ServiceAccount")] == ["trainer"]
    assert _template(objs, "Deployment")["spec"]["serviceAccountName"] == "platform-autoscaler"
    assert _template(objs, "CronJob")["spec"]["serviceAccountName"] == "trainer"
    bound = {b["metadata"]["name"]: b["subjects"] for b in find(objs, "ClusterRoleBinding")}
    assert bound["predictive-scaler-controller"] == [
        {"kind": "ServiceAccount", "name": "platform-autoscaler", "namespace": NAMESPACE}]
    assert bound["predictive-scaler-retrain"] == [{"kind": "ServiceAccount", "name": "trainer", "namespace": NAMESPACE}]


def test_rbac_can_be_left_to_the_platform() -> None:
    objs = helm_render({"rbac": {"create": False}})
    assert not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding")
    assert len(find(objs, "ServiceAccount")) == 2


def test_no_pod_disruption_budget_by_default() -> None:
    assert not find(helm_render(), "PodDisruptionBudget")
    assert not find(helm_render(SHARDED), "PodDisruptionBudget")


@pytest.mark.parametrize("budget, spec", [
    ({"enabled": True}, {"maxUnavailable": 1}),
    ({"enabled": True, "minAvailable": 2}, {"minAvailable": 2}),
    ({"enabled": True, "maxUnavailable": "34%"}, {"maxUnavailable": "34%"}),
], ids=["max-unavailable", "min-available", "percent"])
def test_the_pod_disruption_budget_covers_the_controller_pods(budget: dict[str, Any], spec: dict[str, Any]) -> None:
    objs = helm_render({**SHARDED, "controller": {"podDisruptionBudget": budget}})
    validate_all(objs)  # policy/v1: 1.21+, so on every version the chart claims
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert (pdb["metadata"]["name"], pdb["metadata"]["namespace"]) == ("predictive-scaler-controller", NAMESPACE)
    assert pdb["spec"] == {**spec, "selector": {"matchLabels": _selector("controller")}}
    assert pdb["spec"]["selector"]["matchLabels"].items() <= _template(objs, "StatefulSet")["metadata"]["labels"].items()


def test_the_crd_is_a_kept_template_and_can_be_left_out() -> None:
    definition = one(helm_render(), "CustomResourceDefinition")
    assert definition["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert definition["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert "annotations" not in one(helm_render({"crds": {"keep": False}}), "CustomResourceDefinition")["metadata"]
    assert not find(helm_render({"crds": {"install": False}}), "CustomResourceDefinition")


def _names_and_references(objs: list[dict[str, Any]]) -> None:
    """Every name one object gives another resolves to an object of the render."""
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    accounts = {n for k, n in names if k == "ServiceAccount"}
    for kind in ("Deployment", "StatefulSet", "CronJob"):
        for workload in find(objs, kind):
            template = _template([workload], kind)
            pod = template["spec"]
            assert pod["serviceAccountName"] in accounts
            assert {("ConfigMap", s["configMapRef"]["name"]) for s in pod["containers"][0]["envFrom"]} <= names
            claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
            assert {("PersistentVolumeClaim", c) for c in claims} <= names
            policy = one(objs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
            assert policy.items() <= template["metadata"]["labels"].items()
    for binding in find(objs, "ClusterRoleBinding"):
        assert ("ClusterRole", binding["roleRef"]["name"]) in names
        assert {s["name"] for s in binding["subjects"]} <= accounts
    controller = _template(objs, "StatefulSet" if find(objs, "StatefulSet") else "Deployment")
    for service in find(objs, "Service"):
        assert service["spec"]["selector"].items() <= controller["metadata"]["labels"].items()
    for statefulset in find(objs, "StatefulSet"):
        assert ("Service", statefulset["spec"]["serviceName"]) in names
    affinity = _template(objs, "CronJob")["spec"]["affinity"]["podAffinity"]
    term = affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"]
    assert term.items() <= controller["metadata"]["labels"].items()


@pytest.mark.parametrize("release, values, fullname", [
    ("ml-autoscaler", {}, "ml-autoscaler-predictive-scaler"),
    ("predictive-scaler-prod", {}, "predictive-scaler-prod"),
    ("ml-autoscaler", {"fullnameOverride": "gpu-scaler"}, "gpu-scaler"),
], ids=["release-name", "release-name-with-the-chart-name", "fullname-override"])
def test_names_and_namespace_follow_the_release(release: str, values: dict[str, Any], fullname: str) -> None:
    extras = {"prometheusOperator": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                                     "dashboard": {"enabled": True}},
              "controller": {"podDisruptionBudget": {"enabled": True}}}
    for shards in ({}, SHARDED):
        objs = helm_render({**values, **extras, **shards}, name=release, namespace="platform")
        validate_all(objs)
        assert not find(objs, "Namespace"), "the release namespace is Helm's"
        for obj in objs:
            meta = obj["metadata"]
            assert meta["labels"]["app.kubernetes.io/instance"] == release
            if obj["kind"] in CLUSTER_SCOPED:
                assert "namespace" not in meta
            else:
                assert meta["namespace"] == "platform", meta["name"]
            if obj["kind"] not in ("CustomResourceDefinition", "PriorityClass"):  # names scalers refer to
                assert meta["name"] == fullname or meta["name"].startswith(f"{fullname}-"), meta["name"]
        assert "predictive-scaler-system" not in yaml.safe_dump_all(objs)
        _names_and_references(objs)
        for binding in find(objs, "ClusterRoleBinding"):
            assert binding["subjects"][0]["namespace"] == "platform"
        monitor = one(objs, "ServiceMonitor")
        assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["platform"]
    assert one(objs, "CustomResourceDefinition")["metadata"]["name"] == crd.build_crd()["metadata"]["name"]
    assert one(objs, "PriorityClass")["metadata"]["name"] == "predictive-scaler-placeholder"


def test_name_override_renames_and_relabels_consistently() -> None:
    objs = helm_render({"nameOverride": "gpu-scaler"}, name="ml", namespace="platform")
    validate_all(objs)
    assert one(objs, "Deployment")["metadata"]["name"] == "ml-gpu-scaler-controller"
    assert one(objs, "Deployment")["spec"]["selector"]["matchLabels"] == _selector("controller", "gpu-scaler")
    _names_and_references(objs)


def test_a_long_release_name_leaves_room_for_every_suffix() -> None:
    release = "a-very-long-release-name-for-the-autoscaler-of-team-x"
    objs = helm_render(SHARDED, name=release, namespace="platform")
    validate_all(objs)
    for obj in objs:
        name = obj["metadata"]["name"]
        limit = {"StatefulSet": 52, "CronJob": 52}.get(obj["kind"], 63)
        if obj["kind"] != "CustomResourceDefinition":
            assert len(name) <= limit and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
    _names_and_references(objs)


def test_namespace_name_still_places_everything_elsewhere() -> None:
    # Chart 0.1's placement, kept on upgrade with namespace.name (docs/install.md, "Upgrading from chart 0.1").
    objs = helm_render({"namespace": {"name": NAMESPACE}}, namespace="default")
    assert one(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {o["metadata"]["namespace"] for o in objs if o["kind"] not in CLUSTER_SCOPED} == {NAMESPACE}
    # Offline (no cluster to look up) an upgrade renders as an install does.
    assert helm_render(upgrade=True) == helm_render()


def test_service_monitor_relabelings_land_on_the_endpoint() -> None:
    relabelings = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}]
    metric_relabelings = [{"sourceLabels": ["__name__"], "regex": "predictive_scaler_build_info", "action": "drop"}]
    objs = helm_render({"prometheusOperator": {"serviceMonitor": {
        "enabled": True, "relabelings": relabelings, "metricRelabelings": metric_relabelings}}})
    validate_all(objs)
    (endpoint,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["relabelings"] == relabelings and endpoint["metricRelabelings"] == metric_relabelings
    assert endpoint["honorLabels"] is True
    (default,) = one(helm_render({"prometheusOperator": {"serviceMonitor": {"enabled": True}}}),
                     "ServiceMonitor")["spec"]["endpoints"]
    assert "relabelings" not in default and "metricRelabelings" not in default
    bad = copy.deepcopy(one(objs, "ServiceMonitor"))
    bad["spec"]["endpoints"][0]["relabelings"][0]["targetLable"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(MONITORING_SCHEMAS["ServiceMonitor"]).validate(bad)


THRESHOLDS = {"reactiveFallbackMinutes": 45, "budgetExhaustedMinutes": 20, "forecastStaleMinutes": 30,
              "reconcileErrorsMinutes": 15, "reconcileStalledMinutes": 20, "wastedPrewarmCostPerDay": 12.5,
              "modelStaleDays": 21}


def _rules(values: dict[str, Any], **kw: Any) -> dict[str, dict[str, Any]]:
    objs = helm_render({**values, "prometheusOperator": {"prometheusRule": {"enabled": True, "alerts": THRESHOLDS}}},
                       **kw)
    validate_all(objs)
    groups = one(objs, "PrometheusRule")["spec"]["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}  # recording rules have no alert


def test_alert_thresholds_are_values() -> None:
    rules = _rules({})
    assert rules["PredictiveScalerReactiveFallback"]["for"] == "45m"
    assert "for 45 minutes" in rules["PredictiveScalerReactiveFallback"]["annotations"]["summary"]
    assert rules["PredictiveScalerPrewarmBudgetExhausted"]["for"] == "20m"
    assert rules["PredictiveScalerForecastStale"]["expr"].endswith("> 1800")
    assert "for 30 minutes" in rules["PredictiveScalerForecastStale"]["annotations"]["summary"]
    assert rules["PredictiveScalerReconcileErrors"]["for"] == "15m"
    assert rules["PredictiveScalerReconcileStalled"]["expr"].endswith("> 1200")
    assert rules["PredictiveScalerWastedPrewarmCostHigh"]["expr"].endswith("> 12.5")
    assert rules["PredictiveScalerModelStale"]["expr"].endswith("> 21 * 86400")
    # Prometheus's own templates pass through untouched.
    assert rules["PredictiveScalerForecastStale"]["annotations"]["summary"].startswith(
        "{{ $labels.namespace }}/{{ $labels.scaler }} ")


def test_alert_texts_name_this_releases_namespace_and_controller() -> None:
    for values, workload in (({}, "deploy/ml-predictive-scaler-controller"),
                             (SHARDED, "statefulset/ml-predictive-scaler-controller")):
        rules = _rules(values, name="ml", namespace="platform")
        text = yaml.safe_dump(rules)
        assert "predictive-scaler-system" not in text
        assert (f"kubectl -n platform logs {workload}."
                in rules["PredictiveScalerReconcileErrors"]["annotations"]["description"])
        assert "kubectl -n platform get pods" in rules["PredictiveScalerReconcileStalled"]["annotations"]["description"]
        assert "kubectl -n platform get jobs" in rules["PredictiveScalerModelStale"]["annotations"]["description"]


@pytest.mark.promtool
def test_promtool_accepts_rules_with_other_thresholds(tmp_path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package `prometheus`); `make tools` installs it"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "predictive-scaler", "rules": list(_rules({}).values())}]}))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_notes_give_commands_a_chart_user_can_run() -> None:
    notes = helm_notes({**SHARDED, "crds": {"install": False}}, name="ml", namespace="platform")
    # Nothing from this repository's tree (a chart user has the chart, not the repository).
    assert not re.search(r"\bdeploy/|apply -k|\bmake\b|\bpython -m\b|\bdocs/", notes), notes
    for command in ("kubectl -n platform rollout status statefulset/ml-predictive-scaler-controller",
                    "kubectl -n platform create job --from=cronjob/ml-predictive-scaler-retrain retrain-now",
                    "kubectl -n platform port-forward svc/ml-predictive-scaler-metrics 8080",
                    "scalerAddress: ml-predictive-scaler-keda.platform.svc:6000",
                    "kubectl label namespace platform pod-security.kubernetes.io/enforce=restricted",
                    "--show-only templates/crd.yaml --set crds.install=true"):
        assert command in notes, command
    default = helm_notes()
    assert "rollout status deployment/predictive-scaler-controller" in default and "crds.install" not in default


def test_the_notes_example_scaler_is_accepted_once_filled_in() -> None:
    notes = helm_notes()
    block = notes[notes.index("<<'YAML'\n") + len("<<'YAML'\n"):notes.index("\n  YAML\n")]
    filled = (block.replace("<deployment>", "llm-server").replace("<its namespace>", "inference")
              .replace("<its request counter>", "vllm:request_success_total")
              .replace("<requests/s one replica serves>", "4"))
    assert "<" not in filled.replace("<=", "")
    scaler = yaml.safe_load(filled)
    assert scaler["kind"] == KIND
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(openapi_to_jsonschema(schema)).validate(scaler)
    assert ScalerSpec.from_dict(scaler["spec"]).mode == "forecast-only"


@pytest.mark.parametrize("values, complaint", [
    ({"controller": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}}, "efect"),
    ({"controller": {"tolerations": {"key": "a"}}}, "tolerations"),
    ({"retrain": {"affinity": {"nodeAfinity": {}}}}, "nodeAfinity"),
    ({"retrain": {"affinity": {"podAffinity": {"requiredDuringScheduling": []}}}}, "requiredDuringScheduling"),
    ({"controller": {"topologySpreadConstraints": [{"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}},
     "maxSkew"),
    ({"controller": {"priorityClassName": "Platform Critical"}}, "priorityClassName"),
    ({"imagePullSecrets": ["registry-credentials"]}, "imagePullSecrets"),
    ({"controller": {"podAnnotations": {"replicas": 2}}}, "podAnnotations"),
    ({"serviceAccount": {"controller": {"anotations": {}}}}, "anotations"),
    ({"serviceAccount": {"create": False}}, "create"),
    ({"rbac": {"enabled": False}}, "enabled"),
    ({"controller": {"env": [{"name": "WORKERS", "value": 4}]}}, "value"),
    ({"retrain": {"envFrom": [{"secretReff": {"name": "x"}}]}}, "secretReff"),
    ({"controller": {"extraArgs": "--namespace=inference"}}, "extraArgs"),
    ({"retrain": {"extraVolumeMounts": [{"name": "ca"}]}}, "mountPath"),
    ({"controller": {"podSecurityContext": {"runAsUsr": 1000}}}, "runAsUsr"),
    ({"retrain": {"securityContext": {"capabilities": {"dorp": ["ALL"]}}}}, "dorp"),
    ({"controller": {"podDisruptionBudget": {"enabeld": True}}}, "enabeld"),
    ({"crds": {"instal": False}}, "instal"),
    ({"fullnameOverride": "a" * 42}, "fullnameOverride"),
    ({"nameOverride": "Gpu_Scaler"}, "nameOverride"),
    ({"namespace": {"name": "Platform"}}, "namespace"),
    ({"prometheusOperator": {"serviceMonitor": {"relabelings": [{"action": "Replce"}]}}}, "action"),
    ({"prometheusOperator": {"prometheusRule": {"alerts": {"reactiveFallbackMinutes": "30m"}}}},
     "reactiveFallbackMinutes"),
    ({"prometheusOperator": {"prometheusRule": {"alerts": {"modelStaleDayz": 14}}}}, "modelStaleDayz"),
    ({"tolerations": []}, "tolerations"),  # per component: controller.tolerations, retrain.tolerations
], ids=lambda v: v if isinstance(v, str) else None)
def test_the_values_schema_refuses_mistakes_in_the_new_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        helm_render(values)
    assert complaint in str(info.value)


def test_release_defaults_are_the_kustomize_names() -> None:
    # What the equivalence test (test_helm_chart.py) relies on: release predictive-scaler keeps the 0.1 names.
    objs = helm_render(name=RELEASE)
    assert {o["metadata"]["name"] for o in objs if o["kind"] not in CLUSTER_SCOPED} == {
        "predictive-scaler", "predictive-scaler-controller", "predictive-scaler-retrain",
        "predictive-scaler-settings", "predictive-scaler-models", "predictive-scaler-metrics",
        "predictive-scaler-keda"}
