"""The Helm chart's default install, sent to the real 1.20 API server (server-side dry run).

The chart and the kustomize overlay render the same objects (tests/deploy/test_helm_chart.py);
here the API server itself — its schemas, defaulting and admission plugins, RBAC escalation
checks on the ClusterRoles — judges what `helm install` would send. A dry run, because the
kustomize install of the same objects is what the other end-to-end tests run on: the cluster
has one CRD, one set of ClusterRoles and one controller, as in a real cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy.support import OVERLAYS, render
from tests.deploy.test_helm_chart import SHARDED, helm_render
from tests.support.kubeapi import KubeApiServer, served

#: What is sent: the chart's default install, the chart with 3 shards, the sharded kustomize overlay.
INSTALLS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "helm-default": helm_render,
    # The cluster already has the one-replica install, whose model-store claim is ReadWriteOnce and
    # immutable: adding shards to it keeps that claim (the chart's documented upgrade path) ...
    "helm-sharded": lambda: helm_render({"sharding": {**SHARDED["sharding"], "replicas": 3},
                                         "modelStore": {"accessMode": "ReadWriteOnce"}}),
    # ... and the overlay (a fresh install's ReadWriteMany claim, validated offline in tests/deploy) is
    # sent without its claim.
    "kustomize-sharded": lambda: [o for o in render(OVERLAYS["sharded"]) if o["kind"] != "PersistentVolumeClaim"],
}


@pytest.mark.parametrize("install", INSTALLS, ids=list(INSTALLS))
def test_the_helm_install_is_admitted_by_the_real_api_server(kube_api: KubeApiServer, install: str) -> None:
    keep, left = served(INSTALLS[install]())
    assert [o["kind"] for o in left] == ["CronJob"]  # batch/v1 CronJob is 1.21+, as for kustomize
    done = kube_api.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(keep))
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == len(keep), done.stdout
    assert all(line.endswith("(server dry run)") for line in lines), done.stdout
    kinds = {o["kind"] for o in keep}
    controller = "StatefulSet" if "sharded" in install else "Deployment"
    assert {"CustomResourceDefinition", controller, "ClusterRole", "ClusterRoleBinding", "PriorityClass",
            "NetworkPolicy", "ConfigMap", "Service", "ServiceAccount"} <= kinds
    assert ("PersistentVolumeClaim" in kinds) == (install != "kustomize-sharded")
    if "sharded" in install:
        assert "Deployment" not in kinds  # one controller workload, never both
        assert "statefulset.apps/predictive-scaler-controller created (server dry run)" in done.stdout
