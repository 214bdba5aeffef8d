"""Releasing at a node boundary, and a forecast that runs above the level observed now.

- Node-boundary hysteresis: with replicas ahead, a release does not drop the one node that the highest
  demand observed within the release window (``reactive.scaleDownStabilizationSeconds``) needed; a
  fall by more than one node, or a peak older than the window, releases as before.
- Anchoring: when the demand observed now lies below the forecast's P50 for its step, every
  planned-on value is lowered by that gap (never below the floor; demand above the P50 raises nothing).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.errors import ConfigError
from predictive_scaler.policy.planner import ClusterState, Decision, plan
from predictive_scaler.policy.reasons import Kind
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import ScalerSpec

START = datetime(2024, 3, 4, 8, 0, 30, tzinfo=UTC)
STEP = 300
GPN = 4


def _spec(*, fill: bool = False, max_gpus: int = 8) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": 1.0},
        "minReplicas": 1, "maxReplicas": 60, "leadTimes": {"podStartSeconds": 70, "nodeStartSeconds": 420},
        "prewarm": {"enabled": True, "gpusPerNode": GPN, "replicasAhead": True, "fillNodes": fill,
                    "budget": {"maxGpus": max_gpus}},
    })


def _forecast(now: datetime, p50: float, p95: float) -> Forecast:
    issued = pd.Timestamp(math.floor(now.timestamp() / STEP) * STEP - STEP, unit="s", tz="UTC")
    return Forecast(issued, STEP, (0.5, 0.95), np.array([[p50] * 6, [p95] * 6]), "test")


def _walk(spec: ScalerSpec, steps: list[tuple[float, float, float]], replicas: int, *,
          restart: bool = False) -> tuple[list[Decision], PlannerState]:
    """One decision a minute on (demand, P50, P95); the cluster follows each decision at once."""
    state, out = PlannerState(), []
    for i, (d, p50, p95) in enumerate(steps):
        now = START + timedelta(minutes=i)
        if restart:  # as the status keeps it between reconciles
            state = PlannerState.from_dict(json.loads(json.dumps(state.to_dict())))
        decision, state = plan(spec, _forecast(now, p50, p95), DemandSample(d, now),
                               ClusterState(desired_replicas=replicas, ready_replicas=replicas), state, now)
        replicas = decision.desired_replicas
        out.append(decision)
    return out, state


# A tight forecast that fits 16 replicas (P50 15.7, P95 15.8: upper band 15.85) after demand that
# needed 17 — the 5th node of 4 GPUs — or 24 (two nodes more), a few minutes or long before.
AT_BOUNDARY = [(17.0, 16.8, 17.0)] * 3
LONG_AGO = [(17.0, 16.8, 17.0)] * 3 + [(15.5, 15.7, 15.8)] * 6
TWO_NODES = [(24.0, 23.8, 24.0)] * 3


@pytest.mark.parametrize(
    ("history", "fill", "expected", "held"),
    [
        (AT_BOUNDARY, False, 17, True),   # 17 observed 1 min ago needed the 5th node: keep it
        (AT_BOUNDARY, True, 20, True),    # … and fill it (a billed GPU costs the same idle or serving)
        (LONG_AGO, False, 16, False),     # the peak left the 300 s window: the node goes
        (TWO_NODES, False, 16, False),    # a fall by more than one node is a level change: release at once
    ],
    ids=["recent-peak-keeps-the-node", "recent-peak-keeps-the-node-filled", "peak-outside-window-releases",
         "fall-by-more-than-a-node-releases"],
)
def test_release_keeps_the_node_recent_demand_needed(history: list[tuple[float, float, float]], fill: bool,
                                                     expected: int, held: bool) -> None:
    spec = _spec(fill=fill, max_gpus=8)
    start = math.ceil(history[0][0])
    decisions, _ = _walk(spec, [*history, (15.5, 15.7, 15.8)], start)
    last = decisions[-1]
    assert last.strategy == "predictive"
    assert last.desired_replicas == expected
    assert (Kind.RELEASE_HELD_RECENT in {r.kind for r in last.reasons}) is held
    assert all(d.speculative_gpus <= 8 for d in decisions)  # the budget still holds


def test_recent_demand_survives_a_restart() -> None:
    """The recent demand lives in the planner state: a controller restarted between decisions decides the same."""
    spec = _spec()
    steps = [*AT_BOUNDARY] + [(15.5, 15.7, 15.8)] * 4
    direct, state = _walk(spec, steps, 17)
    restarted, _ = _walk(spec, steps, 17, restart=True)
    assert direct == restarted
    assert direct[-1].desired_replicas == 17
    # The 300 s window at minute 6 keeps minutes 1 … 6: the first 17 has left it.
    assert [v for _, v in state.recent_demand] == [17.0, 17.0, 15.5, 15.5, 15.5, 15.5]


@pytest.mark.parametrize(
    "recent",
    [[[1.0, -3.0]], [[1.0, "x"]], [[1.0, float("nan")]], [[1.0]]],
    ids=["negative", "not-a-number", "nan", "no-value"],
)
def test_malformed_recent_demand_is_a_clear_error(recent: list[list[object]]) -> None:
    doc = PlannerState().to_dict()
    doc["recentDemand"] = recent
    with pytest.raises(ConfigError, match="status.plannerState"):
        PlannerState.from_dict(json.loads(json.dumps(doc, allow_nan=True)))


def test_a_retried_decision_records_its_demand_once() -> None:
    spec = _spec()
    cluster = ClusterState(desired_replicas=10, ready_replicas=10)
    args = (_forecast(START, 9.8, 10.0), DemandSample(10.0, START), cluster)
    first, state = plan(spec, *args, PlannerState(), START)
    again, retried = plan(spec, *args, state, START)
    assert again == first
    assert retried.recent_demand == state.recent_demand == ((START.timestamp(), 10.0),)


@pytest.mark.parametrize(
    ("demand", "p50", "p95", "minutes", "expected", "anchored"),
    [
        (17.0, 20.0, 22.0, 6, 19, True),    # 5 min under a P50 3 above the level now: P95 22 - 3 = 19
        (17.0, 20.0, 22.0, 1, 22, False),   # one observation is no evidence the model lags: as it is
        (20.0, 20.0, 22.0, 6, 22, False),   # demand at the P50: the forecast as it is
        (21.0, 20.0, 22.0, 6, 22, False),   # demand above the P50 raises nothing beyond the forecast
        (17.0, 30.0, 32.0, 6, 19, True),    # far above: lowered to the level now, its spread kept (2 above it)
    ],
    ids=["forecast-above-level-lowered", "one-observation-is-no-evidence", "demand-at-p50", "demand-above-p50",
         "far-above-keeps-its-spread"],
)
def test_forecast_above_the_level_now_is_lowered(demand: float, p50: float, p95: float, minutes: int,
                                                expected: int, anchored: bool) -> None:
    """The demand has stayed below the forecast's P50 for ``minutes`` (the release window is 300 s): first
    under a forecast at its level, then the forecast runs above it."""
    spec = _spec(max_gpus=8)
    level = [(demand, demand + 0.2, demand + 0.5)] * (minutes - 1)
    decisions, _ = _walk(spec, [*level, (demand, p50, p95)], math.ceil(demand))
    d = decisions[-1]
    assert d.strategy == "predictive"
    assert d.desired_replicas == expected
    assert (Kind.FORECAST_ANCHORED in {r.kind for r in d.reasons}) is anchored
    assert all(x.speculative_gpus <= 8 for x in decisions)
