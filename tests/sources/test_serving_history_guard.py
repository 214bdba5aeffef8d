"""The controller's serving history (``PrometheusMetricsPort.serving_history``) from a real Prometheus, and the
dcgm-busy-gpus guard (``GuardedDemand``) on it.

Each H200 decoder ladder (backtests/telemetry/, benchmarks/gpu_ladders.py) is backfilled as one vLLM pod's own
series — the served counter, the latency histogram's ``_sum``/``_count``, the running batch — and as DCGM's
``DCGM_FI_DEV_GPU_UTIL`` for that pod's GPU (labels ``namespace``, ``pod``, as sources/dcgm.py selects them).
The ladder lasts two minutes and the port pulls on the model grid (at least 60 s), so the ladder is slowed
``HOLD`` times (each second held ``HOLD`` seconds): a 60-s rate window then sees what a 15-s one sees on the
real ladder. DCGM's utilisation gauge is read as benchmarks/gpu_ladders.py reads it, averaged over that window
(a one-second reading held for a whole step would be noise: the serial decoder reads 0 % and 97 % in
alternate seconds at a third of its load). The batching decoder reads 97 % busy from a tenth of its capacity,
so the guard withholds its reading; the serial decoder's utilisation tracks its load, so the reading passes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from benchmarks import gpu_ladders
from predictive_scaler.controller.demand_guard import GuardedDemand
from predictive_scaler.controller.ports import PrometheusMetricsPort
from predictive_scaler.core.values import DemandSample
from predictive_scaler.errors import SourceError
from predictive_scaler.series import Series
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.history import PrometheusMetrics
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.openmetrics import CounterFamily, GaugeFamily
from tests.support.prometheus import PrometheusServer

START = pd.Timestamp("2025-05-05T00:00:00Z")
NS = "lab"
#: Seconds each one-second row of the ladder is held for (one sample each); the real seconds a 60-s window sees.
HOLD = 4
STEP = HOLD
WINDOW_ROWS = 60 // HOLD
LADDERS = {"decoder-batched": "decbatched", "decoder-serial": "decserial"}


def _held(values: np.ndarray) -> np.ndarray:
    return np.repeat(np.asarray(values, dtype=float), HOLD // STEP)


def _window_mean(values: np.ndarray) -> np.ndarray:
    return pd.Series(np.asarray(values, dtype=float)).rolling(WINDOW_ROWS, min_periods=1).mean().to_numpy()


def _families(name: str) -> tuple[list[CounterFamily], list[GaugeFamily]]:
    frame = gpu_ladders.rows(name)
    served = _held(frame["served"].to_numpy())
    p50 = _held(frame["p50_ms"].to_numpy()) / 1000
    p95 = np.maximum(_held(frame["p95_ms"].to_numpy()) / 1000, p50)
    sigma = np.maximum(np.log(p95 / p50) / gpu_ladders.Z95, 0.02)
    mean = np.where(served > 0, np.exp(np.log(p50) + sigma**2 / 2), 0.0)  # a log-normal through p50 and p95
    pod = f"{LADDERS[name]}-0"
    labels = {"namespace": NS, "pod": pod}

    def s(values: np.ndarray) -> Series:
        return Series(np.asarray(values, dtype=float), START, STEP)

    # Histogram _sum/_count are cumulative: what a scrape at each step shows.
    gauges = [GaugeFamily(metric, [(labels, series)]) for metric, series in (
        ("vllm:e2e_request_latency_seconds_sum", s(np.cumsum(served * np.nan_to_num(mean) * STEP))),
        ("vllm:e2e_request_latency_seconds_count", s(np.cumsum(served * STEP))),
        ("vllm:num_requests_running", s(_held(frame["mean_batch"].to_numpy()))),
        (dcgm.GPU_UTIL, s(_held(_window_mean(frame["gpu_util"].to_numpy())))))]
    counters = [CounterFamily("vllm:request_success_total", s(served), (pod,), labels={"namespace": NS},
                              reset_every=None)]
    return counters, gauges


@pytest.fixture(scope="module")
def servers(prometheus_factory: object) -> dict[str, PrometheusServer]:
    out = {}
    for name in LADDERS:
        counters, gauges = _families(name)
        out[name] = prometheus_factory(counters=counters, gauges=gauges, sample_step=STEP)  # type: ignore[operator]
    return out


class _Busy:
    """The busy-GPU reading the guard stands in front of (its value does not matter here)."""

    def demand_now(self, now: datetime) -> DemandSample:
        return DemandSample(0.9, now)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        raise SourceError("not used")


def _port(server: PrometheusServer, name: str) -> PrometheusMetricsPort:
    spec = ScalerSpec.from_dict({"target": {"name": LADDERS[name]}, "demand": {"kind": "dcgm-busy-gpus", "preset": "vllm"},
                                 "model": {"stepSeconds": 60}})
    source = PrometheusSource(server.url, retries=0, timeout=20)
    return PrometheusMetricsPort(PrometheusMetrics(source, "vector(0)"), source=source, spec=spec, namespace=NS)


def _end(name: str) -> datetime:
    return (START + timedelta(seconds=len(gpu_ladders.rows(name)) * HOLD)).to_pydatetime()


@pytest.mark.parametrize("name", list(LADDERS))
def test_the_serving_history_is_the_ladder(servers: dict[str, PrometheusServer], name: str) -> None:
    history = _port(servers[name], name).serving_history(_end(name), timedelta(hours=1))
    assert history.throughput.step_seconds == 60
    seen = np.isfinite(history.throughput.values) & np.isfinite(history.utilisation.values)
    assert seen.sum() >= 0.8 * len(gpu_ladders.rows(name)) * HOLD / 60, seen.sum()
    top = gpu_ladders.highest_served(name)
    assert 0.5 * top <= np.nanmax(history.throughput.values) <= 1.05 * top
    assert np.nanmax(history.utilisation.values) <= 100 and np.nanmin(history.gpus.values) == 1


def test_the_batching_decoder_fires_the_guard(servers: dict[str, PrometheusServer]) -> None:
    guard = GuardedDemand(_Busy(), _port(servers["decoder-batched"], "decoder-batched"))
    with pytest.raises(SourceError, match="demand signal saturated: GPU utilisation is pinned"):
        guard.demand_now(_end("decoder-batched"))
    assert guard.last is not None and guard.last.verdict == "pinned", guard.last


def test_the_serial_decoder_does_not(servers: dict[str, PrometheusServer]) -> None:
    guard = GuardedDemand(_Busy(), _port(servers["decoder-serial"], "decoder-serial"))
    assert guard.demand_now(_end("decoder-serial")).value == 0.9
    assert guard.last is not None and guard.last.verdict == "tracks-load", guard.last
