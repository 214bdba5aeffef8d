"""Peer policies and the physical bound, by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.backtest import peer_policies
from predictive_scaler.backtest.scenario import MeasurementChain
from predictive_scaler.backtest.simulator import ClusterConfig, Demand, SimulatedCluster
from predictive_scaler.series import Series
from predictive_scaler.spec import ReactiveBehavior

# Cold start 50 + 300 + 10 + 60 = 420 s = 7 ticks of 60 s.
CFG = ClusterConfig(gpus_per_node=4, node_provision_s=50, image_pull_s=300, pod_start_s=10, model_load_s=60)


@pytest.mark.parametrize(
    ("need", "expected"),
    [
        ([1] * 10 + [5] + [1] * 5, [1, 1, 1, 5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1]),
        ([3] * 4, [3] * 4),
    ],
    ids=["spike-asked-one-lead-time-ahead", "flat"],
)
def test_oracle_asks_for_the_peak_within_one_lead_time(need: list[int], expected: list[int]) -> None:
    demand = Demand(np.array(need, dtype=float), 60, 1.0)
    got = peer_policies.oracle_schedule(demand, CFG, peer_policies.Bounds(1, 20))
    assert list(got) == expected


@pytest.mark.parametrize(
    ("values", "capacity", "gpus"),
    [([10.0, 41.0, np.nan, 0.0], 10.0, [4, 8, 0, 0]), ([1.0], 0.5, [4])],
    ids=["whole-nodes", "two-replicas-one-node"],
)
def test_physical_bound(values: list[float], capacity: float, gpus: list[int]) -> None:
    assert list(peer_policies.bound_gpus(Demand(np.array(values), 60, capacity), CFG)) == gpus


def test_observed_exact_is_the_delayed_trace_step() -> None:
    trace = Series(np.arange(5.0), pd.Timestamp("2024-01-01T00:00:00Z"), 60)
    t0 = trace.start.timestamp()
    got = peer_policies.observed(trace, t0 + np.arange(5) * 60.0, MeasurementChain(exact=True), 90)
    assert np.isnan(got[:2]).all() and list(got[2:]) == [0.0, 1.0, 2.0]  # 90 s → the step 1.5 steps back


def test_observed_is_the_rate_window_of_the_last_scrape() -> None:
    trace = Series(np.arange(10.0), pd.Timestamp("2024-01-01T00:00:00Z"), 60)
    t0 = trace.start.timestamp()
    # At 6 min with 60 s delay: scrape at 5 min, rate over [3 min, 5 min] = mean of steps 3 and 4.
    got = peer_policies.observed(trace, np.array([t0 + 360.0, t0 + 375.0]), MeasurementChain(), 60)
    assert list(got) == [3.5, 3.5]  # 15 s later: the same scrape, the same value


def test_static_is_the_training_peak() -> None:
    assert peer_policies.static_replicas(np.array([5.0, np.nan, 31.0, 12.0]), 10.0) == 4


def test_reactive_peer_is_the_planners_hpa_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = peer_policies.recommend

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(kwargs["demand"])
        return real(*args, **kwargs)

    monkeypatch.setattr(peer_policies, "recommend", spy)
    metric = np.array([np.nan, 10.0, 50.0, 50.0])
    control = peer_policies.HpaControl(metric, behavior=ReactiveBehavior(), capacity=10.0, bounds=peer_policies.Bounds(1, 20))
    cluster = SimulatedCluster.warm(CFG, 1)
    for i in range(4):
        control(i, 60.0 * i, cluster)
    assert calls == [None, 10.0, 50.0, 50.0]    # a gap is "missing", never 0
    assert cluster.desired_replicas == 5


def test_holt_winters_learns_a_daily_shape() -> None:
    season = 96
    days = 10
    t = np.arange(season * days)
    y = 10 + 5 * np.sin(2 * np.pi * t / season)
    state = peer_policies.fit_holt_winters(y[: season * 7], season)
    forecast, _ = peer_policies.holt_winters_filter(state, y[season * 7:], 1)
    # Row t is the forecast of step t+1 made after seeing step t.
    err = np.abs(forecast[:-1] - y[season * 7 + 1:])
    assert err.mean() < 0.5
