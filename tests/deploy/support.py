"""Shared helpers of the deploy tests: render overlays, find objects, check schemas.

kubectl renders the kustomizations (the same `kubectl kustomize` a user's
`kubectl apply -k` runs); a missing kubectl is a failure, never a skip.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

#: Every directory a user can `kubectl apply -k`.
OVERLAYS: dict[str, Path] = {
    "default": DEPLOY / "overlays" / "default",
    "prometheus-operator": DEPLOY / "overlays" / "prometheus-operator",
    "sharded": DEPLOY / "overlays" / "sharded",
    "keda-ha": DEPLOY / "overlays" / "keda-ha",
    "example-vllm-forecast-only": DEPLOY / "examples" / "vllm-forecast-only",
    "example-vllm-keda": DEPLOY / "examples" / "vllm-keda",
}


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading exponents without a point (`1e-06`) as floats.

    Go's YAML writers (kubectl kustomize, Helm's toYaml) emit them so, and Kubernetes reads
    them as numbers; YAML 1.1, which PyYAML implements, would read a string.
    """


YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                 list("-+0123456789."))


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is required to render deploy/ (install it; `.ci/run` checks for it)"
    return path


@functools.cache
def _render_text(directory: str) -> str:
    done = subprocess.run([kubectl(), "kustomize", directory], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return done.stdout


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k directory` would send (a fresh copy each call)."""
    docs = [d for d in yaml.load_all(_render_text(str(directory)), Loader=YamlLoader) if d]
    return copy.deepcopy(docs)


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of every workload in the rendered objects."""
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield o["metadata"]["name"], o["spec"]["template"]["spec"]
        elif o["kind"] == "CronJob":
            yield o["metadata"]["name"], o["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def openapi_to_jsonschema(node: Any, *, strict: bool = True) -> Any:
    """An apiextensions OpenAPI v3 schema as a Draft 4 JSON Schema.

    Draft 4 shares OpenAPI 3.0's boolean exclusiveMinimum/Maximum; ``nullable``
    and ``x-kubernetes-int-or-string`` become type unions. With ``strict``,
    objects reject unknown fields, as `kubectl apply` (server-side field
    validation, Strict by default) does — so a typo in an example fails here.
    """
    if isinstance(node, list):
        return [openapi_to_jsonschema(n, strict=strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v, strict=strict) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k != "nullable"}
    # Sub-schema maps: their keys are field names, not keywords.
    if "properties" in node:
        out["properties"] = {k: openapi_to_jsonschema(v, strict=strict) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (strict and node.get("type") == "object" and "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out
