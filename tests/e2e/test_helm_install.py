"""The Helm chart's installs, sent to the real 1.20 API server (server-side dry run).

The chart and the kustomize overlay render the same objects (tests/deploy/test_helm_chart.py);
here the API server itself — its schemas, defaulting and admission plugins, RBAC escalation
checks on the ClusterRoles — judges what `helm install` would send: the default install, the
sharded one, and one with every platform value set (tests/deploy/test_helm_values.py) under
another release name in another namespace. A dry run, because the kustomize install of the same
objects is what the other end-to-end tests run on: the cluster has one CRD, one set of
ClusterRoles and one controller, as in a real cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy.helm_support import helm_render
from tests.deploy.support import OVERLAYS, render
from tests.support.kubeapi import KubeApiServer, served

#: Where the platform-values install goes (created for real: a dry run needs its namespace).
PLATFORM_NAMESPACE = "helm-values"
#: 1.20 serves policy/v1beta1 only (policy/v1 is 1.21+): the PodDisruptionBudget is validated offline.
NOT_SERVED_BY_1_20 = {("policy/v1", "PodDisruptionBudget")}


def _platform(component: str, extra_args: list[str]) -> dict[str, Any]:
    return {
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-role.example.com/platform", "operator": "Exists"}]}]}}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
        "nodeSelector": {"node-role.example.com/platform": "true"},
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/owner": "ml-platform"}, "podLabels": {"team": "ml-platform"},
        "env": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "envFrom": [{"secretRef": {"name": "prometheus-credentials", "optional": True}}],
        "extraArgs": extra_args,
        "extraVolumes": [{"name": "corporate-ca", "configMap": {"name": "corporate-ca", "optional": True}}],
        "extraVolumeMounts": [{"name": "corporate-ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
        # OpenShift's shape: the SCC would assign the IDs.
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"runAsUser": None},
    }


PLATFORM_VALUES: dict[str, Any] = {
    "controller": {**_platform("controller", ["--namespace=inference"]),
                   "podDisruptionBudget": {"enabled": True}},
    "retrain": _platform("retrain", ["--processes=2"]),
    "sharding": {"replicas": 2},
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "serviceAccount": {"controller": {"annotations": {"iam.gke.io/gcp-service-account": "ps@p.iam.gserviceaccount.com"}},
                       "retrain": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/ps"}}},
    "prometheusOperator": {"dashboard": {"enabled": True}},
}

#: What is sent: the chart's default install, the chart with 3 shards, the sharded kustomize overlay,
#: and the chart with every platform value under release `ml` in PLATFORM_NAMESPACE.
INSTALLS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "helm-default": helm_render,
    # The cluster already has the one-replica install, whose model-store claim is ReadWriteOnce and
    # immutable: adding shards to it keeps that claim (the chart's documented upgrade path) ...
    "helm-sharded": lambda: helm_render({"sharding": {"replicas": 3}, "modelStore": {"accessMode": "ReadWriteOnce"}}),
    # ... and the overlay (a fresh install's ReadWriteMany claim, validated offline in tests/deploy) is
    # sent without its claim.
    "kustomize-sharded": lambda: [o for o in render(OVERLAYS["sharded"]) if o["kind"] != "PersistentVolumeClaim"],
    "helm-platform-values": lambda: helm_render(PLATFORM_VALUES, name="ml", namespace=PLATFORM_NAMESPACE),
    # The KEDA-only Deployment beside the controller, with TLS (the Secret need not exist for admission),
    # and the overlay that equals it (tests/deploy/test_keda_ha.py); their PodDisruptionBudget is policy/v1.
    "helm-keda-ha": lambda: helm_render({"keda": {"highAvailability": {"enabled": True},
                                                  "tls": {"secretName": "predictive-scaler-keda-tls", "clientCA": True}}}),
    "kustomize-keda-ha": lambda: render(OVERLAYS["keda-ha"]),
}
#: The installs with a policy/v1 PodDisruptionBudget (validated offline: 1.20 serves policy/v1beta1 only).
WITH_PDB = {"helm-platform-values", "helm-keda-ha", "kustomize-keda-ha"}


@pytest.mark.parametrize("install", INSTALLS, ids=list(INSTALLS))
def test_the_helm_install_is_admitted_by_the_real_api_server(kube_api: KubeApiServer, install: str) -> None:
    objects = INSTALLS[install]()
    keep, left = served([o for o in objects if (o["apiVersion"], o["kind"]) not in NOT_SERVED_BY_1_20])
    assert [o["kind"] for o in left] == ["CronJob"]  # batch/v1 CronJob is 1.21+, as for kustomize
    pdbs = [o for o in objects if (o["apiVersion"], o["kind"]) in NOT_SERVED_BY_1_20]
    assert len(pdbs) == (install in WITH_PDB)
    if install == "helm-platform-values":
        kube_api.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLATFORM_NAMESPACE}}])
    done = kube_api.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(keep))
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == len(keep), done.stdout
    assert all(line.endswith("(server dry run)") for line in lines), done.stdout
    kinds = {o["kind"] for o in keep}
    controller = "StatefulSet" if "sharded" in install or install == "helm-platform-values" else "Deployment"
    assert {"CustomResourceDefinition", controller, "ClusterRole", "ClusterRoleBinding", "PriorityClass",
            "NetworkPolicy", "ConfigMap", "Service", "ServiceAccount"} <= kinds
    assert ("PersistentVolumeClaim" in kinds) == (install != "kustomize-sharded")
    if controller == "StatefulSet":
        assert "Deployment" not in kinds  # one controller workload, never both
    if "sharded" in install:
        assert "statefulset.apps/predictive-scaler-controller created (server dry run)" in done.stdout
    if "keda-ha" in install:
        assert "deployment.apps/predictive-scaler-keda created (server dry run)" in done.stdout
        assert "deployment.apps/predictive-scaler-controller configured (server dry run)" in done.stdout
    if install == "helm-platform-values":
        assert "statefulset.apps/ml-predictive-scaler-controller created (server dry run)" in done.stdout
        assert "clusterrolebinding.rbac.authorization.k8s.io/ml-predictive-scaler-controller created" in done.stdout
        assert {o["metadata"].get("namespace") for o in keep if o["kind"] not in (
            "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass")} == {PLATFORM_NAMESPACE}
