"""Render the Helm chart in-process and check what it renders, without kubectl.

Helm runs through ``helm-python-sdk`` (PyPI), which bundles the Helm v4 Go library
(``libhelm_c``): ``helm template`` without a helm binary, a cluster or the network.
Nothing here runs a program, so a module that imports only this, ``.schemas`` and
``.support`` renders nothing when it is imported (tests/support/markers.py).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

from .schemas import K8S_VERSION, MONITORING_SCHEMAS
from .support import DEPLOY, YamlLoader

CHART = DEPLOY / "helm" / "predictive-scaler"
RELEASE = "predictive-scaler"
#: `helm install predictive-scaler <chart> -n predictive-scaler-system --create-namespace`: the
#: namespace the kustomize install uses, so the default render is comparable with it.
NAMESPACE = "predictive-scaler-system"


@functools.cache
def chart_metadata() -> dict[str, Any]:
    with helm.Chart.load(CHART) as chart:
        return dict(chart.metadata)


def oldest_kubernetes() -> str:
    """The oldest Kubernetes the chart accepts (Chart.yaml's kubeVersion, as docs/install.md says)."""
    found = re.fullmatch(r">=\s*(\d+\.\d+)\.\d+(-0)?", chart_metadata()["kubeVersion"])
    assert found, chart_metadata()["kubeVersion"]
    return f"{found.group(1)}.0"


#: Every rendered object is checked against the oldest Kubernetes the chart claims and the newest bundled.
K8S_VERSIONS = (oldest_kubernetes(), K8S_VERSION)


def render_templates(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE,
                     upgrade: bool = False) -> dict[str, str]:
    """Template path -> rendered text, as `helm install` (or `helm upgrade`) would render them."""
    with helm.Chart.load(CHART) as chart:
        assert not chart.crds, "the CRD is a template (templates/crd.yaml), so `helm upgrade` upgrades it"
        return chart.render(values=values, name=name, namespace=namespace, is_install=not upgrade,
                            is_upgrade=upgrade)


def helm_render(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE,
                upgrade: bool = False) -> list[dict[str, Any]]:
    """The objects `helm install <name> deploy/helm/predictive-scaler -n <namespace>` would send."""
    manifests = render_templates(values, name=name, namespace=namespace, upgrade=upgrade)
    return [d for path in sorted(manifests) if not path.endswith("NOTES.txt")
            for d in yaml.load_all(manifests[path], Loader=YamlLoader) if d]


def helm_notes(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """What `helm install` prints after installing (templates/NOTES.txt)."""
    manifests = render_templates(values, name=name, namespace=namespace)
    (notes,) = [text for path, text in manifests.items() if path.endswith("NOTES.txt")]
    return notes


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def validate(obj: dict[str, Any], version: str = K8S_VERSION) -> None:
    """Strictly (unknown fields fail) against Kubernetes `version`, or the Prometheus Operator fields we use."""
    if obj["apiVersion"].startswith("monitoring.coreos.com/"):
        jsonschema.Draft202012Validator(MONITORING_SCHEMAS[obj["kind"]]).validate(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


def validate_all(objs: list[dict[str, Any]]) -> None:
    assert len({key(o) for o in objs}) == len(objs), "duplicate objects"
    for version in K8S_VERSIONS:
        for obj in objs:
            validate(obj, version)
