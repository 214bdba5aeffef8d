"""Every overlay renders, and every object it renders is checked against a schema.

Built-in kinds against the newest Kubernetes schemas kubernetes-validate bundles
(strict: unknown fields fail; a missing schema for a built-in kind fails);
PredictiveScalers against the CRD's own openAPIV3Schema; Prometheus Operator
kinds against the fields we use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from predictive_scaler import crd
from predictive_scaler.kube.manifests import API_VERSION, KIND

from .schemas import K8S_VERSION, KEDA_SCHEMAS, MONITORING_SCHEMAS
from .support import DEPLOY, OVERLAYS, openapi_to_jsonschema, render


def _rendered() -> list[tuple[str, dict[str, Any]]]:
    return [(name, obj) for name, path in OVERLAYS.items() for obj in render(path)]


def _obj_id(item: tuple[str, dict[str, Any]]) -> str:
    overlay, obj = item
    return f"{overlay}:{obj['kind']}/{obj['metadata']['name']}"


RENDERED = _rendered()


@pytest.mark.parametrize("overlay", OVERLAYS, ids=list(OVERLAYS))
def test_overlay_renders_objects(overlay):
    objs = render(OVERLAYS[overlay])
    assert objs, f"{overlay} rendered nothing"
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs]
    assert len(ids) == len(set(ids)), "duplicate objects"


@pytest.mark.parametrize("item", RENDERED, ids=[_obj_id(i) for i in RENDERED])
def test_object_validates(item):
    _, obj = item
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    if obj["kind"] == KIND:
        schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(openapi_to_jsonschema(schema)).validate(obj)
        assert obj["apiVersion"] == API_VERSION
    elif group == "monitoring.coreos.com":
        jsonschema.Draft202012Validator(MONITORING_SCHEMAS[obj["kind"]]).validate(obj)
    elif group == "keda.sh":
        jsonschema.Draft202012Validator(KEDA_SCHEMAS[obj["kind"]]).validate(obj)
    else:
        # Built-in (incl. apiextensions CRDs): a SchemaNotFoundError here is a failure.
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("field, value", [
    ("spec.mode", "sometimes"),
    ("spec.minReplicas", -1),
    ("spec.notAField", 1),
], ids=["bad-mode", "negative-min", "unknown-field"])
def test_crd_schema_rejects_a_broken_example(field, value):
    example = next(o for _, o in RENDERED if o["kind"] == KIND)
    node = example
    *parents, leaf = field.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(openapi_to_jsonschema(schema)).validate(example)


@pytest.mark.parametrize("kind, bad", [
    ("ServiceMonitor", {"spec": {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "30s"}]}}),
    ("PrometheusRule", {"spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "30 minutes"}]}]}}),
], ids=["servicemonitor-typo", "rule-bad-duration"])
def test_monitoring_schemas_reject_mistakes(kind, bad):
    obj = {"apiVersion": "monitoring.coreos.com/v1", "kind": kind, "metadata": {"name": "x", "namespace": "y"}, **bad}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(MONITORING_SCHEMAS[kind]).validate(obj)


# --- kustomizations list exactly the files that exist ------------------------------------

def _kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml"))


def _referenced(directory: Path) -> tuple[set[str], list[Path]]:
    """Local files a kustomization uses, and the other kustomization directories it includes."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    files: set[str] = set()
    dirs: list[Path] = []
    entries = list(k.get("resources", [])) + list(k.get("components", []))
    entries += [p["path"] for p in k.get("patches", []) if "path" in p]
    entries += list(k.get("patchesStrategicMerge", []))
    for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        entries += [f.split("=", 1)[-1] for f in gen.get("files", [])]
    for entry in entries:
        target = (directory / entry).resolve()
        if target.is_dir():
            dirs.append(target)
        else:
            files.add(entry)
    return files, dirs


@pytest.mark.parametrize("directory", _kustomization_dirs(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomization_lists_exactly_its_files(directory):
    files, dirs = _referenced(directory)
    present = {p.name for p in directory.iterdir() if p.is_file() and p.name != "kustomization.yaml"}
    assert files == present, f"listed but missing: {sorted(files - present)}; present but not listed: {sorted(present - files)}"
    for d in dirs:
        assert (d / "kustomization.yaml").is_file(), f"{d} is not a kustomization"


def test_every_kustomization_is_rendered_by_a_test():
    rendered_roots = set(OVERLAYS.values())
    for path in OVERLAYS.values():
        stack = [path]
        while stack:
            d = stack.pop()
            rendered_roots.add(d)
            stack += _referenced(d)[1]
    assert set(_kustomization_dirs()) <= {p.resolve() for p in rendered_roots}
