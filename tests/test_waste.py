"""Waste detectors: CPU-bound serving and pinned utilisation on the real H200 ladders, KV-cache pressure
and idle GPUs on synthetic series made here (no bundled telemetry has a KV cache or an idle fleet)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from benchmarks.gpu_ladders import LADDERS, ladder_series
from predictive_scaler import waste
from predictive_scaler.errors import DataError
from predictive_scaler.policy.saturation import ServingHistory
from predictive_scaler.series import Series

PRICE = 3.5  # an H200 GPU-hour, USD, for the figures' currency


def ladder_history(name: str) -> ServingHistory:
    s = ladder_series(name, 15, 5)
    ones = Series(np.ones(len(s.served)), s.served.start, s.served.step_seconds)
    return ServingHistory(throughput=s.served, gpus=ones, utilisation=s.gpu_util, latency=s.mean_latency)


@pytest.mark.parametrize("name", list(LADDERS))
def test_cpu_bound_fires_only_on_the_serial_encoder(name: str) -> None:
    found = waste.cpu_bound(ladder_history(name), price_per_gpu_hour=PRICE)
    assert found.fired == (name == "encoder-serial"), found.message
    if found.fired:
        assert found.gpu_hours > 0 and found.cost == pytest.approx(found.gpu_hours * PRICE)
        # The GPU was mostly idle while requests waited: most of each step's GPU time is counted.
        assert found.gpu_hours > 0.8 * found.steps * 5 / 3600
        assert "CPU-bound" in found.message


@pytest.mark.parametrize("name", list(LADDERS))
def test_saturated_at_low_load_fires_only_on_the_batching_decoder(name: str) -> None:
    found = waste.saturated_at_low_load(ladder_history(name), price_per_gpu_hour=PRICE)
    assert found.fired == (name == "decoder-batched"), found.message
    if found.fired:
        assert "lower bound" in found.message  # no capacity given: the most it served stands in
        # Given the capacity learned at the knee, the unused share is what the ladder shows.
        known = waste.saturated_at_low_load(ladder_history(name), capacity_per_gpu=557.0, price_per_gpu_hour=PRICE)
        assert known.gpu_hours >= found.gpu_hours > 0 and "lower bound" not in known.message


def _grid(values: np.ndarray, step: int = 60) -> Series:
    return Series(np.asarray(values, dtype=float), pd.Timestamp("2026-12-01", tz="UTC"), step)


def test_kv_cache_pressure_on_a_synthetic_day() -> None:
    """Synthetic: 4 GPUs for a day at 1 min; the cache fills to 95 % with 3–12 requests waiting for two hours
    of the evening peak, and fills to 95 % with nobody waiting for another hour (no pressure then)."""
    n = 1440
    kv = np.full(n, 0.55)
    waiting = np.zeros(n)
    kv[1080:1200], waiting[1080:1200] = 0.95, np.linspace(3, 12, 120)  # 18:00–20:00
    kv[600:660] = 0.95  # full, but admission keeps up
    found = waste.kv_cache_pressure(_grid(kv), _grid(waiting), _grid(np.full(n, 4.0)), price_per_gpu_hour=PRICE)
    assert found.fired and found.steps == 120
    assert found.gpu_hours == pytest.approx(4 * 2.0) and found.cost == pytest.approx(8 * PRICE)
    assert "12 waiting" in found.message
    calm = waste.kv_cache_pressure(_grid(np.full(n, 0.5)), _grid(waiting), _grid(np.full(n, 4.0)))
    assert not calm.fired and calm.gpu_hours == 0
    with pytest.raises(DataError, match="share in"):
        waste.kv_cache_pressure(_grid(kv * 100), _grid(waiting), _grid(np.full(n, 4.0)))


def test_idle_gpus_on_a_synthetic_day() -> None:
    """Synthetic: of 8 allocated GPUs, 2 idle all night (00:00–06:00) and none by day; one hour unreported."""
    n = 1440
    idle = np.zeros(n)
    idle[:360] = 2.0
    idle[700:760] = np.nan
    found = waste.idle(_grid(idle), allocated=_grid(np.full(n, 8.0)), price_per_gpu_hour=PRICE)
    observed_h = (n - 60) / 60
    assert found.fired and found.observed_hours == pytest.approx(observed_h)
    assert found.gpu_hours == pytest.approx(2 * 6.0)  # 2 GPUs × 6 h
    assert found.cost == pytest.approx(12 * PRICE) and "of 8 allocated" in found.message
    none = waste.idle(_grid(np.zeros(n)))
    assert not none.fired and none.gpu_hours == 0 and none.cost is None
