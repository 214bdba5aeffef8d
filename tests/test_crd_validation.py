"""The CRD's CEL rules (x-kubernetes-validations) agree with spec.py's own cross-field checks.

The rules are evaluated offline with a real CEL implementation (PyPI
``common-expression-language``), the way the API server does: ``self`` is the
object the rule sits on, after the schema's defaults are applied, with
``number`` fields as doubles. Every case goes through both the CEL rules and
``ScalerSpec.from_dict`` (the controller's validation, which is what servers
without CEL — older than 1.25 — rely on) and both must give the same verdict.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
import sys
import typing
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml

from predictive_scaler import crd, spec
from predictive_scaler.errors import ConfigError
from predictive_scaler.kube.manifests import KIND
from predictive_scaler.spec import Capacity, CapacitySlo, DemandSignal, ScalerSpec
from tests.deploy.support import OVERLAYS, render

SCHEMA = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def defaulted(schema: dict[str, Any], value: Any) -> Any:
    """``value`` as the API server hands it to CEL: schema defaults filled in, numbers typed."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if schema.get("type") == "array" and isinstance(value, list):
        return [defaulted(schema["items"], v) for v in value]
    if schema.get("type") == "object" and isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for key, child in schema["properties"].items():
            if key not in out and "default" in child:
                out[key] = copy.deepcopy(child["default"])
            if key in out:
                out[key] = defaulted(child, out[key])
        return out
    return value


def cel_verdicts(schema: dict[str, Any], value: Any, path: str = "spec") -> list[tuple[str, str, Any]]:
    """(path, message, result) of every rule that applies to ``value`` (already defaulted)."""
    found = []
    for rule in schema.get(crd.CEL_KEY, []):
        try:
            result = cel.evaluate(rule["rule"], {"self": value})
        except Exception as exc:  # noqa: BLE001 — an evaluation error is a rejection too; reported as such
            result = exc
        found.append((path, rule["message"], result))
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, child in schema.get("properties", {}).items():
            if key in value:
                found += cel_verdicts(child, value[key], f"{path}.{key}")
    if schema.get("type") == "array" and isinstance(value, list):
        for i, item in enumerate(value):
            found += cel_verdicts(schema["items"], item, f"{path}[{i}]")
    return found


def cel_rejections(data: dict[str, Any]) -> set[tuple[str, str]]:
    verdicts = cel_verdicts(SCHEMA, defaulted(SCHEMA, data))
    errors = [(p, m, r) for p, m, r in verdicts if not isinstance(r, bool)]
    assert not errors, f"rules that failed to evaluate (the API server would refuse the object): {errors}"
    return {(p, m) for p, m, r in verdicts if r is False}


REQUESTS: dict[str, Any] = {
    "target": {"name": "llm"},
    "demand": {"query": "sum(rate(requests_total[2m]))"},
    "capacity": {"requestsPerReplica": 5},
}
BUSY_GPUS: dict[str, Any] = {"target": {"name": "llm"}, "demand": {"kind": "dcgm-busy-gpus"}}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``base`` with dotted-path changes (``prewarm__budget={...}`` sets spec.prewarm.budget)."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return out


EVENT: dict[str, Any] = {"name": "launch", "start": "2025-11-28T09:00:00+01:00", "end": "2025-11-28T12:00:00Z",
                         "minReplicas": 6}


def _rule(section: type, index: int = 0) -> str:
    return section._cel[index].message  # type: ignore[attr-defined]


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_TERM = f"spec.prewarm.affinity.{_REQUIRED}.nodeSelectorTerms[0]"


def _affinity(*expressions: dict[str, Any], **prewarm: Any) -> dict[str, Any]:
    """A prewarm section whose affinity requires one term of ``expressions``."""
    return {**prewarm, "affinity": {_REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}}



_PREFERENCE = "spec.prewarm.affinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference"


def _preferred(*expressions: dict[str, Any]) -> dict[str, Any]:
    """A prewarm section whose affinity prefers (weight 10) one term of ``expressions``."""
    term = {"weight": 10, "preference": {"matchExpressions": list(expressions)}}
    return {"affinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}


# id, spec, (path of the rule, its message) or None for a valid spec, field spec.py names
CASES: list[tuple[str, dict[str, Any], tuple[str, str] | None, str | None]] = [
    ("valid-requests", REQUESTS, None, None),
    ("valid-busy-gpus-needs-no-query-or-capacity", BUSY_GPUS, None, None),
    ("valid-min-equals-max", with_(REQUESTS, minReplicas=4, maxReplicas=4), None, None),
    ("valid-scale-to-zero", with_(REQUESTS, minReplicas=0), None, None),
    ("valid-horizon-on-the-model-grid", with_(REQUESTS, model={"stepSeconds": 600}, horizonSeconds=3600), None, None),
    ("valid-big-replica-without-prewarm", with_(REQUESTS, gpusPerReplica=16), None, None),
    ("valid-prewarm-replica-fits-node", with_(REQUESTS, gpusPerReplica=8, prewarm={"enabled": True}), None, None),
    ("valid-scale-up-by-pods-only", with_(REQUESTS, reactive={"scaleUpPercent": 0}), None, None),
    ("valid-cost-budget-with-price",
     with_(REQUESTS, prewarm={"budget": {"maxCostPerHour": 10, "pricePerGpuHour": 2.5}}), None, None),
    ("valid-lead-times-equal", with_(REQUESTS, leadTimes={"podStartSeconds": 400}), None, None),
    ("min-above-max", with_(REQUESTS, minReplicas=5, maxReplicas=2),
     ("spec", _rule(ScalerSpec, 0)), "spec.minReplicas"),
    ("min-above-default-max", with_(REQUESTS, minReplicas=11),
     ("spec", _rule(ScalerSpec, 0)), "spec.minReplicas"),
    ("requests-without-capacity-section", with_(REQUESTS, capacity=None),
     ("spec", _rule(ScalerSpec, 1)), "spec.capacity.requestsPerReplica"),
    ("requests-with-empty-capacity", with_(REQUESTS, capacity={}),
     ("spec", _rule(ScalerSpec, 1)), "spec.capacity.requestsPerReplica"),
    ("prewarm-replica-bigger-than-node",
     with_(REQUESTS, gpusPerReplica=16, prewarm={"enabled": True, "gpusPerNode": 8}),
     ("spec", _rule(ScalerSpec, 2)), "spec.gpusPerReplica"),
    ("prewarm-replica-bigger-than-default-node", with_(REQUESTS, gpusPerReplica=9, prewarm={"enabled": True}),
     ("spec", _rule(ScalerSpec, 2)), "spec.gpusPerReplica"),
    ("horizon-off-the-default-grid", with_(REQUESTS, horizonSeconds=1000),
     ("spec", _rule(ScalerSpec, 3)), "spec.horizonSeconds"),
    ("horizon-off-the-model-grid", with_(REQUESTS, model={"stepSeconds": 600}, horizonSeconds=900),
     ("spec", _rule(ScalerSpec, 3)), "spec.horizonSeconds"),
    ("requests-without-query", with_(REQUESTS, demand={}),
     ("spec.demand", _rule(spec.DemandSignal)), "spec.demand.query"),
    ("cold-node-faster-than-warm", with_(REQUESTS, leadTimes={"podStartSeconds": 300, "nodeStartSeconds": 60}),
     ("spec.leadTimes", _rule(spec.LeadTimes)), "spec.leadTimes.nodeStartSeconds"),
    ("pod-start-above-default-node-start", with_(REQUESTS, leadTimes={"podStartSeconds": 500}),
     ("spec.leadTimes", _rule(spec.LeadTimes)), "spec.leadTimes.nodeStartSeconds"),
    ("no-way-to-scale-up", with_(REQUESTS, reactive={"scaleUpPercent": 0, "scaleUpPods": 0}),
     ("spec.reactive", _rule(spec.ReactiveBehavior)), "spec.reactive.scaleUpPods"),
    ("drift-min-window-above-default-window", with_(REQUESTS, drift={"minWindowPeriods": 40}),
     ("spec.drift", _rule(spec.DriftSettings)), "spec.drift.minWindowPeriods"),
    ("budget-cost-without-price", with_(REQUESTS, prewarm={"budget": {"maxCostPerHour": 10}}),
     ("spec.prewarm.budget", _rule(spec.Budget)), "spec.prewarm.budget.pricePerGpuHour"),
    # Scheduled events (spec.events) and mode keda.
    ("valid-event", with_(REQUESTS, events=[EVENT]), None, None),
    ("valid-weekly-multiplier-event",
     with_(REQUESTS, events=[{"name": "sale", "start": EVENT["start"], "end": EVENT["end"], "demandMultiplier": 2,
                              "recurrence": "weekly"}]),
     None, None),
    ("valid-keda-without-prewarm", with_(REQUESTS, mode="keda"), None, None),
    ("event-ends-before-it-starts", with_(REQUESTS, events=[{**EVENT, "end": "2025-11-28T08:30:00+01:00"}]),
     ("spec.events[0]", _rule(spec.ScheduledEvent, 0)), "spec.events[0].end"),
    ("event-with-floor-and-multiplier", with_(REQUESTS, events=[{**EVENT, "demandMultiplier": 2}]),
     ("spec.events[0]", _rule(spec.ScheduledEvent, 1)), "spec.events[0].minReplicas"),
    ("event-with-neither", with_(REQUESTS, events=[{k: v for k, v in EVENT.items() if k != "minReplicas"}]),
     ("spec.events[0]", _rule(spec.ScheduledEvent, 1)), "spec.events[0].minReplicas"),
    ("weekly-event-longer-than-a-week",
     with_(REQUESTS, events=[{**EVENT, "end": "2025-12-06T09:00:00+01:00", "recurrence": "weekly"}]),
     ("spec.events[0]", _rule(spec.ScheduledEvent, 2)), "spec.events[0].end"),
    ("event-floor-above-max", with_(REQUESTS, events=[{**EVENT, "minReplicas": 11}]),
     ("spec", _rule(ScalerSpec, 4)), "spec.events[0].minReplicas"),
    ("keda-with-placeholders", with_(REQUESTS, mode="keda", prewarm={"enabled": True}),
     ("spec", _rule(ScalerSpec, 5)), "spec.prewarm.enabled"),
    # Placeholder node affinity and the Karpenter NodePool (spec.prewarm.affinity, nodePool).
    ("valid-affinity-and-node-pool", with_(REQUESTS, prewarm=_affinity(
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}, nodePool="gpu")), None, None),
    ("valid-affinity-exists-and-gt", with_(REQUESTS, prewarm=_affinity(
        {"key": "gpu", "operator": "Exists"}, {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt",
                                              "values": ["3"]})), None, None),
    ("affinity-in-without-values", with_(REQUESTS, prewarm=_affinity({"key": "gpu", "operator": "In"})),
     (_TERM + ".matchExpressions[0]", _rule(spec.NodeSelectorRequirement, 0)), _TERM + ".matchExpressions[0].values"),
    ("affinity-gt-not-an-integer", with_(REQUESTS, prewarm=_affinity({"key": "gpu", "operator": "Gt", "values": ["x"]})),
     (_TERM + ".matchExpressions[0]", _rule(spec.NodeSelectorRequirement, 1)), _TERM + ".matchExpressions[0].values"),
    ("affinity-term-without-expressions", with_(REQUESTS, prewarm=_affinity()),
     (_TERM, _rule(spec.NodeSelectorTerm)), _TERM + ".matchExpressions"),
    ("affinity-without-terms", with_(REQUESTS, prewarm={"affinity": {_REQUIRED: {"nodeSelectorTerms": []}}}),
     ("spec.prewarm.affinity." + _REQUIRED, _rule(spec.NodeSelector)),
     "spec.prewarm.affinity." + _REQUIRED + ".nodeSelectorTerms"),
    ("preferred-term-without-expressions", with_(REQUESTS, prewarm=_preferred()),
     (_PREFERENCE, _rule(spec.NodeSelectorTerm)), _PREFERENCE + ".matchExpressions"),
    ("preferred-not-in-without-values", with_(REQUESTS, prewarm=_preferred({"key": "gpu", "operator": "NotIn"})),
     (_PREFERENCE + ".matchExpressions[0]", _rule(spec.NodeSelectorRequirement, 0)),
     _PREFERENCE + ".matchExpressions[0].values"),
    ("preferred-lt-two-values", with_(REQUESTS, prewarm=_preferred({"key": "gpu", "operator": "Lt", "values": ["1", "2"]})),
     (_PREFERENCE + ".matchExpressions[0]", _rule(spec.NodeSelectorRequirement, 1)),
     _PREFERENCE + ".matchExpressions[0].values"),
    ("node-pool-in-both-places", with_(REQUESTS, prewarm=_affinity(
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]}, nodePool="gpu")),
     ("spec.prewarm", _rule(spec.Prewarm)), "spec.prewarm.nodePool"),
    ("valid-tokens-preset-learning", {"target": {"name": "llm"}, "demand": {"kind": "tokens", "preset": "vllm"},
                                      "capacity": {"requestsPerReplica": 5000, "learned": "serve",
                                                   "slo": {"noWaiting": True}}}, None, None),
    ("triton-has-no-tokens", {"target": {"name": "llm"}, "demand": {"kind": "tokens", "preset": "triton"},
                              "capacity": {"requestsPerReplica": 5}},
     ("spec.demand", _rule(DemandSignal, 1)), "spec.demand.preset"),
    ("slo-both-or-neither", with_(REQUESTS, demand={"preset": "vllm"},
                                  capacity={"requestsPerReplica": 5, "slo": {}}),
     ("spec.capacity.slo", _rule(CapacitySlo)), "spec.capacity.slo.latencyP95Ms"),
    ("serve-without-slo", with_(REQUESTS, capacity={"requestsPerReplica": 5, "learned": "serve"}),
     ("spec.capacity", _rule(Capacity)), "spec.capacity.learned"),
    ("slo-without-serving-queries", with_(REQUESTS, capacity={"requestsPerReplica": 5, "slo": {"noWaiting": True}}),
     ("spec", _rule(ScalerSpec, len(ScalerSpec._cel) - 1)), "spec.capacity.slo"),
]


@pytest.mark.parametrize(("data", "rejected_by", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cel_rules_and_the_controller_give_the_same_verdict(data, rejected_by, field):
    assert cel_rejections(data) == ({rejected_by} if rejected_by else set())
    if field is None:
        ScalerSpec.from_dict(data)
    else:
        with pytest.raises(ConfigError) as info:
            ScalerSpec.from_dict(data)
        assert info.value.field == field


def test_every_rule_has_a_case_that_breaks_it():
    rules = {(path, r["message"]) for path, r in _rules_by_path(SCHEMA, "spec")}
    broken = {(re.sub(r"\[\d+\]", "[]", c[2][0]), c[2][1]) for c in CASES if c[2] is not None}
    assert rules == broken, f"rules no case breaks: {rules - broken}"


def _rules_by_path(schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, str]]]:
    out = [(path, r) for r in schema.get(crd.CEL_KEY, [])]
    for key, child in schema.get("properties", {}).items():
        out += _rules_by_path(child, f"{path}.{key}")
    if "items" in schema:
        out += _rules_by_path(schema["items"], f"{path}[]")
    return out


def _sections(cls: type = ScalerSpec) -> set[type]:
    """ScalerSpec and every section under it (also the items of lists of sections)."""
    found = {cls}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp, _ = spec._unwrap_optional(spec._hints(cls)[f.name])
        for candidate in (tp, *typing.get_args(tp)):
            if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
                found |= _sections(candidate)
    return found


def test_every_cross_field_check_has_cel_rules():
    # A section with its own _check (cross-field rules) needs their CEL copy in _cel,
    # so the API server refuses what the controller would refuse.
    missing = sorted(c.__name__ for c in _sections()
                     if "_check" in vars(c) and not vars(c).get("_cel"))
    assert not missing, f"sections with a _check but no _cel rules: {missing}; add CelRule(...)s beside _check"


def test_cel_rules_reject_min_above_max_with_a_clear_message():
    (path, message), = cel_rejections(with_(REQUESTS, minReplicas=9, maxReplicas=3))
    assert path == "spec" and "minReplicas" in message and "maxReplicas" in message


@pytest.mark.parametrize("cel_on", [True, False], ids=["with-cel", "without-cel"])
def test_both_crd_variants_validate_strictly(cel_on):
    built = crd.build_crd(cel=cel_on)
    kubernetes_validate.validate(built, kubernetes_validate.utils.latest_version(), strict=True)
    assert (crd.CEL_KEY in yaml.safe_dump(built)) is cel_on


def test_crd_without_cel_differs_only_by_the_rules():
    assert crd.build_crd(cel=False) == crd.without_cel(crd.build_crd())
    assert crd.build_crd(cel=False) != crd.build_crd()


def test_module_prints_the_crd_without_cel_for_old_servers():
    done = subprocess.run([sys.executable, "-m", "predictive_scaler.crd", "--no-cel"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert yaml.safe_load(done.stdout) == crd.build_crd(cel=False)


@pytest.mark.kubectl
def test_the_shipped_example_passes_the_cel_rules():
    scalers = [o for o in render(OVERLAYS["example-vllm-forecast-only"]) if o["kind"] == KIND]
    assert scalers
    for obj in scalers:
        assert cel_rejections(obj["spec"]) == set(), obj["metadata"]["name"]
        ScalerSpec.from_dict(obj["spec"])
