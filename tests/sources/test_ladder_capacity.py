"""Capacity learned at the SLO by the retraining job's path, from the H200 ladders as a server exports them.

Each bundled ladder (backtests/telemetry/, benchmarks/gpu_ladders.py) is backfilled into a real
Prometheus as one vLLM pod's own series, one sample a second: the served counter
``vllm:request_success_total``, the latency histogram's ``_sum``/``_count`` (each second's requests at
the mean of a log-normal through its p50 and p95), and the ``vllm:num_requests_running`` gauge. The job's
learning (``_learned_capacity`` over the job's own ``PrometheusHistory``: the preset's PromQL, then
``estimate_slo_capacity``) must find each saturated ladder's plateau within ±20 % and give a lower bound
for encoder-serial, which never saturated — and for each saturated ladder cut to the steps offered at
most 30 % of its plateau (the test cuts by the offered rate; the job never reads it), a lower bound
between the most it served and the plateau that says the knee was not observed.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from benchmarks import gpu_ladders
from predictive_scaler.retrain.history import PrometheusHistory
from predictive_scaler.retrain.outcome import serve_learned_capacity
from predictive_scaler.retrain.settings import ScalerTarget
from predictive_scaler.retrain.training import _learned_capacity
from predictive_scaler.series import Series
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.openmetrics import CounterFamily, GaugeFamily
from tests.support.prometheus import PrometheusServer

START = pd.Timestamp("2025-05-05T00:00:00Z")
TARGETS = {"encoder-serial": "encserial", "encoder-batched": "encbatched", "decoder-serial": "decserial",
           "decoder-batched": "decbatched"}


def _exported(name: str, up_to: float | None = None) -> tuple[str, Series, Series, Series, Series]:
    frame = gpu_ladders.rows(name)
    if up_to is not None:  # the ladder until its offered rate first passes ``up_to``
        over = np.flatnonzero(frame["offered_rate"].to_numpy(dtype=float) > up_to)
        frame = frame.iloc[: over[0] if over.size else len(frame)].reset_index(drop=True)
    served = frame["served"].to_numpy(dtype=float)
    p50 = frame["p50_ms"].to_numpy(dtype=float) / 1000
    p95 = np.maximum(frame["p95_ms"].to_numpy(dtype=float) / 1000, p50)
    sigma = np.maximum(np.log(p95 / p50) / gpu_ladders.Z95, 0.02)
    mean = np.where(served > 0, np.exp(np.log(p50) + sigma**2 / 2), 0.0)
    pod = f"{TARGETS[name]}-0"

    def s(values: np.ndarray) -> Series:
        return Series(np.asarray(values, dtype=float), START, 1)

    # Histogram counters are cumulative: what a scrape at each second shows.
    return (pod, s(served), s(np.cumsum(served * np.nan_to_num(mean))), s(np.cumsum(served)),
            s(frame["mean_batch"].to_numpy(dtype=float)))


def _backfilled(prometheus_factory: object, name: str, up_to: float | None = None) -> PrometheusServer:
    """A Prometheus holding one ladder (a counter family is one series split over its pods)."""
    labels = {"namespace": "lab"}
    pod, served, latency_sum, latency_count, running = _exported(name, up_to)
    gauges = [GaugeFamily(metric, [({**labels, "pod": pod}, series)]) for metric, series in (
        ("vllm:e2e_request_latency_seconds_sum", latency_sum),
        ("vllm:e2e_request_latency_seconds_count", latency_count), ("vllm:num_requests_running", running))]
    counters = [CounterFamily("vllm:request_success_total", served, (pod,), labels=labels, reset_every=None)]
    return prometheus_factory(counters=counters, gauges=gauges, sample_step=1)  # type: ignore[operator, no-any-return]


@pytest.fixture(scope="module")
def servers(prometheus_factory: object) -> dict[str, PrometheusServer]:
    return {name: _backfilled(prometheus_factory, name) for name in TARGETS}


def _learn(server: PrometheusServer, name: str) -> dict[str, object]:
    spec = ScalerSpec.from_dict({"target": {"name": TARGETS[name]}, "demand": {"kind": "requests", "preset": "vllm"},
                                 "capacity": {"requestsPerReplica": 1, "learned": "serve",
                                              "slo": {"noWaiting": True, "windowSeconds": 15, "historyHours": 1}}})
    end = (START + timedelta(minutes=10)).to_pydatetime()
    notes: list[str] = []
    got = _learned_capacity(ScalerTarget("lab", TARGETS[name], spec),
                            PrometheusHistory(PrometheusSource(server.url, retries=0, timeout=20)), end, notes)
    assert got is not None, notes
    return got


@pytest.mark.parametrize("name", gpu_ladders.SATURATED)
def test_saturated_ladders_give_their_plateau(servers: dict[str, PrometheusServer], name: str) -> None:
    got = _learn(servers[name], name)
    plateau = gpu_ladders.plateau(name)
    assert plateau is not None
    assert got["kind"] == "point", got["explanation"]
    assert abs(float(got["value"]) / plateau - 1) <= 0.20, (got, plateau)  # type: ignore[arg-type]


def test_encoder_serial_is_a_lower_bound(servers: dict[str, PrometheusServer]) -> None:
    got = _learn(servers["encoder-serial"], "encoder-serial")
    highest = gpu_ladders.highest_served("encoder-serial")
    assert got["kind"] == "lower-bound", got["explanation"]
    assert 0 < float(got["value"]) <= 2 * highest  # type: ignore[arg-type]


def test_serving_a_learned_capacity_is_guarded() -> None:
    point = {"kind": "point", "value": 500.0}
    assert serve_learned_capacity(100.0, point, floor=50.0)[0] == 200.0  # at most ×2 per retrain
    assert serve_learned_capacity(100.0, {"kind": "point", "value": 10.0}, floor=50.0)[0] == 50.0  # ÷2
    low = {"kind": "lower-bound", "value": 20.0}
    assert serve_learned_capacity(60.0, low, floor=50.0)[0] == 50.0  # never below the floor from a bound
    assert serve_learned_capacity(60.0, {"kind": "lower-bound", "value": 90.0}, floor=50.0)[0] == 90.0


@pytest.mark.parametrize("name", gpu_ladders.SATURATED)
def test_below_thirty_percent_of_the_plateau_it_is_a_lower_bound(prometheus_factory: object, name: str) -> None:
    plateau = gpu_ladders.plateau(name)
    assert plateau is not None
    cut = 0.3 * plateau
    got = _learn(_backfilled(prometheus_factory, name, up_to=cut), name)
    frame = gpu_ladders.rows(name)
    seen = frame["served"].to_numpy(dtype=float)[: int(np.argmax(frame["offered_rate"].to_numpy() > cut))]
    assert got["kind"] == "lower-bound", got["explanation"]
    value = float(got["value"])  # type: ignore[arg-type]
    # The most it served in a window (a 15-s mean: at most the busiest second, at least most of the cut),
    # never the plateau it never reached.
    assert 0.5 * cut <= value <= min(plateau, seen.max()), (value, cut, plateau)
    assert "the knee was not observed" in str(got["explanation"]), got["explanation"]
