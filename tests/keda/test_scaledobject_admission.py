"""The shipped ScaledObjects are admitted, and their fallback valid, by every claimed KEDA release.

For each release tag 2.12.0 … 2.20.2 (SOURCE.md beside the fixture):

- the CRD: the served ``openAPIV3Schema`` of KEDA's ``config/crd/bases/keda.sh_scaledobjects.yaml``
  at that tag (tests/keda/fixtures/keda_scaledobject_schemas.json), unknown fields refused as
  ``kubectl apply``'s strict field validation does, and its ``x-kubernetes-validations`` rules
  (2.20: min ≤ max replicas) evaluated;
- the fallback rule, re-implemented from KEDA's source (Apache-2.0; read, not copied):
  ``CheckFallbackValid`` in ``apis/keda/v1alpha1/scaledobject_types.go``, which the admission
  webhook (``verifyFallback`` in ``apis/keda/v1alpha1/scaledobject_webhook.go``) calls from v2.14.0:
  v2.14–v2.16 refuse a cpu or memory trigger and any trigger whose ``metricType`` is not written
  ``AverageValue`` (the webhook only logs it: ``verifyFallback`` returns nil); v2.17 needs one trigger
  other than cpu/memory with ``metricType: AverageValue`` written; v2.18 on, one trigger other than
  cpu/memory (and the webhook refuses). Before v2.14 there is no such check; the fallback applies
  per metric whose HPA target is ``AverageValue`` (``isFallbackEnabled`` in ``pkg/fallback/fallback.go``),
  which an external trigger's is unless it says otherwise (``GetMetricTargetType`` in
  ``pkg/scalers/scaler.go``);
- the webhook's other rules for these objects: ``ValidateTriggers`` (``scaletriggers_types.go``: unique
  trigger names, no ``useCachedMetrics`` on cpu/memory/cron) and ``verifyCPUMemoryScalers`` (a cpu
  trigger needs a cpu request on the target's containers; read from the example's Deployment).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cel
import jsonschema
import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "deploy" / "examples" / "vllm-keda"
FIXTURE = json.loads((HERE / "fixtures" / "keda_scaledobject_schemas.json").read_text())
TAGS = sorted(FIXTURE["tags"], key=lambda t: tuple(int(p) for p in t[1:].split(".")))
#: The one under "A fallback instead of the cpu trigger" in docs/keda.md: the variant users copy.
VARIANT = (ROOT / "docs" / "keda.md").read_text().split("### A fallback instead of the cpu trigger", 1)[1]
SHIPPED = {"scaledobject.yaml": yaml.safe_load((EXAMPLE / "scaledobject.yaml").read_text()),
           "docs/keda.md fallback variant": yaml.safe_load(VARIANT.split("```yaml\n", 1)[1].split("```", 1)[0])}
INT32 = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def release(tag: str) -> tuple[int, ...]:
    return tuple(int(p) for p in tag[1:].split("."))


def strict(node: Any) -> Any:
    """An apiextensions OpenAPI v3 schema as JSON Schema: unknown fields refused unless preserved,
    int-or-string and nullable as type unions, int32/int64 bounds."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in (
        "nullable", "format", "properties")}
    if "properties" in node:
        out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("type") == "integer" and node.get("format") in INT32:
        out["minimum"], out["maximum"] = INT32[node["format"]]
    if (node.get("type") == "object" and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def cel_rejections(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    found = []
    for rule in schema.get("x-kubernetes-validations", ()):
        if cel.evaluate(rule["rule"], {"self": value}) is not True:
            found.append(f"{path or '.'}: {rule['message']}")
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key in value:
                found += cel_rejections(child, value[key], f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += cel_rejections(schema["items"], item, f"{path}[{i}]")
    return found


def crd_problems(tag: str, so: dict[str, Any]) -> list[str]:
    schema = FIXTURE["schemas"][FIXTURE["tags"][tag]]
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft4Validator(strict(schema)).iter_errors(so)]
    return errors + cel_rejections(schema, so)


def check_fallback_valid(tag: str, so: dict[str, Any]) -> str | None:
    """CheckFallbackValid of KEDA ``tag`` (None: valid, or no such check in that release)."""
    spec = so["spec"]
    fallback = spec.get("fallback")
    if fallback is None or release(tag) < (2, 14, 0):
        return None
    if fallback["failureThreshold"] < 0 or fallback["replicas"] < 0:
        return "FailureThreshold & Replicas must both be greater than or equal to 0"
    triggers = spec["triggers"]
    modifiers = (spec.get("advanced") or {}).get("scalingModifiers")
    if release(tag) < (2, 17, 0):
        for t in triggers:
            if t["type"] in ("cpu", "memory"):
                return f"type is {t['type']}, but fallback it is not supported by the CPU & memory scalers"
            if t.get("metricType", "") != "AverageValue":
                return (f"MetricType={t.get('metricType', '')}, but Fallback can only be enabled for triggers with "
                        "metric of type AverageValue")
        return None
    if modifiers:
        if release(tag) < (2, 18, 0) and modifiers.get("metricType") == "Value":
            return "ScalingModifiers.MetricType must be AverageValue to have fallback enabled"
        return None
    others = [t for t in triggers if t["type"] not in ("cpu", "memory")]
    if release(tag) < (2, 18, 0):
        others = [t for t in others if t.get("metricType", "") == "AverageValue"]
    return None if others else "at least one trigger (that is not cpu or memory) has to have the AverageValue type"


def webhook_refuses_fallback(tag: str) -> bool:
    """verifyFallback returns CheckFallbackValid's error from v2.17.0; v2.14–v2.16 log it and admit."""
    return release(tag) >= (2, 17, 0)


def fallback_applies(tag: str, so: dict[str, Any]) -> bool:
    """Whether a failing external trigger falls back to fallback.replicas (pkg/fallback/fallback.go)."""
    if so["spec"].get("fallback") is None or check_fallback_valid(tag, so) is not None:
        return False
    return all(t.get("metricType", "AverageValue") == "AverageValue"
               for t in so["spec"]["triggers"] if t["type"] in ("external", "external-push"))


def other_webhook_problems(so: dict[str, Any]) -> list[str]:
    problems = []
    names = [t["name"] for t in so["spec"]["triggers"] if t.get("name")]
    if len(names) != len(set(names)):
        problems.append("a trigger name is defined twice")
    for t in so["spec"]["triggers"]:
        if t.get("useCachedMetrics") and t["type"] in ("cpu", "memory", "cron"):
            problems.append(f"useCachedMetrics on {t['type']}")
        if t["type"] in ("external", "external-push") and t.get("metricType") == "Utilization":
            problems.append("an external trigger cannot use Utilization")
    if any(t["type"] in ("cpu", "memory") for t in so["spec"]["triggers"]):
        [deployment] = [d for d in yaml.safe_load_all((ROOT / "deploy" / "examples" / "vllm-forecast-only"
                                                        / "deployment.yaml").read_text())
                        if d and d["kind"] == "Deployment" and d["metadata"]["name"] == so["spec"]["scaleTargetRef"]
                        ["name"]]
        for t in so["spec"]["triggers"]:
            if t["type"] in ("cpu", "memory"):
                for c in deployment["spec"]["template"]["spec"]["containers"]:
                    if t["type"] not in ((c.get("resources") or {}).get("requests") or {}):
                        problems.append(f"container {c['name']} has no {t['type']} request")
    return problems


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_scaledobjects_pass_every_claimed_release(tag: str, name: str) -> None:
    so = SHIPPED[name]
    assert crd_problems(tag, so) == []
    assert check_fallback_valid(tag, so) is None
    assert other_webhook_problems(so) == []
    [external] = [t for t in so["spec"]["triggers"] if t["type"] in ("external", "external-push")]
    assert external["metricType"] == "AverageValue"  # written: KEDA 2.17's rule reads the field, not its default
    if so["spec"].get("fallback"):
        assert fallback_applies(tag, so)


def test_the_shipped_example_and_its_variant_differ_only_as_documented() -> None:
    main, variant = SHIPPED["scaledobject.yaml"], SHIPPED["docs/keda.md fallback variant"]
    assert "fallback" not in main["spec"] and [t["type"] for t in main["spec"]["triggers"]] == ["external", "cpu"]
    assert variant["spec"]["fallback"] and [t["type"] for t in variant["spec"]["triggers"]] == ["external"]
    assert {k: v for k, v in main["spec"].items() if k != "triggers"} == {
        k: v for k, v in variant["spec"].items() if k not in ("triggers", "fallback")}
    assert main["spec"]["triggers"][0] == variant["spec"]["triggers"][0]
    assert "scaledobject.yaml" in yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())["resources"]


OLD = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "llm", "namespace": "ml"},
       "spec": {"scaleTargetRef": {"name": "llm"}, "fallback": {"failureThreshold": 3, "replicas": 4},
                "triggers": [{"type": "external", "metadata": {"scalerAddress": "a:6000", "scalerName": "llm"}},
                             {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}]}}


@pytest.mark.parametrize(("tag", "problem", "refused"), [
    ("v2.13.1", None, False), ("v2.14.0", "MetricType=, but Fallback", False),
    ("v2.16.1", "MetricType=, but Fallback", False), ("v2.17.0", "has to have the AverageValue", True),
    ("v2.18.0", None, False), ("v2.20.2", None, False)])
def test_the_rule_as_reimplemented_finds_what_was_wrong_with_the_old_example(tag: str, problem: str | None,
                                                                            refused: bool) -> None:
    """The old example (fallback beside a cpu trigger, metricType left to its default) against the rule,
    so a rule that passed everything could not pass this module."""
    found = check_fallback_valid(tag, OLD)
    assert (found is None) is (problem is None) and (problem is None or problem in (found or ""))
    assert (found is not None and webhook_refuses_fallback(tag)) is refused
    assert crd_problems(tag, OLD) == []


@pytest.mark.parametrize("tag", ["v2.12.0", "v2.16.1", "v2.17.0", "v2.20.2"])
def test_the_crd_check_is_strict(tag: str) -> None:
    typo = json.loads(json.dumps(SHIPPED["scaledobject.yaml"]))
    typo["spec"]["triggers"][0]["metricTyp"] = typo["spec"]["triggers"][0].pop("metricType")
    assert any("metricTyp" in p for p in crd_problems(tag, typo))
    swapped = json.loads(json.dumps(SHIPPED["scaledobject.yaml"]))
    swapped["spec"]["minReplicaCount"], swapped["spec"]["maxReplicaCount"] = 9, 8
    assert bool(crd_problems(tag, swapped)) is (release(tag) >= (2, 20, 0))  # the CEL rule arrived in 2.20


@pytest.mark.parametrize("tag", ["v2.14.0", "v2.15.1", "v2.16.1"])
def test_with_average_value_written_a_cpu_trigger_still_fails_2_14_to_2_16(tag: str) -> None:
    typed = json.loads(json.dumps(OLD))
    typed["spec"]["triggers"][0]["metricType"] = "AverageValue"
    assert "not supported by the CPU & memory scalers" in (check_fallback_valid(tag, typed) or "")
    assert check_fallback_valid("v2.17.0", typed) is None and not webhook_refuses_fallback(tag)
