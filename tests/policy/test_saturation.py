"""Does GPU utilisation measure load? The dcgm-busy-gpus check on the real ladders and on simulated servers.

Each history is one GPU's: the ladder read as Prometheus would (15-s windows every 5 s,
benchmarks/gpu_ladders.py), GPUs = 1, latency the window's mean.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.gpu_ladders import LadderSeries, ladder_series, window_series, windows
from predictive_scaler.policy.saturation import ServingHistory, check_demand_signal
from predictive_scaler.series import Series
from tests.support.serving_sim import dynamic_batching, one_at_a_time

LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)


def history(s: LadderSeries, gpus: float = 1.0) -> ServingHistory:
    ones = Series(np.full(len(s.served), gpus), s.served.start, s.served.step_seconds)
    scale = Series(s.served.values * gpus, s.served.start, s.served.step_seconds)
    return ServingHistory(throughput=scale, gpus=ones, utilisation=s.gpu_util, latency=s.mean_latency)


@pytest.mark.parametrize(("name", "verdict"), [
    ("decoder-batched", "pinned"),  # 92 % at 46 req/s, latency unchanged; capacity 557
    ("encoder-serial", "blind"),  # latency 2.5× while the GPU reads 15 %
    ("decoder-serial", "tracks-load"),
    ("encoder-batched", "tracks-load"),
])
def test_each_ladder_gets_its_verdict(name: str, verdict: str) -> None:
    check = check_demand_signal(history(ladder_series(name, 15, 5)))
    assert check.verdict == verdict, check.message
    assert check.fired == (verdict in ("pinned", "blind"))
    if check.fired:
        assert "demand.kind: requests" in check.message


def test_the_verdict_is_per_gpu_whatever_the_fleet() -> None:
    """Eight GPUs each serving the ladder: the same verdict, the same rate per GPU."""
    one = check_demand_signal(history(ladder_series("decoder-batched", 15, 5)))
    eight = check_demand_signal(history(ladder_series("decoder-batched", 15, 5), gpus=8))
    assert eight.verdict == one.verdict == "pinned" and eight.at_throughput == pytest.approx(one.at_throughput)


def test_pinned_says_where_and_what_one_gpu_served_at_unloaded_latency() -> None:
    check = check_demand_signal(history(ladder_series("decoder-batched", 15, 5)))
    assert check.at_throughput is not None and check.at_throughput < 0.1 * 557
    assert check.utilisation is not None and check.utilisation >= 90
    assert check.latency_ratio is not None and check.latency_ratio < 1.25
    assert check.served_per_gpu_unloaded is not None and check.served_per_gpu_unloaded > check.at_throughput


def test_a_simulated_batching_server_reads_pinned_and_a_one_at_a_time_server_does_not() -> None:
    batching = window_series(windows(dynamic_batching(0.010, 0.0005, 32, LOADS, seed=1), 15, 5), 5)
    assert check_demand_signal(history(batching)).verdict == "pinned"
    serial = window_series(windows(one_at_a_time(40.0, LOADS, seed=1), 15, 5), 5)
    assert check_demand_signal(history(serial)).verdict == "tracks-load"


def test_pinned_without_a_quiet_reference_is_seen_in_the_spread_of_the_rate() -> None:
    """Only busy steps (no step under 60 %): utilisation at ≥ 90 % while the rate per GPU quadruples."""
    start = ladder_series("decoder-batched", 15, 5).served.start
    rate = np.array([60, 120, 180, 240, 300], dtype=float)

    def s(v: np.ndarray) -> Series:
        return Series(v, start, 60)

    check = check_demand_signal(ServingHistory(s(rate), s(np.ones(5)), s(np.full(5, 96.0)), s(np.full(5, 0.09))))
    assert check.verdict == "pinned" and "5.0×" in check.message


def test_a_server_always_saturated_is_not_called_pinned() -> None:
    """≥ 90 % at one rate with a long, steady latency: a GPU at capacity, nothing contradicts it."""
    start = ladder_series("decoder-batched", 15, 5).served.start

    def s(v: float) -> Series:
        return Series(np.full(6, v), start, 60)

    assert check_demand_signal(ServingHistory(s(15.0), s(1.0), s(97.0), s(0.9))).verdict == "tracks-load"


def test_too_little_history_is_no_verdict() -> None:
    s = ladder_series("decoder-batched", 15, 5)
    short = LadderSeries(s.served.slice(0, 3), s.p95.slice(0, 3), s.mean_latency.slice(0, 3), s.running.slice(0, 3),
                         s.gpu_util.slice(0, 3), s.sm_util.slice(0, 3), window_seconds=15)
    check = check_demand_signal(history(short))
    assert check.verdict == "unknown" and not check.fired
