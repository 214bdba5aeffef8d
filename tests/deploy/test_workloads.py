"""What the rendered workloads promise: restricted pods, one Recreate controller, wired settings."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest

from predictive_scaler import cli, crd
from predictive_scaler.kube.manifests import KIND, PLACEHOLDER_PRIORITY_CLASS

from .support import DEPLOY, OVERLAYS, find, one, pod_specs, render

BASE = render(OVERLAYS["default"])
SETTINGS = one(BASE, "ConfigMap", "predictive-scaler-settings")["data"]
WORKLOADS = list(pod_specs(BASE))
CONTAINERS = [(f"{name}/{c['name']}", c, spec) for name, spec in WORKLOADS for c in spec["containers"]]


def _ids(items: list[Any]) -> list[str]:
    return [i[0] for i in items]


def test_everything_namespaced_is_in_the_controller_namespace():
    assert one(BASE, "Namespace")["metadata"]["name"] == crd.CONTROLLER_NAMESPACE
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
    for obj in BASE:
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace") == crd.CONTROLLER_NAMESPACE, obj["metadata"]["name"]


@pytest.mark.parametrize("name, container, pod", CONTAINERS, ids=_ids(CONTAINERS))
def test_container_runs_restricted(name, container, pod):
    sc = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc.get("runAsUser", pod["securityContext"].get("runAsUser", 0)) != 0
    # A read-only root still needs a writable /tmp (Python, matplotlib, cmdstan temp files).
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp, "no writable /tmp"
    volume = next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])
    assert "emptyDir" in volume


@pytest.mark.parametrize("name, container, pod", CONTAINERS, ids=_ids(CONTAINERS))
def test_container_has_requests_limits_and_a_pinned_image(name, container, pod):
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    image = container["image"]
    assert re.fullmatch(r"[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", image), image
    assert not image.endswith(":latest")


def test_controller_is_one_recreate_replica_with_healthz_probes():
    deployment = one(BASE, "Deployment", "predictive-scaler-controller")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = container["args"]
    assert f"--health-port={ports['health']}" in args and f"--metrics-port={ports['metrics']}" in args
    # Liveness: the process is wedged; readiness: a dependency is unreachable (docs/controller.md).
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


def test_retrain_cronjob_is_weekly_and_never_overlaps():
    cronjob = one(BASE, "CronJob", "predictive-scaler-retrain")
    spec = cronjob["spec"]
    minute, hour, day_of_month, month, day_of_week = spec["schedule"].split()
    assert (day_of_month, month) == ("*", "*") and re.fullmatch(r"[0-6]", day_of_week), spec["schedule"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 1 <= spec["successfulJobsHistoryLimit"] <= 5 and 1 <= spec["failedJobsHistoryLimit"] <= 5


def _env_names(container: dict[str, Any]) -> set[str]:
    names = {e["name"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        cm = one(BASE, "ConfigMap", source["configMapRef"]["name"])
        names |= set(cm["data"])
    return names


@pytest.mark.parametrize("name, container, pod", CONTAINERS, ids=_ids(CONTAINERS))
def test_args_reference_only_defined_settings(name, container, pod):
    referenced = {m for arg in container["args"] for m in re.findall(r"\$\(([A-Z0-9_]+)\)", arg)}
    assert referenced <= _env_names(container), f"undefined: {referenced - _env_names(container)}"


def _expanded_args(container: dict[str, Any]) -> list[str]:
    values = {e["name"]: e.get("value", "") for e in container.get("env", [])} | SETTINGS
    return [re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]


@pytest.mark.parametrize("name, container, pod", CONTAINERS, ids=_ids(CONTAINERS))
def test_args_are_accepted_by_the_cli(name, container, pod):
    args = _expanded_args(container)
    assert args[0] in cli.COMMANDS, f"{args[0]} is not a predictive-scaler command"
    parser = cli.build_parser()
    try:
        parsed = parser.parse_args(args)
    except SystemExit as exc:
        raise AssertionError(f"`predictive-scaler {' '.join(args)}` is rejected by the CLI "
                             f"(is predictive_scaler/commands/{args[0]}.py there, with these flags?)") from exc
    assert callable(getattr(parsed, "func", None))


def test_model_store_is_the_shared_claim_at_the_configured_path():
    path = SETTINGS["PREDICTIVE_SCALER_MODEL_STORE"]
    claim = one(BASE, "PersistentVolumeClaim")["metadata"]["name"]
    for name, spec in WORKLOADS:
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = [m for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == path]
        assert len(mounts) == 1, name
        assert volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"] == claim
    controller_mount = next(m for _, spec in WORKLOADS for c in spec["containers"] if c["name"] == "controller"
                            for m in c["volumeMounts"] if m["mountPath"] == path)
    assert controller_mount.get("readOnly") is True, "only the retraining job writes models"


def test_metrics_service_selects_the_controller_named_port():
    service = one(BASE, "Service", "predictive-scaler-metrics")
    deployment = one(BASE, "Deployment", "predictive-scaler-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    names = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


def test_placeholder_priority_class_never_preempts():
    pc = one(BASE, "PriorityClass", PLACEHOLDER_PRIORITY_CLASS)
    assert pc["value"] < 0 and pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False


def _ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}


def test_network_policy_allows_only_api_server_prometheus_and_dns():
    policy = one(BASE, "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for name, _ in WORKLOADS:
        workload = next(o for o in BASE if o["metadata"]["name"] == name and o["kind"] in ("Deployment", "CronJob"))
        template = workload["spec"].get("template") or workload["spec"]["jobTemplate"]["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items(), f"{name} is not covered"
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    egress = policy["spec"]["egress"]
    assert all(rule.get("ports") for rule in egress), "an egress rule without ports opens everything"
    allowed = set().union(*(_ports(r) for r in egress))
    assert allowed == {("TCP", 443), ("TCP", 6443), ("TCP", 9090), ("UDP", 53), ("TCP", 53)}
    prometheus_rule = next(r for r in egress if ("TCP", 9090) in _ports(r))
    (peer,) = prometheus_rule["to"]
    namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    assert namespace == SETTINGS["PREDICTIVE_SCALER_PROMETHEUS_NAMESPACE"]
    url = urlsplit(SETTINGS["PREDICTIVE_SCALER_PROMETHEUS_URL"])
    host_parts = (url.hostname or "").split(".")
    assert len(host_parts) >= 2 and host_parts[1] == namespace, "the Prometheus URL is not in the allowed namespace"
    assert url.port == 9090
    prometheus_in, keda_in = policy["spec"]["ingress"]
    assert _ports(prometheus_in) == {("TCP", 8080)}
    assert _ports(keda_in) == {("TCP", 6000)}  # KEDA's operator calls the external scaler API (mode keda)
    (keda_peer,) = keda_in["from"]
    assert keda_peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "keda"
    service = one(BASE, "Service", "predictive-scaler-keda")
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(6000, "keda")]


def test_dashboard_configmap_carries_the_committed_json_for_the_grafana_sidecar():
    objs = render(OVERLAYS["prometheus-operator"])
    cm = one(objs, "ConfigMap", "predictive-scaler-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["predictive-scaler.json"] == (DEPLOY / "dashboards" / "predictive-scaler.json").read_text()
    monitor = one(objs, "ServiceMonitor")
    service = one(objs, "Service", "predictive-scaler-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert service["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]


def test_example_scaler_targets_the_example_gpu_deployment_in_forecast_only_mode():
    objs = render(OVERLAYS["example-vllm-forecast-only"])
    scaler = one(objs, KIND)
    deployments = find(objs, "Deployment")
    target = scaler["spec"]["target"]
    (deployment,) = [d for d in deployments if d["metadata"]["name"] == target["name"]]
    assert (target["apiVersion"], target["kind"]) == (deployment["apiVersion"], deployment["kind"])
    assert scaler["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert scaler["spec"]["mode"] == "forecast-only"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert "readinessProbe" in container
    assert "replicas" not in deployment["spec"], "re-applying the example would reset what the scaler set"
    assert not find(objs, "HorizontalPodAutoscaler"), "an HPA on the target would make the scaler refuse"
    installed = {pc["metadata"]["name"] for pc in find(BASE, "PriorityClass")}
    assert scaler["spec"]["prewarm"]["priorityClassName"] in installed


def test_example_spec_is_accepted_by_the_spec_type():
    # The schema checks shapes; ScalerSpec checks what a schema cannot (e.g. min <= max).
    from predictive_scaler.spec import ScalerSpec

    scaler = one(render(OVERLAYS["example-vllm-forecast-only"]), KIND)
    spec = ScalerSpec.from_dict(scaler["spec"])
    assert spec.mode == "forecast-only"
