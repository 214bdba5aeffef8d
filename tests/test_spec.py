"""The spec: defaults, eager validation naming the field, round trip, generated schema."""

from __future__ import annotations

import copy
import math
from typing import Any

import jsonschema
import pytest

from predictive_scaler.errors import BudgetError, ConfigError
from predictive_scaler.spec import ScalerSpec, spec_json_schema

MINIMAL: dict[str, Any] = {
    "target": {"name": "llm"},
    "demand": {"query": "sum(rate(requests_total[2m]))"},
    "capacity": {"requestsPerReplica": 5},
}

FULL: dict[str, Any] = {
    "target": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llm"},
    "demand": {"kind": "dcgm-busy-gpus", "utilizationQuery": "avg(DCGM_FI_DEV_GPU_UTIL)", "maxAgeSeconds": 120},
    "capacity": {"gpuUtilizationTarget": 0.75},
    "gpusPerReplica": 2,
    "minReplicas": 0,
    "maxReplicas": 40,
    "quantile": 0.9,
    "horizonSeconds": 3600,
    "controlPeriodSeconds": 30,
    "missingDataPeriods": 5,
    "leadTimes": {"podStartSeconds": 120, "nodeStartSeconds": 420},
    "reactive": {"tolerance": 0.05, "scaleDownStabilizationSeconds": 600, "scaleUpPods": 2},
    "drift": {"fastPeriods": 4, "recoverySeconds": 1200},
    "prewarm": {
        "enabled": True, "gpusPerNode": 8, "priorityClassName": "balloon", "image": "registry/llm:1.2",
        "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                          "effect": "NoSchedule"}],
        "budget": {"maxGpus": 16, "maxCostPerHour": 40.0, "pricePerGpuHour": 2.5, "currency": "EUR"},
    },
    "model": {"name": "llm-requests", "version": "v3"},
    "mode": "scale",
}


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(base)
    keys = path.split(".")
    node = d
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return d


def test_defaults_are_the_documented_ones() -> None:
    s = ScalerSpec.from_dict(MINIMAL)
    assert (s.quantile, s.horizon_seconds, s.control_period_seconds) == (0.95, 1800, 60)
    assert (s.reactive.tolerance, s.reactive.scale_down_stabilization_seconds) == (0.1, 300)
    assert (s.reactive.scale_up_percent, s.reactive.scale_up_pods, s.reactive.scale_up_period_seconds) == (100, 4, 15)
    assert s.lead_times.pod_start_seconds == 90 and 360 <= s.lead_times.node_start_seconds <= 420
    assert s.capacity.gpu_utilization_target == 0.7
    assert s.mode == "forecast-only" and not s.prewarm.enabled
    assert s.capacity_per_replica == 5.0


@pytest.mark.parametrize("data", [MINIMAL, FULL], ids=["minimal", "full"])
def test_round_trip(data: dict[str, Any]) -> None:
    s = ScalerSpec.from_dict(data)
    assert ScalerSpec.from_dict(s.to_dict()) == s
    assert s.to_dict() == ScalerSpec.from_dict(s.to_dict()).to_dict()


def test_busy_gpu_capacity_is_target_times_gpus() -> None:
    s = ScalerSpec.from_dict(FULL)
    assert s.capacity_per_replica == pytest.approx(0.75 * 2)


BAD = [
    ("min-above-max", with_(MINIMAL, "minReplicas", 5) | {"maxReplicas": 2}, ConfigError, "spec.minReplicas"),
    ("negative-max", with_(MINIMAL, "maxReplicas", -1), ConfigError, "spec.maxReplicas"),
    ("quantile-one", with_(MINIMAL, "quantile", 1.0), ConfigError, "spec.quantile"),
    ("quantile-zero", with_(MINIMAL, "quantile", 0.0), ConfigError, "spec.quantile"),
    ("quantile-nan", with_(MINIMAL, "quantile", math.nan), ConfigError, "spec.quantile"),
    ("horizon-zero", with_(MINIMAL, "horizonSeconds", 0), ConfigError, "spec.horizonSeconds"),
    ("horizon-off-grid", with_(MINIMAL, "horizonSeconds", 1000), ConfigError, "spec.horizonSeconds"),
    ("horizon-text", with_(MINIMAL, "horizonSeconds", "30m"), ConfigError, "spec.horizonSeconds"),
    ("unknown-kind", with_(MINIMAL, "demand.kind", "cpu"), ConfigError, "spec.demand.kind"),
    ("unknown-field", with_(MINIMAL, "maxReplica", 3), ConfigError, "spec.maxReplica"),
    ("no-target", {k: v for k, v in MINIMAL.items() if k != "target"}, ConfigError, "spec.target"),
    ("empty-name", with_(MINIMAL, "target.name", ""), ConfigError, "spec.target.name"),
    ("requests-without-query", with_(MINIMAL, "demand", {}), ConfigError, "spec.demand.query"),
    ("requests-without-capacity", with_(MINIMAL, "capacity", {}), ConfigError, "spec.capacity.requestsPerReplica"),
    ("util-outside-band", with_(FULL, "capacity.gpuUtilizationTarget", 0.95), ConfigError,
     "spec.capacity.gpuUtilizationTarget"),
    ("cold-faster-than-warm", with_(MINIMAL, "leadTimes", {"podStartSeconds": 300, "nodeStartSeconds": 60}),
     ConfigError, "spec.leadTimes.nodeStartSeconds"),
    ("replica-bigger-than-node", with_(FULL, "gpusPerReplica", 16), ConfigError, "spec.gpusPerReplica"),
    ("budget-negative", with_(MINIMAL, "prewarm.budget", {"maxGpus": -1}), BudgetError, "spec.prewarm.budget.maxGpus"),
    ("budget-nan-cost", with_(MINIMAL, "prewarm.budget", {"maxCostPerHour": math.nan, "pricePerGpuHour": 1}),
     BudgetError, "spec.prewarm.budget.maxCostPerHour"),
    ("budget-text", with_(MINIMAL, "prewarm.budget", {"maxGpus": "eight"}), BudgetError, "spec.prewarm.budget.maxGpus"),
    ("budget-inf-price", with_(MINIMAL, "prewarm.budget", {"pricePerGpuHour": math.inf}), BudgetError,
     "spec.prewarm.budget.pricePerGpuHour"),
    ("budget-cost-without-price", with_(MINIMAL, "prewarm.budget", {"maxCostPerHour": 10}), BudgetError,
     "spec.prewarm.budget.pricePerGpuHour"),
    ("budget-not-object", with_(MINIMAL, "prewarm.budget", 5), BudgetError, "spec.prewarm.budget"),
    ("bad-mode", with_(MINIMAL, "mode", "yolo"), ConfigError, "spec.mode"),
    ("bool-as-int", with_(MINIMAL, "maxReplicas", True), ConfigError, "spec.maxReplicas"),
]


@pytest.mark.parametrize(("data", "error", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_settings_name_the_field_and_what_to_do(data: dict[str, Any], error: type, field: str) -> None:
    with pytest.raises(error) as info:
        ScalerSpec.from_dict(data)
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(field)
    assert len(message) > len(field) + 15  # says what is wrong, and what to do


def test_schema_is_structural_and_agrees_with_validation() -> None:
    schema = spec_json_schema()

    def walk(node: dict[str, Any], path: str) -> None:
        assert "type" in node, path  # structural: every node typed
        if node["type"] == "object" and "properties" in node:
            assert "additionalProperties" not in node, path
            for key, child in node["properties"].items():
                assert child.get("description"), f"{path}.{key} has no description"
                walk(child, f"{path}.{key}")
        if node["type"] == "array":
            walk(node["items"], path + "[]")

    walk(schema, "spec")
    assert schema["required"] == ["target", "demand"]
    assert schema["properties"]["mode"]["enum"] == ["forecast-only", "scale", "keda"]
    assert schema["properties"]["maxReplicas"]["default"] == 10
    # The schema accepts every valid spec, and rejects the invalid values it can express.
    validator = jsonschema.Draft4Validator(schema)  # OpenAPI v3.0 uses draft-4 style exclusive bounds
    for good in (MINIMAL, FULL, ScalerSpec.from_dict(FULL).to_dict()):
        validator.validate(good)
    for name, data, *_ in BAD:
        if name in ("min-above-max", "requests-without-query", "requests-without-capacity",
                    "cold-faster-than-warm", "replica-bigger-than-node", "budget-cost-without-price",
                    "horizon-off-grid", "unknown-field", "quantile-nan", "budget-nan-cost",
                    "budget-inf-price"):
            continue  # cross-field rules, pruned unknown fields and NaN (not JSON) are for from_dict
        assert not validator.is_valid(data), name


# -- numeric bounds ---------------------------------------------------------------------------------

def _numeric_fields(cls: type = ScalerSpec, path: str = "spec") -> list[tuple[str, Any]]:
    import dataclasses
    import typing

    from predictive_scaler import spec

    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp, _ = spec._unwrap_optional(spec._hints(cls)[f.name])
        key = f"{path}.{spec.camel(f.name)}"
        if tp in (int, float):
            out.append((key, f))
        for inner in (tp, *typing.get_args(tp)):
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                out += _numeric_fields(inner, key)
    return out


def test_every_number_has_both_bounds() -> None:
    # Without an upper bound, what is computed from a number (replicas × GPUs × price) can overflow.
    unbounded = [key for key, f in _numeric_fields()
                 if f.metadata.get("minimum") is None or f.metadata.get("maximum") is None]
    assert not unbounded, unbounded


EXTREMES = [
    ("capacity-denormal", "capacity.requestsPerReplica", 5e-324, "must be at least 1e-06, got 4.94066e-324"),
    ("capacity-negative-zero", "capacity.requestsPerReplica", -0.0, "greater than 0 (at least 1e-06), got 0;"),
    ("capacity-huge", "capacity.requestsPerReplica", 1e308, "at most 1000000000"),
    ("capacity-huge-int", "capacity.requestsPerReplica", 10**400, "must be a finite number, got a 401-digit number"),
    ("replicas-4000-digits", "maxReplicas", 10**4000 - 1, "at most 100000, got a 4,000-digit number"),
    ("budget-1e300-gpus", "prewarm.budget.maxGpus", 1e300, "at most 6400000, got 1e+300"),
    ("price-1e308", "prewarm.budget.pricePerGpuHour", 1e308, "at most 10000000"),
]


@pytest.mark.parametrize(("path", "value", "says"), [e[1:] for e in EXTREMES], ids=[e[0] for e in EXTREMES])
def test_numeric_extremes_are_refused_by_the_bounds(path: str, value: Any, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        ScalerSpec.from_dict(with_(MINIMAL, path, value))
    assert info.value.field == f"spec.{path}"
    assert says in str(info.value)


def test_negative_zero_is_zero() -> None:
    s = ScalerSpec.from_dict(with_(MINIMAL, "reactive.tolerance", -0.0))
    assert math.copysign(1.0, s.reactive.tolerance) == 1.0


def test_the_schema_carries_the_bounds() -> None:
    from predictive_scaler import spec

    props = spec_json_schema()["properties"]
    assert props["maxReplicas"]["maximum"] == spec.MAX_REPLICAS
    assert props["capacity"]["properties"]["requestsPerReplica"]["minimum"] == spec.MIN_REQUESTS_PER_REPLICA
    budget = props["prewarm"]["properties"]["budget"]["properties"]
    assert (budget["maxGpus"]["maximum"], budget["pricePerGpuHour"]["maximum"]) == (
        spec.MAX_GPUS, spec.MAX_PRICE_PER_GPU_HOUR)


def test_a_lead_time_beyond_the_horizon_is_said_not_refused() -> None:
    s = ScalerSpec.from_dict(MINIMAL | {"horizonSeconds": 300, "leadTimes": {"nodeStartSeconds": 7200},
                                        "prewarm": {"enabled": True}})
    (note,) = s.advisories()
    assert "nodeStartSeconds (7200) is longer than spec.horizonSeconds (300)" in note
    assert not ScalerSpec.from_dict(MINIMAL).advisories()
    # Without prewarming the node lead time orders nothing ahead: nothing to say.
    assert not ScalerSpec.from_dict(MINIMAL | {"horizonSeconds": 300, "leadTimes": {"nodeStartSeconds": 7200}}
                                    ).advisories()
