"""Decisions as data: typed reasons and limits, Events and Conditions derived from the kinds, not the text."""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy import explain
from predictive_scaler.policy import reasons as why
from predictive_scaler.policy.planner import ClusterState, Decision, plan
from predictive_scaler.policy.reasons import Kind, Limit, Reason
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import Budget, ScalerSpec

NOW = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)
STEP = 300
DOCS = Path(__file__).resolve().parents[2] / "docs" / "planner.md"


def _spec(**over: Any) -> ScalerSpec:
    doc: dict[str, Any] = {
        "target": {"name": "llm"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": 10.0},
        "minReplicas": 1, "maxReplicas": 20,
        "leadTimes": {"podStartSeconds": 70, "nodeStartSeconds": 420},
        "prewarm": {"enabled": True, "gpusPerNode": 4, "budget": {"maxGpus": 8}},
    }
    doc.update(over)
    return ScalerSpec.from_dict(doc)


def _with_budget(spec: ScalerSpec, **fields: Any) -> ScalerSpec:
    """A budget the spec parser refuses (the planner must still fail closed on it)."""
    budget = Budget()
    for name, value in fields.items():
        object.__setattr__(budget, name, value)
    return dataclasses.replace(spec, prewarm=dataclasses.replace(spec.prewarm, budget=budget))


def _forecast(level: float) -> Forecast:
    issued = pd.Timestamp(math.floor(NOW.timestamp() / STEP) * STEP - STEP, unit="s", tz="UTC")
    return Forecast(issued, STEP, (0.5, 0.95), np.array([[level] * 6, [level * 1.1] * 6]), "test")


def _decide(spec: ScalerSpec, *, demand: float | None = 100.0, forecast: float | None = 100.0,
            replicas: int = 10, state: PlannerState | None = None) -> Decision:
    sample = None if demand is None else DemandSample(demand, NOW)
    f = None if forecast is None else _forecast(forecast)
    d, _ = plan(spec, f, sample, ClusterState(replicas, replicas), state or PlannerState(), NOW)
    return d


# Decisions that hit each limit (and a few that hit none); the ids say which.
CASES = [
    ("steady", _spec(), {}, ()),
    ("forecast-above-max", _spec(maxReplicas=12), {"forecast": 400.0}, (Limit.MAX_REPLICAS,)),
    ("reactive-min-clamp", _spec(minReplicas=5), {"forecast": None, "demand": 0.0, "replicas": 5},
     (Limit.MIN_REPLICAS,)),
    ("scale-up-rate", _spec(), {"forecast": None, "demand": 900.0, "replicas": 2}, (Limit.SCALE_UP_RATE,)),
    ("budget-cut", _spec(prewarm={"enabled": True, "gpusPerNode": 4, "budget": {"maxGpus": 1}}),
     {"forecast": 300.0}, (Limit.BUDGET,)),
    ("budget-empty", _spec(prewarm={"enabled": True, "gpusPerNode": 4}), {"forecast": 300.0},
     (Limit.BUDGET_EMPTY,)),
    ("budget-invalid", _with_budget(_spec(), max_gpus=-1), {"forecast": 300.0},
     (Limit.BUDGET_INVALID,)),
    ("missing-data-above-max", _spec(maxReplicas=8), {"demand": None, "replicas": 10},
     (Limit.MISSING_DATA, Limit.MAX_REPLICAS)),
]


@pytest.mark.parametrize(("spec", "inputs", "limits"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_limits_are_typed_and_the_scaling_event_and_condition_agree(
        spec: ScalerSpec, inputs: dict[str, Any], limits: tuple[Limit, ...]) -> None:
    d = _decide(spec, **inputs)
    assert set(limits) <= set(d.limits), d.limits
    assert all(isinstance(x, Limit) for x in d.limits) and all(isinstance(r, Reason) for r in d.reasons)
    events = {e.reason: e for e in explain.events(d, "", ClusterState(10, 10), spec)}
    conds = {c.type: c for c in explain.conditions(d, True, "scale")}
    scaling = conds["ScalingLimited"]
    assert (scaling.status == "True") == bool(set(d.limits) & why.SCALING_LIMITS)
    assert ("ScalingLimited" in events) == (scaling.status == "True")
    if "ScalingLimited" in events:
        assert events["ScalingLimited"].message == scaling.message
    budget = conds["BudgetLimited"]
    if "BudgetLimited" in events:
        assert budget.status == "True" and events["BudgetLimited"].message == budget.message
    assert ("BudgetInvalid" in events) == (Limit.BUDGET_INVALID in d.limits)
    expected = next((name for limit, name in ((Limit.BUDGET_INVALID, "BudgetInvalid"),
                                              (Limit.BUDGET_EMPTY, "BudgetEmpty"), (Limit.BUDGET, "BudgetReached"))
                     if limit in d.limits), "WithinBudget")
    assert budget.reason == expected


def test_every_limit_has_a_reason_of_its_kind() -> None:
    """Each scaling limit comes with the reason that reports it (so the Condition can say why)."""
    for _, spec, inputs, _ in CASES:
        d = _decide(spec, **inputs)
        reported = {r.limit for r in explain.scaling_reasons(d)}  # type: ignore[attr-defined]
        assert set(d.limits) & why.SCALING_LIMITS <= reported, (d.limits, d.sentences)


def test_classification_does_not_read_the_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewording every sentence changes no Event type, no Condition status and no Condition reason."""
    spec = _spec(maxReplicas=12, prewarm={"enabled": True, "gpusPerNode": 4, "budget": {"maxGpus": 1}})
    d = _decide(spec, forecast=400.0)

    def shape(d: Decision) -> tuple[Any, ...]:
        return (tuple(e.reason for e in explain.events(d, "", ClusterState(10, 10), spec)),
                tuple((c.type, c.status, c.reason) for c in explain.conditions(d, True, "scale")))

    before = shape(d)
    for cls in [c for c in vars(why).values() if isinstance(c, type) and issubclass(c, Reason) and c is not Reason]:
        monkeypatch.setattr(cls, "text", lambda self: "reworded")
    assert shape(d) == before
    assert "ScalingLimited" in before[0] and "BudgetLimited" in before[0]


RENDERED = [
    (why.Clamped("max", 12, 45, "forecast"), "clamped to maxReplicas 12 (forecast asks for 45)"),
    (why.Clamped("min", 1, 0, "reactive"), "clamped up to minReplicas 1 (reactive asked for 0)"),
    (why.RateLimited("up", 100, 4, 15, 6, 12, 50),
     "scale-up rate limit: at most max(100 %, 4 pods) per 15 s from 6, so 12 instead of 50"),
    (why.Stabilised("down", 300, 10, 10),
     "scale-down stabilisation: the highest recommendation in the last 300 s is 10, so not below 10"),
    (why.HpaRule("tolerance", 109.0, "req/s", 10.0, 10, ratio=1.09, tolerance=0.1, current=10),
     "reactive (HPA rule): observed demand 109 req/s is 109% of the 10 replicas' capacity, within the 10% "
     "tolerance: keep 10"),
    (why.BudgetLimited("replicas", 12, 8, "max 8 GPUs"),
     "prewarm budget limits the speculative replicas: they would take 12 GPUs, the budget allows 8 (max 8 GPUs)"),
    (why.PredictiveNeed(0.95, 90, 42.0, "req/s", 1.3, 300, 54.6, 10.0, 6),
     "predictive: P95 demand over the next 90 s is 42 req/s, × 1.3 for the peaks inside a 5-minute step "
     "(demand.intraStepPeakFactor) = 54.6 req/s; at 10 req/s per replica that needs 6 replicas"),
    (why.EventAsk("launch", True, 300, min_replicas=12, replicas=12),
     "scheduled event 'launch' (starts in 300 s) asks for at least 12 replicas"),
    (why.Holding(10, 1, "no demand observation", 3),
     "holding 10 replicas: no valid demand for 1 control period(s) (no demand observation); never scaling down "
     "on missing data, no new prewarming; reactive fallback after 3 periods"),
]


@pytest.mark.parametrize(("reason", "sentence"), RENDERED, ids=[type(r).__name__ + "-" + str(i)
                                                                for i, (r, _) in enumerate(RENDERED)])
def test_reasons_render_the_documented_sentences(reason: Reason, sentence: str) -> None:
    assert reason.text() == str(reason) == sentence
    assert reason.to_dict()["kind"] == reason.kind
    assert dataclasses.is_dataclass(reason)


def test_status_and_json_keep_the_sentences() -> None:
    d = _decide(_spec(maxReplicas=12), forecast=400.0)
    assert d.to_dict()["reasons"] == [r.text() for r in d.reasons] == list(d.sentences)
    assert d.to_dict()["limits"] == [str(x) for x in d.limits] and "max-replicas" in d.to_dict()["limits"]


def test_every_kind_has_one_reason_class_and_is_documented() -> None:
    classes = [c for c in vars(why).values() if isinstance(c, type) and issubclass(c, Reason) and c is not Reason]
    assert sorted(c.kind for c in classes) == sorted(Kind)
    doc = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", doc, flags=re.M))
    assert {str(k) for k in Kind} <= documented, {str(k) for k in Kind} - documented
    for limit in Limit:
        assert f"`{limit}`" in doc, limit


# -- status that says what happened: each Condition its own reason, placement by where pods are -----
def _decision(strategy: str, *reasons: Reason, **fields: Any) -> Decision:
    return Decision(desired_replicas=fields.pop("desired", 5), placeholder_gpus=0, strategy=strategy,
                    speculative_gpus=0, speculative_cost_per_hour=None, limits=fields.pop("limits", ()),
                    reasons=reasons, **fields)


HPA = why.HpaRule("need", 42.0, "req/s", 10.0, 5)
NEED = why.PredictiveNeed(0.95, 70, 46.2, "req/s", 1.0, STEP, 46.2, 10.0, 5)
MODEL = why.ModelFallback("no model published")
DRIFT = why.DriftFallback("forecast drift (over-forecast)", 900, None)
HOLD = why.Holding(5, 1, "no series", 3)


@pytest.mark.parametrize(("decision", "status", "reason", "words"), [
    # The HPA rule comes first in a predictive decision: the Condition shows the forecast's own reason.
    (_decision("predictive", HPA, NEED), "True", "Forecasting",
     "predictive: P95 demand over the next 70 s is 46.2 req/s; at 10 req/s per replica that needs 5 replicas"),
    (_decision("reactive", MODEL, HPA), "False", "ReactiveFallback",
     "reactive: no model published; scaling like the HPA until a valid model is served"),
    (_decision("reactive", HPA, DRIFT), "False", "ReactiveFallback",
     "reactive: forecast drift (over-forecast); back to predictive after the forecast has been good for 900 s"),
    (_decision("hold", HOLD), "False", "HoldingOnMissingData", "holding 5 replicas: no valid demand for 1"),
    (_decision("predictive", HPA), "True", "Forecasting", "predictive: forecasting"),
], ids=["predictive", "model", "drift", "hold", "no-need-reason"])
def test_the_predictive_condition_shows_its_own_reason(decision: Decision, status: str, reason: str,
                                                        words: str) -> None:
    cond = next(c for c in explain.conditions(decision, True, "scale") if c.type == "Predictive")
    assert (cond.status, cond.reason) == (status, reason)
    assert cond.message.startswith(words), cond.message
    assert "HPA rule" not in cond.message


@pytest.mark.parametrize(("prewarm", "sentence"), [
    (why.Prewarm(0.95, 1.0, 420, 90.0, "req/s", True, 9, 5, 4, 0, 4),
     "4 more than the 5 existing or starting; 4 already held by placeholders bound on existing nodes, "
     "0 fit on free GPUs of existing nodes, 0 need new nodes"),
    (why.Prewarm(0.95, 1.0, 420, 90.0, "req/s", True, 9, 5, 4, 1, 2),
     "2 already held by placeholders bound on existing nodes, 1 fit on free GPUs of existing nodes, "
     "1 need new nodes"),
    (why.Prewarm(0.95, 1.0, 420, 90.0, "req/s", True, 9, 5, 4, 0),
     "4 more than the 5 existing or starting; 0 fit on free GPUs of existing nodes, 4 need new nodes"),
], ids=["all-bound", "mixed", "none-bound"])
def test_prewarm_placement_counts_what_is_bound_where(prewarm: why.Prewarm, sentence: str) -> None:
    assert sentence in prewarm.text()


@pytest.mark.parametrize(("bound", "free", "placed"), [
    (0, 0, (0, 0, 2)),  # no placeholder bound (pending, or none): both extra replicas need new nodes
    (2, 0, (2, 0, 0)),  # two placeholder pods bound on an existing node hold both extra replicas
    (1, 1, (1, 1, 0)),  # one bound, one on free GPUs
], ids=["pending", "bound", "mixed"])
def test_the_planner_places_the_extra_on_bound_placeholders_first(bound: int, free: int,
                                                                   placed: tuple[int, int, int]) -> None:
    spec = _spec(mode="scale")
    cluster = ClusterState(10, 10, placeholder_gpus=2, free_gpus=free, placeholder_bound_gpus=bound)
    rising = np.array([[100.0] + [112.0] * 5, [100.0] + [112.0] * 5])
    f = Forecast(_forecast(100.0).issued_at, STEP, (0.5, 0.95), rising, "test")
    d, _ = plan(spec, f, DemandSample(100.0, NOW), cluster, PlannerState(), NOW)
    pre = next(r for r in d.reasons if isinstance(r, why.Prewarm))
    on_bound, on_free, new = placed
    assert (pre.extra, pre.on_bound_placeholders, pre.on_free_gpus) == (2, on_bound, on_free)
    assert f"{on_free} fit on free GPUs of existing nodes, {new} need new nodes" in pre.text()


@pytest.mark.parametrize(("decision", "before", "after", "expected"), [
    (_decision("predictive", HPA, NEED), explain.Held(4, 0), explain.Held(5, 0),
     [("SuccessfulRescale", "New size: 5; reason: predictive (Deployment/llm scaled from 4 to 5 replicas)")]),
    (_decision("reactive", DRIFT, HPA, desired=3), explain.Held(4, 2), explain.Held(3, 0),
     [("SuccessfulRescale", "New size: 3; reason: reactive (Deployment/llm scaled from 4 to 3 replicas)"),
      ("PlaceholdersRemoved",
       "New placeholder size: 0 pods, 0 GPUs; reason: reactive (placeholder pods from 2 to 0)")]),
    (_decision("hold", HOLD), explain.Held(5, 0), explain.Held(5, 0), []),
    (_decision("predictive", why.EventRaised(5, 8, ("launch",)), desired=8), explain.Held(5, 0), explain.Held(8, 0),
     [("SuccessfulRescale", "New size: 8; reason: event (Deployment/llm scaled from 5 to 8 replicas)")]),
    (_decision("predictive", NEED, limits=(Limit.BUDGET,)), explain.Held(5, 3), explain.Held(5, 1),
     [("PlaceholdersRemoved",
       "New placeholder size: 1 pods, 1 GPUs; reason: budget (placeholder pods from 3 to 1)")]),
    (_decision("predictive", NEED), explain.Held(5, 0), explain.Held(5, 2),
     [("PlaceholdersCreated",
       "New placeholder size: 2 pods, 2 GPUs; reason: predictive (placeholder pods from 0 to 2)")]),
], ids=["scale-up", "fallback-removes", "nothing-changed", "scheduled-event", "budget-cut", "prewarm"])
def test_actions_are_one_event_each_with_from_to_and_kind(decision: Decision, before: explain.Held,
                                                          after: explain.Held, expected: list[tuple[str, str]]) -> None:
    events = explain.actions(decision, before, after, _spec(mode="scale"))
    assert [(e.reason, e.message) for e in events] == expected
    assert all(e.type == "Normal" for e in events)
