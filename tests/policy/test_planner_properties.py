"""Properties of the planner for any inputs, including NaN, ±Inf, negatives, empty forecasts, huge values.

Each test draws 10,000 examples (1,000 under the ``unit`` Hypothesis profile of
`make unit`). ``hypothesis.event`` records which strategy ran and whether the budget was non-zero; run with ``--hypothesis-show-statistics``
to see that most examples exercise the predictive strategy with a budget.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy.budget import allowance, speculative_gpus
from predictive_scaler.policy.planner import ClusterState, plan
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import Budget, ScalerSpec
from tests.support.profiles import examples

NOW = datetime(2024, 5, 6, 10, 7, 30, tzinfo=UTC)
STEP = 300
LAST_STEP = pd.Timestamp(math.floor(NOW.timestamp() / STEP) * STEP - STEP, unit="s", tz="UTC")

MANY = settings(max_examples=examples(10_000), deadline=None, suppress_health_check=list(HealthCheck))

weird = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e9, 0.0, 1e300, 1e-300])


def _spec(lo: int, hi: int, gpr: int, gpn: int, cap: float, missing: int, enabled: bool,
          budget: dict[str, object]) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"},
        "demand": {"query": "q"},
        "capacity": {"requestsPerReplica": cap},
        "gpusPerReplica": gpr,
        "minReplicas": lo,
        "maxReplicas": hi,
        "missingDataPeriods": missing,
        "prewarm": {"enabled": enabled, "gpusPerNode": gpn, "budget": budget},
    })


# Specs are built once (their validation is tested elsewhere) and drawn from a pool.
_BUDGETS: list[dict[str, object]] = [
    {"maxGpus": 1}, {"maxGpus": 4}, {"maxGpus": 8}, {"maxGpus": 40},
    {"maxGpus": 16, "pricePerGpuHour": 2.5},
    {"maxCostPerHour": 0.3, "pricePerGpuHour": 0.1}, {"maxCostPerHour": 20.0, "pricePerGpuHour": 3.3},
    {"maxCostPerHour": 100.0, "pricePerGpuHour": 1.7, "maxGpus": 9},
    {},
]
SPECS = [
    _spec(lo, hi, gpr, gpn, cap, missing, enabled, budget)
    for (lo, hi) in ((0, 1), (0, 60), (1, 10), (3, 40), (5, 5))
    for (gpr, gpn) in ((1, 8), (2, 4), (1, 1))
    for cap, missing, enabled in ((1.0, 0, True), (7.5, 3, True), (100.0, 2, False))
    for budget in _BUDGETS
]

WEIRD = np.array([math.nan, math.inf, -math.inf, -1.0, -1e9, 0.0, 1e300, 1e-300])

# Generation is seeded numpy (fast) steered by a few categorical draws (which hypothesis
# explores and shrinks). Most examples are sane so the predictive path is exercised;
# the rest inject every kind of garbage.
FORECAST_KINDS = ["ok"] * 24 + ["none", "empty", "stale", "future", "no-p95", "weird", "weird"]
DEMAND_KINDS = ["near"] * 24 + ["any", "nan", "inf", "-inf", "negative", "stale", "none", "huge", "zero"]
CLUSTER_KINDS = ["sane"] * 5 + ["weird"]


def _forecast(kind: str, rng: np.random.Generator) -> Forecast | None:
    if kind == "none":
        return None
    steps = 0 if kind == "empty" else int(rng.integers(1, 9))
    level = float(rng.uniform(0, 1500)) * (0.01 if rng.random() < 0.1 else 1.0)
    p50 = np.clip(level * (1 + rng.normal(0, 0.2, steps)), 0, None)
    p95 = p50 * (1 + rng.uniform(0, 0.5))
    if kind == "weird":
        for row in (p50, p95):
            hit = rng.random(steps) < 0.4
            row[hit] = rng.choice(WEIRD, int(hit.sum()))
    issued = {"stale": LAST_STEP - pd.Timedelta(hours=2), "future": LAST_STEP + pd.Timedelta(hours=1)}.get(
        kind, LAST_STEP)
    quantiles = (0.5, 0.9) if kind == "no-p95" else (0.5, 0.95)
    with np.errstate(all="ignore"):
        return Forecast(issued, STEP, quantiles, np.vstack([p50, p95]).reshape(2, steps), "hypothesis")


def _demand(kind: str, rng: np.random.Generator, forecast: Forecast | None, now: datetime) -> DemandSample | None:
    fresh = now - timedelta(seconds=float(rng.uniform(0, 60)))
    if kind == "none":
        return None
    if kind == "near" and forecast is not None and forecast.horizon_steps:
        return DemandSample(float(forecast.values[0, 0] * (1 + rng.normal(0, 0.05))), fresh)
    value = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "negative": -float(rng.uniform(0, 1e6)),
             "huge": 1e300, "zero": 0.0}.get(kind, float(rng.uniform(0, 1500)))
    when = now - timedelta(hours=1) if kind == "stale" else fresh
    return DemandSample(value, when)


def _cluster(kind: str, rng: np.random.Generator) -> ClusterState:
    if kind == "weird":
        pick = [-5, -1, 0, 10**12, 2**62, 3]
        return ClusterState(*(int(rng.choice(pick)) for _ in range(5)))
    desired = int(rng.integers(0, 61))
    ready = int(rng.integers(0, desired + 1)) if rng.random() < 0.3 else desired
    return ClusterState(desired, ready, desired - ready, int(rng.integers(0, 17)), int(rng.integers(0, 17)))


def _inputs(rng: np.random.Generator, kinds: tuple[int, int, int], now: datetime
            ) -> tuple[Forecast | None, DemandSample | None, ClusterState]:
    fk, dk, ck = kinds
    forecast = _forecast(FORECAST_KINDS[fk], rng)
    return forecast, _demand(DEMAND_KINDS[dk], rng, forecast, now), _cluster(CLUSTER_KINDS[ck], rng)


# One example = a few small integers (cheap for hypothesis to draw, explore and shrink):
# a numpy seed, the spec, how many earlier periods were decided, and the input kinds.
_kinds = st.tuples(st.integers(0, len(FORECAST_KINDS) - 1), st.integers(0, len(DEMAND_KINDS) - 1),
                   st.integers(0, len(CLUSTER_KINDS) - 1))
cases = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, len(SPECS) - 1), st.integers(0, 3), _kinds, _kinds)


class Case:
    """A spec, a state reached by deciding earlier periods, and inputs for ``now`` and one period later."""

    def __init__(self, drawn: tuple[int, int, int, tuple[int, int, int], tuple[int, int, int]]) -> None:
        seed, spec_index, prior, kinds, later_kinds = drawn
        rng = np.random.default_rng(seed)
        self.spec = SPECS[spec_index]
        state = PlannerState()
        for k in range(prior, 0, -1):
            when = NOW - timedelta(seconds=60 * k)
            random_kinds = (int(rng.integers(len(FORECAST_KINDS))), int(rng.integers(len(DEMAND_KINDS))),
                            int(rng.integers(len(CLUSTER_KINDS))))
            forecast, demand, cluster = _inputs(rng, random_kinds, when)
            _, state = plan(self.spec, forecast, demand, cluster, state, when)
        self.state = state
        self.forecast, self.demand, self.cluster = _inputs(rng, kinds, NOW)
        self.later = NOW + timedelta(seconds=60)
        self.next_inputs = _inputs(rng, later_kinds, self.later)


def record(decision_strategy: str, spec: ScalerSpec) -> None:
    budget = allowance(spec.prewarm.budget).gpus
    event(f"strategy={decision_strategy}, budget={'non-zero' if budget else 'zero'}")


def _current(cluster: ClusterState) -> int:
    return max(0, min(int(cluster.desired_replicas), 10**9))


@pytest.mark.slow
@MANY
@given(drawn=cases)
def test_decisions_respect_bounds_budget_and_missing_data(drawn: Any) -> None:
    c = Case(drawn)
    spec, state, forecast, demand, cluster = c.spec, c.state, c.forecast, c.demand, c.cluster
    d, _ = plan(spec, forecast, demand, cluster, state, NOW)
    record(d.strategy, spec)
    assert spec.min_replicas <= d.desired_replicas <= spec.max_replicas
    if spec.min_replicas > 0:
        assert d.desired_replicas > 0
    a = allowance(spec.prewarm.budget)
    # Speculative = held above the counterfactual (d.reactive_replicas). The one excess the planner
    # does not add is keeping replicas on missing data (never a scale-down) that something else
    # raised above it: then no placeholder is kept and nothing else is added.
    kept = speculative_gpus(d.desired_replicas, 0, d.reactive_replicas, spec.gpus_per_replica,
                            spec.prewarm.gpus_per_node)
    assert d.speculative_gpus == speculative_gpus(d.desired_replicas, d.placeholder_gpus, d.reactive_replicas,
                                                  spec.gpus_per_replica, spec.prewarm.gpus_per_node)
    if d.speculative_gpus > a.gpus:
        assert d.metrics_problem is not None and d.placeholder_gpus == 0 and d.speculative_gpus == kept
        assert d.desired_replicas == min(max(_current(cluster), spec.min_replicas), spec.max_replicas)
        return
    b = spec.prewarm.budget
    if b.max_gpus is not None:
        assert d.speculative_gpus <= b.max_gpus
    if b.max_cost_per_hour is not None:
        assert d.speculative_cost_per_hour is not None and d.speculative_cost_per_hour <= b.max_cost_per_hour
    if b.max_gpus is None and b.max_cost_per_hour is None:
        assert d.placeholder_gpus == 0 and (d.speculative_gpus == 0 or d.metrics_problem is not None)
    assert 0 <= d.placeholder_gpus <= d.speculative_gpus
    if d.metrics_problem is not None:  # missing/invalid demand: never a scale-down, never new speculation
        assert d.strategy in ("hold", "reactive")
        assert d.desired_replicas >= min(_current(cluster), spec.max_replicas)
        assert d.placeholder_gpus <= max(0, cluster.placeholder_gpus)
    assert d.reasons and all(r for r in d.reasons)


@pytest.mark.slow
@MANY
@given(drawn=cases, bump=st.floats(0, 5), add=st.floats(0, 500))
def test_a_larger_forecast_never_lowers_the_decision(drawn: Any, bump: float, add: float) -> None:
    c = Case(drawn)
    spec, state, forecast, demand, cluster = c.spec, c.state, c.forecast, c.demand, c.cluster
    if forecast is not None:
        with np.errstate(over="ignore"):  # 1e300 × 6 overflows; Forecast caps it
            larger = dataclasses.replace(forecast, values=forecast.values * (1 + bump) + add)
    else:
        larger = None
    d1, _ = plan(spec, forecast, demand, cluster, state, NOW)
    d2, _ = plan(spec, larger, demand, cluster, state, NOW)
    record(d1.strategy, spec)
    if d1.strategy == d2.strategy:
        assert d2.desired_replicas >= d1.desired_replicas
        if d1.strategy == "predictive":
            assert d2.predicted_replicas is not None and d1.predicted_replicas is not None
            assert d2.predicted_replicas >= d1.predicted_replicas


@pytest.mark.slow
@MANY
@given(drawn=cases)
def test_deciding_twice_and_restoring_state_change_nothing(drawn: Any) -> None:
    c = Case(drawn)
    spec, state, forecast, demand, cluster = c.spec, c.state, c.forecast, c.demand, c.cluster
    d1, s1 = plan(spec, forecast, demand, cluster, state, NOW)
    record(d1.strategy, spec)
    # Deciding twice (a retried reconcile) equals deciding once.
    d2, s2 = plan(spec, forecast, demand, cluster, s1, NOW)
    assert dataclasses.replace(d2, strategy_changed=d1.strategy_changed) == d1
    assert s2 == s1
    # Serialise → JSON → restore, then the next decision is the same as without the restart.
    restored = PlannerState.from_dict(json.loads(json.dumps(s1.to_dict())))
    assert restored == s1
    later = c.later
    next_forecast, next_demand, next_cluster = c.next_inputs
    a, sa = plan(spec, next_forecast, next_demand, next_cluster, s1, later)
    b, sb = plan(spec, next_forecast, next_demand, next_cluster, restored, later)
    assert a == b and sa == sb


@pytest.mark.slow
@MANY
@given(
    max_gpus=st.one_of(st.none(), st.integers(-10, 10**6), weird, st.text(max_size=3)),
    max_cost=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), weird),
    price=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), weird),
)
def test_bad_budget_fails_closed(max_gpus: object, max_cost: object, price: object) -> None:
    """A budget built around validation (as a corrupted status or a bug could) still buys nothing it should not."""
    b = Budget()
    for name, value in (("max_gpus", max_gpus), ("max_cost_per_hour", max_cost), ("price_per_gpu_hour", price)):
        object.__setattr__(b, name, value)
    a = allowance(b)
    event("fails closed" if a.problem else "usable")
    assert a.gpus >= 0
    if a.problem is None:
        if isinstance(max_gpus, int | float):
            assert a.gpus <= max_gpus
        if isinstance(max_cost, float) and isinstance(price, float) and price > 0:
            assert a.gpus * price <= max_cost
    else:
        assert a.gpus == 0 and "spec.prewarm.budget" in a.problem
