"""The Helm chart: Helm's own linter and renderer, offline, and the same objects as kustomize.

Helm runs in-process through ``helm-python-sdk`` (PyPI), which bundles the Helm
v4 Go library (``libhelm_c``): ``helm lint`` and ``helm template`` without a
helm binary, a cluster or the network. The default render (installed into
predictive-scaler-system) must equal ``kubectl kustomize deploy/overlays/default``
object for object, and the render with the three Prometheus Operator extras on
must equal the ``prometheus-operator`` overlay, apart from the differences named
in ``INTENDED_DIFFERENCES``. tests/deploy/test_helm_values.py checks where each
value lands.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from predictive_scaler import crd

from .helm_support import CHART, NAMESPACE, chart_metadata, helm_render, validate_all
from .helm_support import key as _key
from .support import DEPLOY, OVERLAYS, find, one, pod_specs, render

EXTRAS_ON: dict[str, Any] = {"prometheusOperator": {
    "serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}, "dashboard": {"enabled": True}}}

#: Where the chart's render differs from kustomize's on purpose (normalised away below).
INTENDED_DIFFERENCES = {
    "managed-by": "app.kubernetes.io/managed-by is Helm (kustomize's base sets kustomize)",
    "chart-label": "every object carries helm.sh/chart: predictive-scaler-<chart version>",
    "instance-label": "every object carries app.kubernetes.io/instance: <release> (not in selectors: a selector "
                      "cannot change on upgrade)",
    "crd-keep": "the CRD is annotated helm.sh/resource-policy: keep (crds.keep), so `helm uninstall` leaves it and "
                "the users' scalers with it; `kubectl delete -k` deletes it",
    "release-namespace": "installed into the release namespace (namespace.name empty), the chart renders no "
                         "Namespace: Helm needs the namespace before it installs anything (`--create-namespace`). "
                         "With namespace.name set to another namespace it renders it as kustomize does "
                         "(the 'legacy-namespace' render)",
    "part-of-everywhere": "the ServiceMonitor and PrometheusRule carry app.kubernetes.io/part-of too, like every "
                          "other object (the overlay's two files, outside the base, lack it)",
    "settings-checksum": "the controller's pod template has a checksum/settings annotation, so a `helm upgrade` "
                         "that changes a setting restarts the controller (it reads them at start)",
}
#: Files the chart reads from the kustomize tree (symlinks, so there is one copy of each). The alerts are
#: a template of their own (thresholds are values); the default render equals the overlay's file.
LINKED = {
    "files/crd.yaml": DEPLOY / "base" / "crd.yaml",
    "files/rbac-controller.yaml": DEPLOY / "base" / "rbac-controller.yaml",
    "files/rbac-retrain.yaml": DEPLOY / "base" / "rbac-retrain.yaml",
    "files/predictive-scaler.json": DEPLOY / "dashboards" / "predictive-scaler.json",
}


def _normalised(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    labels = out["metadata"].get("labels", {})
    labels.pop("app.kubernetes.io/managed-by", None)  # managed-by
    labels.pop("helm.sh/chart", None)  # chart-label
    labels.pop("app.kubernetes.io/instance", None)  # instance-label
    if out["kind"] == "CustomResourceDefinition":  # crd-keep
        annotations = out["metadata"].get("annotations", {})
        annotations.pop("helm.sh/resource-policy", None)
        if not annotations:
            out["metadata"].pop("annotations", None)
    if out["apiVersion"].startswith("monitoring.coreos.com/"):
        labels.pop("app.kubernetes.io/part-of", None)  # part-of-everywhere
    if out["kind"] in ("Deployment", "StatefulSet"):  # settings-checksum
        meta = out["spec"]["template"]["metadata"]
        meta.get("annotations", {}).pop("checksum/settings", None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
    return out


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "\n".join(difflib.unified_diff(yaml.safe_dump(a).splitlines(), yaml.safe_dump(b).splitlines(),
                                          "kustomize", "helm", lineterm=""))


SHARDED: dict[str, Any] = {"sharding": {"replicas": 2}}
#: A 0.1 install kept where it was: namespace.name set, the release record elsewhere (docs/install.md).
LEGACY: dict[str, Any] = {"namespace": {"name": NAMESPACE}}
#: Render -> (values, release namespace, the overlay it equals).
RENDERS: dict[str, tuple[dict[str, Any] | None, str, str]] = {
    "default": (None, NAMESPACE, "default"),
    "prometheus-operator": (EXTRAS_ON, NAMESPACE, "prometheus-operator"),
    "sharded": (SHARDED, NAMESPACE, "sharded"),
    "legacy-namespace": (LEGACY, "default", "default"),
}


def _render(which: str) -> list[dict[str, Any]]:
    values, namespace, _ = RENDERS[which]
    return helm_render(values, namespace=namespace)


@pytest.mark.parametrize("which", RENDERS, ids=list(RENDERS))
def test_helm_renders_the_kustomize_install(which):
    ours = {_key(o): o for o in _render(which)}
    theirs = {_key(o): o for o in render(OVERLAYS[RENDERS[which][2]])}
    if which != "legacy-namespace":  # release-namespace
        assert not find(list(ours.values()), "Namespace")
        del theirs[("Namespace", "", NAMESPACE)]
    assert sorted(ours) == sorted(theirs), (
        f"only in helm: {sorted(set(ours) - set(theirs))}; only in kustomize: {sorted(set(theirs) - set(ours))}")
    drift = {key: _diff(_normalised(theirs[key]), _normalised(ours[key])) for key in theirs
             if _normalised(theirs[key]) != _normalised(ours[key])}
    assert not drift, "the chart differs from deploy/ (mirror the change in deploy/helm/):\n" + "\n".join(
        f"--- {key}\n{d}" for key, d in drift.items())


@pytest.mark.parametrize("which", RENDERS, ids=list(RENDERS))
def test_the_only_label_differences_are_the_intended_ones(which):
    version = chart_metadata()["version"]
    objs = _render(which)
    for obj in objs:
        labels = obj["metadata"].get("labels", {})
        assert labels["app.kubernetes.io/managed-by"] == "Helm", _key(obj)
        assert labels["helm.sh/chart"] == f"predictive-scaler-{version}", _key(obj)
        assert labels["app.kubernetes.io/instance"] == "predictive-scaler", _key(obj)
        assert labels["app.kubernetes.io/part-of"] == "predictive-scaler", _key(obj)
    kind = "StatefulSet" if which == "sharded" else "Deployment"
    controller = one(objs, kind, "predictive-scaler-controller")
    assert len(controller["spec"]["template"]["metadata"]["annotations"]["checksum/settings"]) == 64
    assert one(objs, "CustomResourceDefinition")["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_the_settings_checksum_follows_the_settings():
    def checksum(values: dict[str, Any] | None) -> str:
        deployment = one(helm_render(values), "Deployment", "predictive-scaler-controller")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/settings"]

    assert checksum(None) == checksum({"image": {"tag": "0.1.1"}})
    assert checksum(None) != checksum({"prometheus": {"url": "http://prom.obs.svc:9090", "namespace": "obs"}})


EXTRA_VALUES = [
    ("image", {"image": {"repository": "registry.example/ps", "tag": "1.2.3", "pullPolicy": "Always"}}),
    ("prometheus", {"prometheus": {"url": "http://prom.obs.svc:9090", "namespace": "obs"}}),
    ("cluster-budget", {"clusterBudget": {"gpus": 16, "costPerHour": "40"}}),
    ("schedule", {"retrain": {"schedule": "30 2 * * 1", "timeZone": "Europe/Paris"}}),
    ("namespace", {"namespace": {"name": "autoscaling"}}),
    ("no-namespace", {"namespace": {"name": "autoscaling", "create": False}}),
    ("legacy-namespace", LEGACY),
    ("resources", {"controller": {"resources": {"requests": {"cpu": "200m", "memory": "512Mi"}}},
                   "retrain": {"resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}}),
    ("model-store", {"modelStore": {"size": "10Gi", "storageClassName": "fast"}}),
    ("extras-on", EXTRAS_ON),
    ("release-label", {"prometheusOperator": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}}),
    ("keda-elsewhere", {"keda": {"port": 7000, "namespace": "autoscalers"}}),
    ("keda-off", {"keda": {"enabled": False}}),
    ("sharded", {"sharding": {"replicas": 3}}),
]


@pytest.mark.parametrize("values", [v for _, v in EXTRA_VALUES], ids=[i for i, _ in EXTRA_VALUES])
def test_every_object_of_every_render_validates_strictly(values):
    # Against the oldest Kubernetes the chart claims (1.27) and the newest bundled; every value the
    # platform conventions add is rendered and validated in tests/deploy/test_helm_values.py.
    validate_all(helm_render(values))


def _container(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    ((_, pod),) = [(n, p) for n, p in pod_specs(objs) if one(objs, kind)["metadata"]["name"] == n]
    return pod["containers"][0]


def test_values_land_where_the_readme_says():
    objs = helm_render({
        "image": {"repository": "registry.example/ps", "tag": "1.2.3"},
        "prometheus": {"url": "http://prom.obs.svc:9090", "namespace": "obs"},
        "clusterBudget": {"gpus": 16, "costPerHour": "40"},
        "retrain": {"schedule": "30 2 * * 1", "resources": {"limits": {"cpu": "4", "memory": "8Gi"}}},
        "controller": {"reconcileIntervalSeconds": 30, "resources": {"requests": {"cpu": "200m", "memory": "512Mi"}}},
        "modelStore": {"size": "10Gi", "storageClassName": "fast"},
        "namespace": {"name": "autoscaling"},
    })
    settings = one(objs, "ConfigMap", "predictive-scaler-settings")["data"]
    assert settings["PREDICTIVE_SCALER_PROMETHEUS_URL"] == "http://prom.obs.svc:9090"
    assert settings["PREDICTIVE_SCALER_PROMETHEUS_NAMESPACE"] == "obs"
    assert settings["PREDICTIVE_SCALER_CLUSTER_BUDGET_GPUS"] == "16"
    assert settings["PREDICTIVE_SCALER_CLUSTER_BUDGET_COST_PER_HOUR"] == "40"
    assert settings["PREDICTIVE_SCALER_RECONCILE_INTERVAL_SECONDS"] == "30"
    policy = one(objs, "NetworkPolicy", "predictive-scaler")["spec"]
    assert policy["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "obs"}
    assert policy["egress"][1]["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "obs"}
    for kind in ("Deployment", "CronJob"):
        assert _container(objs, kind)["image"] == "registry.example/ps:1.2.3"
    assert _container(objs, "Deployment")["resources"] == {"requests": {"cpu": "200m", "memory": "512Mi"},
                                                           "limits": {"cpu": "1", "memory": "768Mi"}}
    assert _container(objs, "CronJob")["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
    assert one(objs, "CronJob")["spec"]["schedule"] == "30 2 * * 1"
    pvc = one(objs, "PersistentVolumeClaim")["spec"]
    assert (pvc["resources"]["requests"]["storage"], pvc["storageClassName"]) == ("10Gi", "fast")
    namespaced = [o for o in objs if o["kind"] not in (
        "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"autoscaling"}
    assert one(objs, "Namespace")["metadata"]["name"] == "autoscaling"
    for binding in find(objs, "ClusterRoleBinding"):
        assert binding["subjects"][0]["namespace"] == "autoscaling"


def test_image_tag_defaults_to_the_app_version():
    app_version = chart_metadata()["appVersion"]
    assert _container(helm_render(), "Deployment")["image"].endswith(f":{app_version}")


def test_namespace_can_be_left_to_helm():
    assert not find(helm_render({"namespace": {"name": "autoscaling", "create": False}}), "Namespace")
    assert not find(helm_render(), "Namespace")  # the release namespace: Helm's, never the chart's
    assert not find(helm_render({"namespace": {"name": NAMESPACE}}), "Namespace")


def test_the_extras_are_off_by_default_and_each_switches_alone():
    assert not [o for o in helm_render() if o["apiVersion"].startswith("monitoring.coreos.com/")]
    for extra, kind in (("serviceMonitor", "ServiceMonitor"), ("prometheusRule", "PrometheusRule"),
                        ("dashboard", "ConfigMap")):
        objs = helm_render({"prometheusOperator": {extra: {"enabled": True}}})
        added = {_key(o) for o in objs} - {_key(o) for o in helm_render()}
        assert [k[0] for k in added] == [kind], extra


@pytest.mark.parametrize("values, complaint", [
    ({"prometheus": {"ulr": "http://x:9090"}}, "ulr"),
    ({"retrain": {"schedule": 5}}, "schedule"),
    ({"namespace": {"name": "Not_A_Name"}}, "namespace"),
    ({"prometheusOperator": {"serviceMonitor": {"interval": "30 seconds"}}}, "interval"),
    ({"sharding": {"replicas": 0}}, "replicas"),
    ({"sharding": {"replicas": "2"}}, "replicas"),
], ids=["typo", "schedule-not-text", "bad-namespace", "bad-duration", "no-shards", "shards-as-text"])
def test_the_values_schema_refuses_mistakes(values, complaint):
    with pytest.raises(helm.HelmValuesError) as info:
        helm_render(values)
    assert complaint in str(info.value)


@pytest.mark.parametrize("values", [None, EXTRAS_ON, SHARDED, LEGACY], ids=["default", "extras-on", "sharded", "legacy"])
def test_helm_lint_passes_strictly(values):
    report = helm.lint(CHART, values, strict=True, kube_version="v1.27.0", namespace=NAMESPACE)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_helm_lint_catches_a_broken_chart(tmp_path):
    # Guards the check above: the linter really renders and checks the templates.
    broken = tmp_path / "predictive-scaler"
    broken.mkdir()
    (broken / "Chart.yaml").write_text((CHART / "Chart.yaml").read_text())
    (broken / "templates").mkdir()
    (broken / "templates" / "x.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.nope.x }}\n")
    report = helm.lint(broken, None, strict=True)
    assert report["errors"], report


@pytest.mark.parametrize("inside", LINKED, ids=list(LINKED))
def test_the_chart_links_the_one_copy(inside):
    # One source: files/ are symlinks into deploy/, and Helm's loader reads through them.
    link = CHART / inside
    assert link.is_symlink(), f"{inside} must be a symlink to {LINKED[inside].relative_to(DEPLOY)}"
    assert link.resolve() == LINKED[inside].resolve()
    assert not os.path.isabs(os.readlink(link)), "relative, so it works in any clone"
    with helm.Chart.load(CHART) as chart:
        loaded = next(f["data"] for f in chart.files if f["name"] == inside)
    assert loaded == LINKED[inside].read_text()


def test_the_chart_crd_is_the_generated_one():
    assert not (CHART / "crds").exists(), "crds/ is installed once and never upgraded: the CRD is templates/crd.yaml"
    with helm.Chart.load(CHART) as chart:
        source = next(f["data"] for f in chart.files if f["name"] == "files/crd.yaml")
    assert source == crd.render_crd_yaml(), "run `make crd` (deploy/base/crd.yaml, which files/crd.yaml links to)"
    # Sent as generated: only the release's labels and the keep annotation are added.
    rendered = one(helm_render(), "CustomResourceDefinition")
    generated = yaml.safe_load(source)
    assert rendered["spec"] == generated["spec"]
    assert generated["metadata"]["labels"].items() <= rendered["metadata"]["labels"].items()


def test_the_dashboard_configmap_holds_the_dashboard_verbatim():
    dashboard = one(helm_render(EXTRAS_ON), "ConfigMap", "predictive-scaler-dashboard")
    text = dashboard["data"]["predictive-scaler.json"]
    assert text == (DEPLOY / "dashboards" / "predictive-scaler.json").read_text()
    assert json.loads(text)["uid"] == "predictive-scaler"


def test_the_install_doc_documents_every_value():
    readme = (Path(DEPLOY).parent / "docs" / "install.md").read_text()
    section = readme[readme.index("## Install with Helm"):]
    section = section[:section.index("\n## ", 3)]

    def leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, value in node.items():
            if isinstance(value, dict) and value and key not in (
                    "resources", "labels", "nodeSelector", "podSecurityContext", "securityContext"):
                out += leaves(value, f"{prefix}{key}.")
            else:
                out.append(prefix + key)
        return out

    with helm.Chart.load(CHART) as chart:
        missing = [v for v in leaves(chart.values) if f"`{v}`" not in section]
    assert not missing, f"values not documented in docs/install.md's 'Install with Helm': {missing}"


def test_the_keda_values_move_or_remove_the_external_scaler_api():
    objs = helm_render({"keda": {"port": 7000, "namespace": "autoscalers"}})
    assert one(objs, "ConfigMap", "predictive-scaler-settings")["data"]["PREDICTIVE_SCALER_KEDA_PORT"] == "7000"
    assert one(objs, "Service", "predictive-scaler-keda")["spec"]["ports"][0]["port"] == 7000
    assert {"name": "keda", "containerPort": 7000, "protocol": "TCP"} in _container(objs, "Deployment")["ports"]
    keda_in = one(objs, "NetworkPolicy", "predictive-scaler")["spec"]["ingress"][1]
    assert keda_in["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "autoscalers"}
    assert keda_in["ports"] == [{"protocol": "TCP", "port": 7000}]
    off = helm_render({"keda": {"enabled": False}})
    assert not find(off, "Service", "predictive-scaler-keda")
    assert one(off, "ConfigMap", "predictive-scaler-settings")["data"]["PREDICTIVE_SCALER_KEDA_PORT"] == "off"
    assert len(one(off, "NetworkPolicy", "predictive-scaler")["spec"]["ingress"]) == 1
    assert "keda" not in {p["name"] for p in _container(off, "Deployment")["ports"]}


@pytest.mark.parametrize("values, mode", [
    (None, "ReadWriteOnce"),
    (SHARDED, "ReadWriteMany"),
    ({**SHARDED, "modelStore": {"accessMode": "ReadWriteOnce"}}, "ReadWriteOnce"),
    ({"modelStore": {"accessMode": "ReadWriteMany"}}, "ReadWriteMany"),
], ids=["one-controller", "shards", "shards-keeping-an-existing-claim", "chosen"])
def test_the_model_store_is_shared_by_every_shard(values, mode):
    objs = helm_render(values)
    assert one(objs, "PersistentVolumeClaim", "predictive-scaler-models")["spec"]["accessModes"] == [mode]
    shards = (values or {}).get("sharding", {}).get("replicas", 1)
    workloads = [o["kind"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    assert workloads == (["StatefulSet"] if shards > 1 else ["Deployment"])


def _prometheus_egress(values: dict[str, Any]) -> dict[str, Any]:
    """The NetworkPolicy's egress rule towards Prometheus (the second: after the API server's)."""
    egress = one(helm_render(values), "NetworkPolicy", "predictive-scaler")["spec"]["egress"]
    assert len(egress) == 3, egress  # API server, Prometheus, DNS
    return egress[1]


@pytest.mark.parametrize("url, port", [
    ("http://prom.obs.svc:8481", 8481), ("http://prom.obs.svc.cluster.local", 80), ("https://prom.obs", 443),
    ("http://prom.obs:9090/prometheus", 9090)])
def test_prometheus_egress_is_the_urls_port_in_the_urls_namespace(url: str, port: int) -> None:
    rule = _prometheus_egress({"prometheus": {"url": url, "namespace": "obs"}})
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}}]


def test_prometheus_egress_narrows_to_the_pods_named() -> None:
    rule = _prometheus_egress({"prometheus": {"url": "http://prom.obs.svc:9090", "namespace": "obs",
                                              "podLabels": {"app.kubernetes.io/name": "prometheus"}}})
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
                           "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_an_external_prometheus_is_reached_only_at_its_cidrs_and_port() -> None:
    rule = _prometheus_egress({"prometheus": {"url": "https://user:pw@metrics.example.com:8443/api/prom",
                                              "externalCIDRs": ["203.0.113.7/32", "2001:db8::/64"]}})
    assert rule == {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}, {"ipBlock": {"cidr": "2001:db8::/64"}}],
                    "ports": [{"protocol": "TCP", "port": 8443}]}
    # An address is outside the cluster too: only the CIDRs admit it.
    rule = _prometheus_egress({"prometheus": {"url": "http://10.1.2.3:9090", "externalCIDRs": ["10.1.2.3/32"]}})
    assert rule["to"] == [{"ipBlock": {"cidr": "10.1.2.3/32"}}]


@pytest.mark.parametrize("prometheus, says", [
    ({"url": "https://metrics.example.com"}, "is not a Service of this cluster: set prometheus.externalCIDRs"),
    ({"url": "http://10.1.2.3:9090"}, "set prometheus.externalCIDRs"),
    ({"url": "http://prom.obs.svc:9090"}, 'prometheus.url names the Service prom in namespace "obs", but '
                                          'prometheus.namespace is "monitoring"'),
    ({"url": "http://prom.obs.svc:9090", "namespace": "obs", "externalCIDRs": ["0.0.0.0"]}, "externalCIDRs"),
])
def test_an_egress_that_would_not_reach_the_urls_prometheus_is_refused(prometheus: dict[str, Any], says: str) -> None:
    with pytest.raises(Exception, match=re.escape(says)):
        helm_render({"prometheus": prometheus})


def test_the_api_server_rule_narrows_to_its_cidrs() -> None:
    egress = one(helm_render({"networkPolicy": {"apiServerCIDRs": ["172.18.0.2/32"]}}), "NetworkPolicy",
                 "predictive-scaler")["spec"]["egress"]
    assert egress[0]["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]
    assert {p["port"] for p in egress[0]["ports"]} == {443, 6443}
    default = one(helm_render(), "NetworkPolicy", "predictive-scaler")["spec"]["egress"][0]
    assert "to" not in default  # no way to name the API server: the doc says to set the CIDRs
