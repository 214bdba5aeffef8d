"""The prewarm budget holds minute by minute against a counterfactual speculation cannot raise.

Speculative capacity is what the planner holds (replicas and placeholders, on whole nodes) above what
the HPA rule alone would hold without any forecast. The counterfactual here is replayed independently:
the reactive rule on the demand only, its own replica count as "current", never the planner's.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy import reactive
from predictive_scaler.policy.planner import ClusterState, plan
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import ScalerSpec

START = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)
STEP = 300
GPN = 4


def _spec(max_gpus: int) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"},
        "demand": {"query": "q"},
        "capacity": {"requestsPerReplica": 1.0},
        "minReplicas": 1,
        "maxReplicas": 60,
        "leadTimes": {"podStartSeconds": 70, "nodeStartSeconds": 420},
        "prewarm": {"enabled": True, "gpusPerNode": GPN, "budget": {"maxGpus": max_gpus}},
    })


def _forecast(now: datetime, p50: float, p95: float) -> Forecast:
    issued = pd.Timestamp(math.floor(now.timestamp() / STEP) * STEP - STEP, unit="s", tz="UTC")
    return Forecast(issued, STEP, (0.5, 0.95), np.array([[p50] * 6, [p95] * 6]), "test")


def counterfactual(spec: ScalerSpec, demand: list[float], start: int) -> list[int]:
    """The HPA rule on demand alone, from ``start`` replicas: what the planner's speculation is measured from."""
    out, current, recs, events = [], start, (), ()
    for i, d in enumerate(demand):
        now = START.timestamp() + 60 * i
        r = reactive.recommend(spec.reactive, demand=d, capacity=spec.capacity_per_replica, current=current,
                               ready=current, min_replicas=spec.min_replicas, max_replicas=spec.max_replicas,
                               recommendations=recs, scale_events=events, now=now)
        recs = r.recommendations
        if r.desired != current:
            events = reactive.prune_events(events + ((now, r.desired - current),), spec.reactive, now)
        current = r.desired
        out.append(current)
    return out


def _speculative(replicas: int, placeholders: int, cf: int) -> int:
    held, base = replicas + placeholders, cf
    return max(0, held - base, GPN * (math.ceil(held / GPN) - math.ceil(base / GPN)))


# Demand sits at 18 req/s while the forecast rises ahead of it: every replica the forecast adds is
# within 10 % of the demand, so an HPA rule evaluated on the planner's *own* replica count keeps
# it (tolerance, then the 5-minute scale-down window) — and a floor built that way swallows it.
LEAK = [(18.0, 18.0, 20.0)] * 4 + [(18.0, 18.0, 22.0)] * 4 + [(18.0, 18.0, 24.0)] * 4 + [(18.0, 18.0, 26.0)] * 8


@pytest.mark.parametrize("max_gpus", [2, 4, 8], ids=["max2", "max4", "max8"])
def test_budget_holds_every_minute_against_the_counterfactual(max_gpus: int) -> None:
    spec = _spec(max_gpus)
    demand = [d for d, _, _ in LEAK]
    cf = counterfactual(spec, demand, start=18)
    state, replicas, held = PlannerState(), 18, 0
    over = []
    for i, (d, p50, p95) in enumerate(LEAK):
        now = START + timedelta(minutes=i)
        cluster = ClusterState(desired_replicas=replicas, ready_replicas=replicas, placeholder_gpus=held,
                               free_gpus=(-(replicas + held)) % GPN)
        decision, state = plan(spec, _forecast(now, p50, p95), DemandSample(d, now), cluster, state, now)
        state = PlannerState.from_dict(json.loads(json.dumps(state.to_dict())))  # as the status keeps it
        replicas, held = decision.desired_replicas, decision.placeholder_gpus
        speculative = _speculative(replicas, held, cf[i])
        if speculative > max_gpus:
            over.append((i, replicas, held, cf[i], speculative))
        assert decision.speculative_gpus <= max_gpus
    assert not over, f"minutes over the {max_gpus}-GPU budget (minute, replicas, placeholders, counterfactual, speculative): {over}"


def test_counterfactual_survives_a_restart() -> None:
    """The counterfactual lives in the state (the status): restored from JSON, the next decision is the same."""
    spec = _spec(4)
    state, replicas = PlannerState(), 18
    for i, (d, p50, p95) in enumerate(LEAK[:10]):
        now = START + timedelta(minutes=i)
        cluster = ClusterState(desired_replicas=replicas, ready_replicas=replicas)
        decision, state = plan(spec, _forecast(now, p50, p95), DemandSample(d, now), cluster, state, now)
        replicas = decision.desired_replicas
    now = START + timedelta(minutes=10)
    cluster = ClusterState(desired_replicas=replicas, ready_replicas=replicas)
    args = (_forecast(now, 18.0, 26.0), DemandSample(18.0, now), cluster)
    direct, _ = plan(spec, *args, state, now)
    restored, _ = plan(spec, *args, PlannerState.from_dict(json.loads(json.dumps(state.to_dict()))), now)
    fresh, _ = plan(spec, *args, PlannerState(), now)
    assert restored == direct
    assert direct.reactive_replicas == 18
    # A fresh state knows no counterfactual: it starts from the demand, not from the raised replicas.
    assert fresh.reactive_replicas == 18


def _ahead_spec(max_gpus: int, *, ahead: bool, fill: bool) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": 1.0},
        "minReplicas": 1, "maxReplicas": 60, "leadTimes": {"podStartSeconds": 70, "nodeStartSeconds": 420},
        "prewarm": {"enabled": True, "gpusPerNode": GPN, "replicasAhead": ahead, "fillNodes": fill,
                    "budget": {"maxGpus": max_gpus}},
    })


@pytest.mark.parametrize(
    ("max_gpus", "fill", "p95", "expected"),
    [
        (8, True, 5.0, 8),     # 5 replicas take 2 nodes: fill both (3 speculative GPUs)
        (2, True, 5.0, 7),     # … within the budget: 2 GPUs above the counterfactual of 5
        (8, False, 5.0, 5),
        (8, True, 8.0, 8),     # already whole nodes
    ],
    ids=["fill", "fill-within-budget", "no-fill", "whole-nodes"],
)
def test_fill_nodes(max_gpus: int, fill: bool, p95: float, expected: int) -> None:
    spec = _ahead_spec(max_gpus, ahead=True, fill=fill)
    cluster = ClusterState(desired_replicas=5, ready_replicas=5)
    d, _ = plan(spec, _forecast(START, p95 * 0.9, p95), DemandSample(5.0, START), cluster, PlannerState(), START)
    assert d.desired_replicas == expected
    assert d.speculative_gpus <= max_gpus
    assert d.reactive_replicas == 5


@pytest.mark.parametrize(("ahead", "expected"), [(True, 11), (False, 20)], ids=["forecast-stabilises", "hpa-window"])
def test_replicas_ahead_release_when_the_forecast_falls(ahead: bool, expected: int) -> None:
    """Demand falls from 20 to 10 and the forecast agrees: with replicas ahead the planner releases at
    once (the forecast is the stabilisation) down to its upper band — P95 10 plus half its spread of 1
    above the P50 = 10.5, so 11; otherwise the reactive floor holds 20 for its 300 s window."""
    spec = _ahead_spec(8, ahead=ahead, fill=False)
    state, replicas = PlannerState(), 20
    decisions = []
    for i, d in enumerate([20.0] * 5 + [10.0] * 3):
        now = START + timedelta(minutes=i)
        p95 = 20.0 if d == 20.0 else 10.0
        decision, state = plan(spec, _forecast(now, p95 * 0.9, p95), DemandSample(d, now),
                               ClusterState(desired_replicas=replicas, ready_replicas=replicas), state, now)
        replicas = decision.desired_replicas
        decisions.append(decision)
    assert decisions[-1].desired_replicas == expected
    assert decisions[-1].reactive_replicas == 20  # the counterfactual is still in its scale-down window
    assert all(x.speculative_gpus <= 8 for x in decisions)


@pytest.mark.parametrize(
    ("demand", "p50", "p95", "expected"),
    [
        (10.0, 9.7, 9.8, 10),    # a tight forecast that fits 10: release from 20 to 10
        (10.0, 6.0, 9.8, 12),    # the same P95 with a wide spread: release only to its upper band 11.7
        (15.0, 4.0, 5.0, 20),    # the forecast is far below the demand now (a level shift it has not seen):
                                 # the HPA floor (its scale-down window, 20) holds, no release
    ],
    ids=["confident-release", "wide-band-holds-more", "lagging-forecast-keeps-hpa-floor"],
)
def test_release_needs_a_confident_forecast(demand: float, p50: float, p95: float, expected: int) -> None:
    """With replicas ahead, a release below the current replicas needs the forecast's upper band to fit
    and a forecast that has caught up with the demand observed now."""
    spec = _ahead_spec(8, ahead=True, fill=False)
    state, replicas = PlannerState(), 20
    for i in range(3):  # the counterfactual settles at 20 on demand 20
        now = START + timedelta(minutes=i)
        decision, state = plan(spec, _forecast(now, 19.0, 20.0), DemandSample(20.0, now),
                               ClusterState(desired_replicas=replicas, ready_replicas=replicas), state, now)
        replicas = decision.desired_replicas
    now = START + timedelta(minutes=3)
    decision, _ = plan(spec, _forecast(now, p50, p95), DemandSample(demand, now),
                       ClusterState(desired_replicas=replicas, ready_replicas=replicas), state, now)
    assert decision.reactive_replicas == 20
    assert decision.desired_replicas == expected
