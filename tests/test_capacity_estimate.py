"""Capacity from DCGM (known capacity recovered from synthetic pairs, saturation excluded) and idle GPUs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.capacity_estimate import estimate_capacity, summarise_idle
from predictive_scaler.errors import DataError
from predictive_scaler.series import Series
from tests.support.standins import gpu_service_day

STEP = 300
START = pd.Timestamp("2026-01-05", tz="UTC")


def series(values: np.ndarray, start: pd.Timestamp = START) -> Series:
    return Series(values=np.asarray(values, dtype=float), start=start, step_seconds=STEP)


def paired(per_gpu: float, gpus: int, *, days: float = 3, noise: float = 0.05, peak: float = 1.0,
           seed: int = 0) -> tuple[Series, Series, Series]:
    """Requests/s and the DCGM view of ``gpus`` GPUs that each serve ``per_gpu`` req/s at 100 %.

    ``peak`` is the load at the daily peak relative to the fleet's full capacity (> 1 saturates).
    """
    rng = np.random.default_rng(seed)
    n = int(days * 86400 / STEP)
    t = np.arange(n)
    load = peak * (0.55 + 0.45 * np.sin(2 * np.pi * t / 288))  # fraction of full capacity
    # Both signals measure the same load with their own noise (request counting, duty-cycle sampling).
    requests = load * per_gpu * gpus * (1 + noise * rng.standard_normal(n))
    util = np.clip(load * 100 * (1 + noise * rng.standard_normal(n)), 0, 100)
    busy = util / 100 * gpus
    return series(requests), series(busy), series(util)


@pytest.mark.parametrize(("per_gpu", "gpus", "peak", "target", "per_replica_gpus"), [
    (40.0, 4, 0.8, 0.7, 1),
    (12.5, 8, 1.6, 0.6, 2),  # daily peaks saturate at 100 %: those steps must be left out
    (300.0, 1, 1.0, 0.8, 1),
], ids=["unsaturated", "saturating-peaks", "single-gpu"])
def test_known_capacity_is_recovered_within_its_interval(
        per_gpu: float, gpus: int, peak: float, target: float, per_replica_gpus: int) -> None:
    requests, busy, util = paired(per_gpu, gpus, peak=peak)
    est = estimate_capacity(requests, busy, mean_utilisation=util, utilization_target=target,
                            gpus_per_replica=per_replica_gpus)
    truth = per_gpu * target * per_replica_gpus
    assert est.low <= est.requests_per_replica <= est.high
    assert est.requests_per_replica == pytest.approx(truth, rel=0.03)
    assert 0 < est.relative_uncertainty < 0.1
    if peak > 1:
        assert est.steps_saturated > 0


def test_the_interval_covers_the_true_capacity_about_as_often_as_it_says() -> None:
    truth = 40.0 * 0.7
    inside = [est.low <= truth <= est.high
              for est in (estimate_capacity(*paired(40.0, 4, peak=0.8, seed=seed)[:2], utilization_target=0.7,
                                            seed=seed) for seed in range(30))]
    assert 0.7 <= np.mean(inside) <= 1.0  # nominal 90 %


def test_saturated_steps_would_bias_the_estimate_upwards() -> None:
    """Why they are excluded: at 100 % the requests keep coming but utilisation cannot rise."""
    requests, busy, util = paired(20.0, 4, peak=2.0)
    fooled = estimate_capacity(requests, busy, mean_utilisation=util, utilization_target=0.7,
                               saturation_percent=101.0)  # nothing counts as saturated
    right = estimate_capacity(requests, busy, mean_utilisation=util, utilization_target=0.7)
    assert fooled.requests_per_replica > 1.15 * right.requests_per_replica
    assert right.requests_per_replica == pytest.approx(20.0 * 0.7, rel=0.03)


def test_noisier_pairs_give_a_wider_interval() -> None:
    quiet = estimate_capacity(*paired(40.0, 4, noise=0.02)[:2], utilization_target=0.7)
    noisy = estimate_capacity(*paired(40.0, 4, noise=0.2)[:2], utilization_target=0.7)
    assert noisy.high - noisy.low > 2 * (quiet.high - quiet.low)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r, b, u: (r, b, series(np.full(len(u), 100.0))), "unsaturated steps"),
    (lambda r, b, u: (r, series(np.full(len(b), np.nan)), u), "unsaturated steps"),
    (lambda r, b, u: (r, series(b.values, START + pd.Timedelta(days=30)), None), "do not overlap"),
], ids=["always-saturated", "no-dcgm-data", "no-overlap"])
def test_unusable_pairs_are_refused_with_the_reason(mutate, message: str) -> None:  # noqa: ANN001
    r, b, u = mutate(*paired(40.0, 4))
    with pytest.raises(DataError, match=message):
        estimate_capacity(r, b, mean_utilisation=u, utilization_target=0.7)


def test_the_real_one_day_pairing_gives_a_finite_estimate() -> None:
    """The Alibaba GenAI shape (not redistributable, so a generated stand-in): gateway QPS (10 min)
    with mean GPU duty cycle and busy pods (1 min)."""
    qps, util_1m, pods_1m = gpu_service_day()
    util = util_1m.resample(qps.step_seconds)
    pods = pods_1m.resample(qps.step_seconds)
    busy = Series(values=util.values / 100 * pods.values, start=util.start, step_seconds=util.step_seconds)
    est = estimate_capacity(qps, busy, mean_utilisation=util, utilization_target=0.7, min_steps=24)
    assert np.isfinite(est.requests_per_replica) and est.low < est.requests_per_replica < est.high
    assert est.steps_used >= 24


@pytest.mark.parametrize(("idle", "price", "mean", "cost"), [
    ([2.0] * 288, 2.5, 2.0, 2.0 * 24 * 2.5),
    ([0.0] * 144 + [4.0] * 144, 1.0, 2.0, 48.0),
    ([np.nan] * 144 + [1.0] * 144, None, 1.0, None),  # steps with no report are not counted as idle
], ids=["constant", "half-day-idle", "partly-unreported-no-price"])
def test_idle_gpu_cost_per_day(idle: list[float], price: float | None, mean: float, cost: float | None) -> None:
    out = summarise_idle(series(np.array(idle)), price_per_gpu_hour=price, currency="EUR")
    assert out.mean == pytest.approx(mean)
    assert out.idle_gpu_hours_per_day == pytest.approx(mean * 24)
    assert out.cost_per_day == (pytest.approx(cost) if cost is not None else None)
    assert out.now == pytest.approx(idle[-1])


def test_no_dcgm_report_at_all_is_an_error_not_zero_waste() -> None:
    with pytest.raises(DataError, match="no DCGM"):
        summarise_idle(series(np.full(10, np.nan)))


def test_requests_per_busy_gpu_is_wrong_where_utilisation_does_not_track_load() -> None:
    """The bundled H200 ladders (backtests/telemetry/): on the continuous-batching decoder utilisation reads
    ~97 % at a tenth of capacity, on the CPU-bound serial encoder it misses the load. The ratio is 16× too
    low on one and 7× too high on the other; policy/slo_capacity.py is what to use there."""
    from benchmarks.gpu_ladders import highest_served, plateau, rows

    def ratio(name: str) -> float:
        frame = rows(name)
        frame = frame[frame["mode"] != "idle"]
        util = frame["gpu_util"].to_numpy(dtype=float)
        s = [Series(np.asarray(v, dtype=float), START, 1) for v in (frame["served"], util / 100, util)]
        return estimate_capacity(s[0], s[1], mean_utilisation=s[2], utilization_target=1.0,
                                 min_steps=2).requests_per_replica

    truth = plateau("decoder-batched")
    assert truth is not None
    assert ratio("decoder-batched") < 0.1 * truth
    assert ratio("encoder-serial") > 5 * highest_served("encoder-serial")
