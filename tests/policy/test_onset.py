"""A predicted rise is kept through its onset, whatever the reconcile interval, when demand is seen lagged.

The controller sees ``rate(counter[2m])`` of counters scraped every 30 s, a little late, stamped with
its own time — so for a few minutes after a rise begins it still reads the level before it. Replicas
placed ahead for a forecast rise must survive that: neither anchoring (the forecast lowered to the level
observed) nor over-forecast drift may release them until one full window after the onset has been
observed (``drift.signalLagSeconds``). A rise that never comes is still released once that hold ends.
Each row drives the planner decision by decision, the cluster following at once.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.backtest.scenario import MeasurementChain
from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.policy.planner import ClusterState, Decision, plan
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.spec import ScalerSpec

ONSET = datetime(2024, 3, 4, 18, 20, tzinfo=UTC)
STEP = 300
LOW, HIGH = 12.0, 28.0
CAP = 4.0  # 12 → 3 replicas, 28 → 7
#: The shipped example's chain: [2m] of 30 s scrapes, 30 s late (lag to a full window: 180 s).
CHAIN = MeasurementChain(scrape_interval_s=30, rate_window_s=120)
DELAY = 30.0
BEFORE, AFTER = timedelta(minutes=20), timedelta(minutes=30)


def _spec(interval: int, *, lag: int = 180, fast_seconds: int = 120) -> ScalerSpec:
    return ScalerSpec.from_dict({
        "target": {"name": "llm"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": CAP},
        "minReplicas": 1, "maxReplicas": 20, "controlPeriodSeconds": interval,
        "leadTimes": {"podStartSeconds": 70, "nodeStartSeconds": 420},
        "prewarm": {"enabled": True, "gpusPerNode": 4, "replicasAhead": True, "budget": {"maxGpus": 8}},
        "drift": {"signalLagSeconds": lag, "fastSeconds": fast_seconds},
    })


def _forecast(now: datetime) -> Forecast:
    """Issued at the start of the last complete step: P50 LOW before the onset, HIGH from it on."""
    issued = math.floor(now.timestamp() / STEP) * STEP - STEP
    starts = issued + STEP * np.arange(1, 13)
    p50 = np.where(starts >= ONSET.timestamp(), HIGH, LOW)
    return Forecast(pd.Timestamp(issued, unit="s", tz="UTC"), STEP, (0.5, 0.95), np.stack([p50, p50 * 1.1]), "test")


def _lagged(rise_comes: bool, times: np.ndarray) -> np.ndarray:
    """What the controller's query returns at each time: the true demand through the chain."""
    start = (ONSET - BEFORE - timedelta(hours=1)).timestamp()
    steps = np.arange(start, (ONSET + AFTER).timestamp(), 15.0)
    level = np.where((steps >= ONSET.timestamp()) & rise_comes, HIGH, LOW)
    truth = level * (1 + 0.05 * np.random.default_rng(7).standard_normal(steps.size))  # requests scatter
    return CHAIN.signal(truth, start, 15, times, DELAY)


def _drive(spec: ScalerSpec, interval: int, rise_comes: bool) -> list[tuple[float, float, Decision]]:
    """(seconds from the onset, demand seen, decision) for every reconcile from 20 min before to 30 min after."""
    times = np.arange((ONSET - BEFORE).timestamp(), (ONSET + AFTER).timestamp(), interval)
    seen = _lagged(rise_comes, times)
    state, replicas, held, out = PlannerState(), 3, 0, []
    for t, value in zip(times, seen, strict=True):
        now = datetime.fromtimestamp(float(t), UTC)
        # The controller's source stamps a value with the query time (no freshness query).
        decision, state = plan(spec, _forecast(now), DemandSample(float(value), now),
                               ClusterState(desired_replicas=replicas, ready_replicas=replicas,
                                            placeholder_gpus=held), state, now)
        replicas, held = decision.desired_replicas, decision.placeholder_gpus
        out.append((t - ONSET.timestamp(), float(value), decision))
    return out


INTERVALS = [15, 30, 60]


@pytest.mark.parametrize("interval", INTERVALS, ids=[f"{i}s" for i in INTERVALS])
def test_the_demand_seen_lags_the_rise_by_the_window(interval: int) -> None:
    """The premise: for 30 s after the onset the signal shows nothing, and it is whole only after 180 s."""
    walk = _drive(_spec(interval), interval, rise_comes=True)
    assert all(v < LOW * 1.1 for at, v, _ in walk if at < DELAY + 30)
    assert all(v > HIGH * 0.9 for at, v, _ in walk if at >= 180)
    assert any(LOW * 1.2 < v < HIGH * 0.8 for at, v, _ in walk if 0 <= at < 180)  # smoothed through the window


@pytest.mark.parametrize("interval", INTERVALS, ids=[f"{i}s" for i in INTERVALS])
def test_replicas_placed_ahead_are_kept_through_the_onset(interval: int) -> None:
    walk = _drive(_spec(interval), interval, rise_comes=True)
    need = math.ceil(HIGH / CAP)
    placed = next(at for at, _, d in walk if d.desired_replicas >= need)
    assert placed <= -60, "the rise is provisioned ahead of its onset"
    after = [(at, v, d) for at, v, d in walk if at >= placed]
    kept = [(at, d.desired_replicas, d.strategy) for at, _, d in after if d.desired_replicas < need]
    assert not kept, f"released before the demand arrived: {kept[:3]}"
    assert all(d.strategy == "predictive" for _, _, d in after)


@pytest.mark.parametrize("interval", INTERVALS, ids=[f"{i}s" for i in INTERVALS])
def test_a_rise_that_never_comes_is_released_after_the_hold(interval: int) -> None:
    walk = _drive(_spec(interval), interval, rise_comes=False)
    need = math.ceil(HIGH / CAP)
    released = [at for at, _, d in walk if at > -60 and d.desired_replicas < need]
    assert released, "an over-forecast must not be held for ever"
    # Nothing before the signal could show the onset (180 s lag, on the observation's own stamp) …
    assert released[0] >= 180
    # … and then the over-forecast goes: back to the level's replicas (and a node for them) well within the half hour.
    assert walk[-1][2].desired_replicas <= math.ceil(LOW / CAP) + 1
    assert walk[-1][2].placeholder_gpus == 0


@pytest.mark.parametrize("interval", [15, 30], ids=["15s", "30s"])
def test_without_the_hold_the_lagged_signal_releases_the_prewarm(interval: int) -> None:
    """The rules the hold replaces (no lag allowance; a run of 3 observations drifts at any interval)
    remove the prewarmed replicas before the demand has arrived — what the hold exists to prevent.
    (At 60 s three observations already span 120 s, by when the window shows half the rise.)"""
    walk = _drive(_spec(interval, lag=0, fast_seconds=0), interval, rise_comes=True)
    need = math.ceil(HIGH / CAP)
    early = [at for at, _, d in walk if 0 <= at < 180 and d.desired_replicas < need]
    assert early


def test_drift_is_judged_over_time_not_reconciles() -> None:
    """Three far-below observations 15 s apart (30 s) are no drift; far below for fastSeconds is."""
    spec = _spec(15, lag=0)
    start = ONSET + timedelta(hours=1)  # the forecast says HIGH; demand stays LOW
    state, out = PlannerState(), []
    for i in range(12):
        now = start + timedelta(seconds=15 * i)
        d, state = plan(spec, _forecast(now), DemandSample(LOW, now),
                        ClusterState(desired_replicas=8, ready_replicas=8), state, now)
        out.append(d.strategy)
    assert out[:8] == ["predictive"] * 8  # 8 observations span 105 s < 120 s (3 used to be enough)
    assert out[8:] == ["reactive"] * 4      # the 9th spans 120 s: over-forecast drift
