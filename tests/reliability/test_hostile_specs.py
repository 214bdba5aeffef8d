"""Hostile PredictiveScaler specs: every numeric field zero, negative, huge or of the wrong type,
unknown fields anywhere (with "did you mean"), through `backtest --scaler FILE.yaml` — and the
placeholder PriorityClass, read from the cluster by the controller, which must exist and be negative
(else the scaler is refused, nothing is scaled and no placeholder is left).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from pytest_httpserver import HTTPServer

from predictive_scaler.clock import FakeClock
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.series import Series
from tests.reliability.harness import World
from tests.reliability.hostile import BOMB, Case, check, ids
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics
from tests.support.specs import scaler_spec

BACKTEST = "backtest --trace {d}/good.csv --scaler {d}/scaler.yaml --no-progress --report {d}/report"
BASE: dict[str, Any] = {
    "target": {"name": "web"},
    "demand": {"kind": "requests", "query": "sum(rate(requests_total[2m]))"},
    "capacity": {"requestsPerReplica": 10},
}


def manifest(**spec: Any) -> str:
    doc = {"apiVersion": "autoscaling.predictive-scaler.io/v1alpha1", "kind": "PredictiveScaler",
           "metadata": {"name": "web", "namespace": "ml"}, "spec": _merge(BASE, spec)}
    return yaml.safe_dump(doc)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def spec(id: str, *says: str, **fields: Any) -> Case:
    return Case(id, BACKTEST, 2, ("ml/web has an invalid spec", *says, "fix the manifest"),
                {"scaler.yaml": manifest(**fields)})


CASES: list[Case] = [
    spec("min-replicas-negative", "spec.minReplicas", "at least 0", minReplicas=-1),
    spec("min-replicas-text", "spec.minReplicas", "must be", minReplicas="one"),
    spec("max-replicas-zero", "spec.maxReplicas", maxReplicas=0),
    spec("max-replicas-huge", "spec.maxReplicas", "at most 100000", maxReplicas=10**12),
    spec("max-replicas-fraction", "spec.maxReplicas", maxReplicas=2.5),
    spec("min-above-max", "spec.minReplicas", "greater than maxReplicas", minReplicas=5, maxReplicas=2),
    spec("capacity-zero", "spec.capacity.requestsPerReplica", "greater than 0", capacity={"requestsPerReplica": 0}),
    spec("capacity-negative", "spec.capacity.requestsPerReplica", capacity={"requestsPerReplica": -3}),
    spec("capacity-text", "spec.capacity.requestsPerReplica", "must be a number",
         capacity={"requestsPerReplica": "lots"}),
    spec("capacity-bool", "spec.capacity.requestsPerReplica", capacity={"requestsPerReplica": True}),
    spec("quantile-one", "spec.quantile", "less than 1", quantile=1),
    spec("quantile-zero", "spec.quantile", quantile=0),
    spec("horizon-zero", "spec.horizonSeconds", "at least 300", horizonSeconds=0),
    spec("horizon-huge", "spec.horizonSeconds", horizonSeconds=10**9),
    spec("control-period-zero", "spec.controlPeriodSeconds", controlPeriodSeconds=0),
    spec("gpus-per-replica-zero", "spec.gpusPerReplica", gpusPerReplica=0),
    spec("gpus-per-node-huge", "spec.prewarm.gpusPerNode", prewarm={"gpusPerNode": 1000}),
    spec("budget-negative", "spec.prewarm.budget.maxGpus", "at least 0", prewarm={"budget": {"maxGpus": -1}}),
    spec("budget-text", "spec.prewarm.budget.maxCostPerHour", "must be a number", "'lots'",
         prewarm={"budget": {"maxCostPerHour": "lots", "pricePerGpuHour": 2}}),
    spec("cost-without-price", "spec.prewarm.budget.pricePerGpuHour", "is required when maxCostPerHour is set",
         prewarm={"budget": {"maxCostPerHour": 10}}),
    spec("lead-time-negative", "spec.leadTimes.podStartSeconds", leadTimes={"podStartSeconds": -5}),
    spec("unknown-top-field", "spec.maxReplica: unknown field", "did you mean 'maxReplicas'", maxReplica=3),
    spec("unknown-nested-field", "spec.prewarm.budget.maxGpu: unknown field", "did you mean 'maxGpus'",
         prewarm={"budget": {"maxGpu": 3}}),
    spec("unknown-demand-field", "spec.demand.qurey: unknown field", "did you mean 'query'", demand={"qurey": "x"}),
    spec("unknown-mode", "spec.mode", "'forecast-only', 'scale'", mode="autopilot"),
    spec("spec-not-a-mapping", "must be an object", target="web"),
    Case("scaler-file-not-yaml", BACKTEST, 2, ("scaler.yaml is not valid YAML", "fix the file"),
         {"scaler.yaml": "kind: [PredictiveScaler\n"}),
    Case("scaler-file-alias-bomb", BACKTEST, 2, ("scaler.yaml", "YAML aliases expand to", "without anchors"),
         {"scaler.yaml": BOMB}),
    Case("scaler-file-binary", BACKTEST, 2, ("not UTF-8 text", "YAML file of PredictiveScaler manifests"),
         {"scaler.yaml": b"\xff\xfe\x00garbage"}),
    Case("scaler-file-no-scalers", BACKTEST, 2, ("holds no PredictiveScaler manifests",),
         {"scaler.yaml": "kind: ConfigMap\nmetadata: {name: x}\n"}),
    Case("scaler-without-name", BACKTEST, 2, ("has no metadata.name", "add one"),
         {"scaler.yaml": "kind: PredictiveScaler\nspec: {}\n"}),
    Case("scaler-name-not-in-file", BACKTEST + " --name other", 2, ("holds no PredictiveScaler named 'other'",
                                                                     "it holds ml/web"), {"scaler.yaml": manifest()}),
    Case("scaler-name-misspelt", BACKTEST + " --name wbe", 2, ("named 'wbe'", "did you mean 'web'"),
         {"scaler.yaml": manifest()}),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_spec(case: Case, work: Path) -> None:
    check(case, work)
    assert not (work / "report").exists()


# -- the placeholder PriorityClass, read from the cluster --------------------------------------------

MODEL = "llm"
START = datetime(2026, 3, 2, 9, 1, tzinfo=UTC)
SCALER: dict[str, Any] = scaler_spec(model=MODEL, gpus_per_node=4)


@pytest.fixture
def model_store(tmp_path: Path) -> ModelStore:
    store = ModelStore(tmp_path / "models", clock=FakeClock(START))
    n = 3 * 288
    values = 400 + 200 * np.sin(2 * np.pi * np.arange(n) / 288)
    history = Series(values=values, start=pd.Timestamp(START) - pd.Timedelta(days=3), step_seconds=300, name=MODEL)
    store.publish(MODEL, PersistenceForecaster().fit(history), series=MODEL, window=TrainingWindow.of(history))
    return store


@pytest.fixture
def api(httpserver: HTTPServer) -> Iterator[FakeApiServer]:
    with FakeApiServer(httpserver) as server:
        yield server


def world(api: FakeApiServer, store: ModelStore, **prewarm: Any) -> World:
    spec = {**SCALER, "prewarm": {**SCALER["prewarm"], **prewarm}}
    return World(api, store, "http://127.0.0.1:9", START, spec, metrics=FakeMetrics(lambda t: 900.0))


def refusal(w: World) -> str:
    period = w.periods[-1]
    assert period.outcome == "refused", period
    messages = " ".join(str(c.get("message", "")) for c in period.status.get("conditions", ()))
    assert period.placeholder_replicas is None, "a refused scaler leaves no placeholder"
    assert period.scale_replicas == period.replicas_before, "a refused scaler scales nothing"
    return messages


@pytest.mark.parametrize("name, value, says", [
    ("system-node-critical", 2000001000, ["has value 2000001000, not a negative one", "would preempt real pods",
                                          "predictive-scaler-placeholder"]),
    ("zero-priority", 0, ["has value 0, not a negative one"]),
    ("one", 1, ["has value 1"]),
], ids=["system-node-critical", "zero", "positive-one"])
def test_placeholder_class_that_is_not_negative_is_refused(api: FakeApiServer, model_store: ModelStore, name: str,
                                                           value: int, says: list[str]) -> None:
    api.add_priority_class(name, value)
    w = world(api, model_store, priorityClassName=name)
    w.run(1)
    messages = refusal(w)
    for fragment in ["spec.prewarm.priorityClassName", f"PriorityClass {name!r}", *says]:
        assert fragment in messages, messages
    assert not [r for r in api.requests if r.method in ("POST", "PUT") and "/deployments" in r.path]


def test_placeholder_class_missing_is_refused(api: FakeApiServer, model_store: ModelStore) -> None:
    w = world(api, model_store, priorityClassName="no-such-class")
    w.run(1)
    messages = refusal(w)
    assert "PriorityClass 'no-such-class' does not exist" in messages and "deploy/base/priorityclass.yaml" in messages


def test_placeholder_class_forbidden_says_which_rbac(api: FakeApiServer, model_store: ModelStore) -> None:
    api.fail_next(r"/priorityclasses/", 403, times=5)
    w = world(api, model_store)
    w.run(1)
    messages = refusal(w)
    assert "403 Forbidden" in messages and "get on priorityclasses" in messages


def test_a_placeholder_held_under_a_class_turned_positive_is_removed(api: FakeApiServer,
                                                                     model_store: ModelStore) -> None:
    api.add_priority_class("flipped", -5)
    w = world(api, model_store, priorityClassName="flipped")
    w.run(1)
    assert w.periods[-1].outcome == "ok"
    api.add_priority_class("flipped", 100)
    w.service.kube._priorities.clear()  # the controller re-reads the class within minutes
    w.run(1)
    refusal(w)
    assert w.placeholder() is None


def test_negative_class_is_used_and_read_once_per_ttl(api: FakeApiServer, model_store: ModelStore) -> None:
    api.add_priority_class("custom-low", -100)
    w = world(api, model_store, priorityClassName="custom-low")
    w.run(3)
    assert [p.outcome for p in w.periods] == ["ok"] * 3
    reads = [r for r in api.requests if "/priorityclasses/" in r.path]
    assert len(reads) == 1, "the class is cached, not read every period"


def test_forecast_only_never_needs_the_class(api: FakeApiServer, model_store: ModelStore) -> None:
    spec = {**SCALER, "mode": "forecast-only", "prewarm": {**SCALER["prewarm"], "priorityClassName": "missing"}}
    w = World(api, model_store, "http://127.0.0.1:9", START, spec, metrics=FakeMetrics(lambda t: 900.0))
    w.run(1)
    assert w.periods[-1].outcome == "ok"
    assert not [r for r in api.requests if "/priorityclasses/" in r.path]


def test_the_rbac_grants_get_on_priorityclasses() -> None:
    rbac = Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac-controller.yaml"
    rules = next(yaml.safe_load_all(rbac.read_text()))["rules"]
    assert any("priorityclasses" in r["resources"] and r["verbs"] == ["get"] for r in rules)
    assert os.path.exists(rbac.parent / "priorityclass.yaml")
