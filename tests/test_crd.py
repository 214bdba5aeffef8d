"""The CRD builder: spec schema from spec.py, structural status schema, printer columns, no drift."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from predictive_scaler import crd
from predictive_scaler.kube.manifests import API_VERSION, KIND

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "deploy" / "base" / "crd.yaml"

#: Keys of apiextensions.k8s.io/v1 JSONSchemaProps that a structural schema may use.
ALLOWED_KEYS = frozenset({
    "description", "type", "format", "title", "default", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf",
    "oneOf", "anyOf", "not", "properties", "additionalProperties", "nullable", "example",
    "externalDocs", "uniqueItems",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
    "x-kubernetes-embedded-resource", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-validations",
})
JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool,
              "integer": int, "number": (int, float)}


def structural_problems(node: dict[str, Any], path: str = "") -> list[str]:  # noqa: C901
    """Why the API server would reject ``node`` as a structural schema (empty list: it would not)."""
    problems = [f"{path}: {key!r} is not allowed in a CRD schema"
                for key in node if key not in ALLOWED_KEYS]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if "type" not in node and not preserve and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: no type (structural schemas need one on every node)")
    if node.get("uniqueItems") is True:
        problems.append(f"{path}: uniqueItems true is forbidden")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties false is forbidden")
    if "properties" in node and node.get("type") != "object":
        problems.append(f"{path}: properties on a non-object")
    if node.get("type") == "array":
        if not isinstance(node.get("items"), dict):
            problems.append(f"{path}: arrays need one items schema")
    expected = JSON_TYPES.get(node.get("type", ""))
    for value in node.get("enum", []):
        if expected is not None and (not isinstance(value, expected) or isinstance(value, bool) != (node["type"] == "boolean")):
            problems.append(f"{path}: enum value {value!r} is not a {node['type']}")
    if "default" in node and expected is not None and not isinstance(node["default"], expected):
        problems.append(f"{path}: default {node['default']!r} is not a {node['type']}")
    if node.get("x-kubernetes-list-type") == "map":
        item = node.get("items", {})
        for key in node.get("x-kubernetes-list-map-keys", []):
            if key not in item.get("required", []) and "default" not in item.get("properties", {}).get(key, {}):
                problems.append(f"{path}: list-map key {key!r} must be required")
    for name, child in node.get("properties", {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        problems += structural_problems(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}{{}}")
    for key in ("allOf", "anyOf", "oneOf"):
        for i, child in enumerate(node.get(key, [])):
            # Under junctors only value validations are allowed; types must not differ.
            for banned in ("description", "default", "x-kubernetes-preserve-unknown-fields"):
                if banned in child:
                    problems.append(f"{path}.{key}[{i}]: {banned!r} is forbidden under {key}")
    return problems


def schema_at(root: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    """The schema node a printer column's JSONPath reads (a ``[?(…)]`` filter steps into items)."""
    node: dict[str, Any] | None = root
    for part in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
        name, filtered = part.removesuffix("[]"), part.endswith("[]")
        if node is None:
            return None
        node = node.get("properties", {}).get(name)
        if filtered and node is not None:
            node = node.get("items")
    return node


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return crd.build_crd()


def _version(crd_obj: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd_obj["spec"]["versions"]
    return version


def test_names_match_the_decisions(built):
    names = built["spec"]["names"]
    assert built["metadata"]["name"] == "predictivescalers.autoscaling.predictive-scaler.io"
    assert (built["spec"]["group"], _version(built)["name"]) == ("autoscaling.predictive-scaler.io", "v1alpha1")
    assert (names["kind"], names["plural"], names["shortNames"]) == ("PredictiveScaler", "predictivescalers", ["pscaler"])
    assert built["spec"]["scope"] == "Namespaced"
    assert _version(built)["subresources"] == {"status": {}}, "status subresource, no scale subresource"


def test_spec_schema_is_spec_py_output(built):
    from predictive_scaler.spec import spec_json_schema

    spec = _version(built)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec == json.loads(json.dumps(spec_json_schema()))


def test_validates_as_apiextensions_v1_crd(built):
    kubernetes_validate.validate(built, kubernetes_validate.utils.latest_version(), strict=True)


def test_schema_is_structural(built):
    assert structural_problems(_version(built)["schema"]["openAPIV3Schema"]) == []


@pytest.mark.parametrize("bad_schema, complaint", [
    ({"type": "object", "properties": {"a": {"description": "untyped"}}}, "no type"),
    ({"type": "object", "properties": {"a": {"type": "string", "const": "x"}}}, "'const' is not allowed"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["x", 1]}}}, "enum value 1"),
    ({"type": "object", "additionalProperties": False, "properties": {}}, "mutually exclusive"),
], ids=["untyped", "const", "unique-items", "mixed-enum", "closed-object"])
def test_structural_check_catches(bad_schema, complaint):
    problems = structural_problems(crd.build_crd(bad_schema)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert any(complaint in p for p in problems), problems


def test_status_keeps_planner_state_and_lists_conditions_by_type(built):
    status = crd.status_json_schema()
    assert status["properties"]["plannerState"]["x-kubernetes-preserve-unknown-fields"] is True
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    for field in ("conditions", "forecast", "desiredReplicas", "currentReplicas", "placeholderGpus",
                  "budgetInUse", "modelVersion", "lastReconcileTime", "strategy", "plannerState"):
        assert field in status["properties"], field
    assert set(status["properties"]["forecast"]["properties"]) >= {"p50", "p95"}


@pytest.mark.parametrize("column", crd.PRINTER_COLUMNS, ids=[c["name"] for c in crd.PRINTER_COLUMNS])
def test_printer_column_points_at_a_schema_field_of_its_type(built, column):
    if column["jsonPath"].startswith(".metadata."):
        return  # served by the API server, not by our schema
    node = schema_at(_version(built)["schema"]["openAPIV3Schema"], column["jsonPath"])
    assert node is not None, f"{column['name']}: {column['jsonPath']} is not in the schema"
    assert node["type"] == column["type"], f"{column['name']}: schema type {node['type']} vs column {column['type']}"


def test_printer_columns_are_the_agreed_ones(built):
    columns = _version(built)["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Target", "Mode", "Strategy", "Ready", "Desired", "Replicas", "Prewarm GPUs", "Budget", "Age"]
    # `kubectl get pscaler -o wide` adds these.
    assert [c["name"] for c in columns if c.get("priority", 0) >= 1] == ["Quantile", "Horizon", "Model", "Reason"]
    ready = next(c for c in columns if c["name"] == "Ready")
    assert ready["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status', "READY is the condition, as in KEDA"


SAMPLE_STATUS: dict[str, Any] = {
    "strategy": "predictive", "desiredReplicas": 6, "currentReplicas": 4, "placeholderGpus": 8,
    "budgetInUse": {"gpus": 3}, "modelVersion": "v7",
    "conditions": [
        {"type": "Predictive", "status": "True", "reason": "Forecasting"},
        {"type": "Ready", "status": "False", "reason": "ScalingLimited"},
        {"type": "Drift", "status": "False", "reason": "WithinBand"},
    ],
}
# What each column must show for SAMPLE_STATUS (and the spec below).
EXPECTED_CELLS = {"Target": "llm", "Mode": "scale", "Strategy": "predictive", "Ready": "False", "Desired": "6",
                  "Replicas": "4", "Prewarm GPUs": "8", "Budget": "3", "Quantile": "0.9", "Horizon": "3600",
                  "Model": "v7", "Reason": "ScalingLimited", "Age": "2026-01-02T03:04:05Z"}


@pytest.mark.kubectl
@pytest.mark.parametrize("column", crd.PRINTER_COLUMNS, ids=[c["name"] for c in crd.PRINTER_COLUMNS])
def test_printer_column_shows_the_sample_status(tmp_path, column):
    # kubectl's own JSONPath engine (client-go's, the one the API server's table printer uses),
    # run on a local file: no cluster is contacted.
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is required (it evaluates the printer columns' JSONPaths)"
    sample = {"apiVersion": API_VERSION, "kind": KIND,
              "metadata": {"name": "llm", "namespace": "ml", "creationTimestamp": "2026-01-02T03:04:05Z"},
              "spec": {"target": {"name": "llm"}, "demand": {"kind": "dcgm-busy-gpus"}, "mode": "scale",
                       "quantile": 0.9, "horizonSeconds": 3600},
              "status": SAMPLE_STATUS}
    path = tmp_path / "sample.yaml"
    path.write_text(yaml.safe_dump(sample))
    done = subprocess.run([kubectl, "annotate", "--local", "-f", str(path), "--kubeconfig", os.devnull,
                           "checked=yes", "-o", "jsonpath={" + column["jsonPath"] + "}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXPECTED_CELLS[column["name"]]


def test_committed_yaml_is_the_generated_one():
    assert CRD_FILE.read_text() == crd.render_crd_yaml(), (
        "deploy/base/crd.yaml is out of date: run "
        "`.venv/bin/python -m predictive_scaler.crd > deploy/base/crd.yaml`")


def test_module_prints_the_crd():
    done = subprocess.run([sys.executable, "-m", "predictive_scaler.crd"], capture_output=True,
                          text=True, timeout=60, check=True, cwd=REPO)
    assert yaml.safe_load(done.stdout) == crd.build_crd()


def test_fits_kubectl_client_side_apply():
    # `kubectl apply` (client side) stores the object in an annotation limited to 256 KiB;
    # a bigger CRD would need --server-side, breaking the one documented command.
    assert len(yaml.safe_dump(crd.build_crd()).encode()) < 200_000
