"""Prophet + residual ARIMA: structure learned, fast evaluation equals Prophet.predict, JSON round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.prophet import (
    ProphetForecaster,
    ProphetModel,
    ProphetSettings,
    _curve_from_prophet,
)
from predictive_scaler.series import Series

STEP = 900  # 15 min keeps the Stan fit well under a second on a shared core
DAYS = 17
PER_DAY = 86400 // STEP


def synthetic(days: int = DAYS, *, seed: int = 7, level: float = 200.0) -> Series:
    """Daily peak ×3, weekend ×0.6, multiplicative log-normal noise (sd 0.05)."""
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2024-01-01T00:00:00Z")  # a Monday
    n = days * PER_DAY
    t = np.arange(n) * STEP
    hours = (t % 86400) / 3600
    weekday = ((t // 86400) % 7).astype(int)
    daily = np.exp(np.log(3.0) * np.exp(-((hours - 14) ** 2) / 18))
    weekly = np.where(weekday >= 5, 0.6, 1.0)
    values = level * daily * weekly * np.exp(rng.normal(0, 0.05, n))
    return Series(values=values, start=start, step_seconds=STEP, name="synthetic")


@pytest.fixture(scope="module")
def series() -> Series:
    return synthetic()


@pytest.fixture(scope="module")
def train(series: Series) -> Series:
    return series.slice(0, 14 * PER_DAY)


@pytest.fixture(scope="module")
def model(train: Series) -> ProphetModel:
    return ProphetForecaster(level_bands=3).fit(train)  # exercise the banded error table


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_evaluation_matches_prophet_predict(train: Series) -> None:
    from prophet import Prophet

    frame = pd.DataFrame({"ds": train.timestamps().tz_localize(None), "y": np.log1p(train.values)})
    prophet = Prophet(changepoint_prior_scale=0.001, yearly_seasonality=False, weekly_seasonality=5,
                      daily_seasonality=10, uncertainty_samples=0).fit(frame)
    # History and two days beyond it (past the last changepoint, where extrapolation happens).
    when = pd.date_range(frame["ds"].iloc[0], periods=16 * PER_DAY, freq=f"{STEP}s")
    expected = prophet.predict(pd.DataFrame({"ds": when}))["yhat"].to_numpy()
    got = _curve_from_prophet(prophet).evaluate(when.as_unit("ns").asi8 / 1e9)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def test_learns_daily_and_weekly_shape(model: ProphetModel, series: Series) -> None:
    day = series.slice(14 * PER_DAY, 15 * PER_DAY)  # the Monday after training, unseen
    curve = np.expm1(model.seasonal_curve(day.timestamps()))
    mape = np.mean(np.abs(curve - day.values) / day.values)
    assert mape < 0.12
    # Peak near 14:00, trough at night, as generated.
    peak_hour = day.timestamps()[int(np.argmax(curve))].hour
    assert 12 <= peak_hour <= 16
    weekend = series.slice(12 * PER_DAY, 13 * PER_DAY)  # a Saturday
    assert np.expm1(model.seasonal_curve(weekend.timestamps())).mean() < 0.75 * curve.mean()


def test_forecast_quantiles_ordered_finite_and_covering(model: ProphetModel, series: Series) -> None:
    hits, total = 0, 0
    for i in range(14 * PER_DAY, 17 * PER_DAY - 2):
        f = model.forecast(series.slice(i - 96, i), 2, (0.05, 0.5, 0.95))
        assert np.isfinite(f.values).all()
        assert (np.diff(f.values, axis=0) >= 0).all()
        assert f.issued_at == series.start + pd.Timedelta(seconds=STEP * (i - 1))
        hits += int(series.values[i + 1] <= f.quantile(0.95)[1])
        total += 1
    # In-sample error quantiles on an unchanged process: close to nominal (calibration is A's job).
    assert 0.88 <= hits / total <= 0.995


def test_correction_follows_a_level_shift(model: ProphetModel, series: Series) -> None:
    recent = series.slice(14 * PER_DAY - 96, 14 * PER_DAY)
    shifted = Series(values=recent.values * 2.0, start=recent.start, step_seconds=STEP)
    base = model.forecast(recent, 2, (0.5,)).values[0, 0]
    moved = model.forecast(shifted, 2, (0.5,)).values[0, 0]
    # Prophet alone would not move at all; the residual model carries most of the doubling.
    assert moved / base > 1.6


@pytest.mark.parametrize(
    "mask",
    [slice(-3, None), slice(-40, -20), slice(0, None)],
    ids=["trailing-gap", "inner-gap", "all-missing"],
)
def test_gaps_are_tolerated(model: ProphetModel, series: Series, mask: slice) -> None:
    recent = series.slice(14 * PER_DAY - 96, 14 * PER_DAY)
    values = recent.values.copy()
    values[mask] = np.nan
    f = model.forecast(Series(values=values, start=recent.start, step_seconds=STEP), 4, (0.5, 0.95))
    assert np.isfinite(f.values).all() and (f.values[1] >= f.values[0]).all()
    assert (f.values[0] > 0).all()


def test_json_round_trip_gives_identical_forecasts(model: ProphetModel, series: Series) -> None:
    text = json.dumps(model.to_params(), allow_nan=False)
    again = ProphetModel.from_params(json.loads(text))
    recent = series.slice(14 * PER_DAY - 96, 14 * PER_DAY + 5)
    a = model.forecast(recent, 8, (0.5, 0.9, 0.95))
    b = again.forecast(recent, 8, (0.5, 0.9, 0.95))
    np.testing.assert_array_equal(a.values, b.values)
    assert again.to_params() == model.to_params()


def test_finer_recent_data_is_resampled_to_the_model_step(model: ProphetModel, series: Series) -> None:
    recent = series.slice(14 * PER_DAY - 96, 14 * PER_DAY)
    fine = recent.resample(STEP // 3)
    np.testing.assert_allclose(model.forecast(fine, 3, (0.5,)).values, model.forecast(recent, 3, (0.5,)).values)


def _broken(params: dict, path: tuple, value: object) -> dict:
    p = json.loads(json.dumps(params))
    node = p
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return p


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("phi",), math.nan, "'phi' must be a finite number"),
        (("phi",), 1.5, "phi and theta must lie in"),
        (("curve", "k"), math.inf, "'k' must be a finite number"),
        (("curve", "deltas"), [0.1], "changepoints but 1 deltas"),
        (("curve", "y_scale"), -1.0, "'y_scale' must be positive"),
        (("curve", "seasonalities", 0, "betas"), [0.0], "needs 10 betas"),
        (("error_quantiles",), [[0.0, 1.0]], "must be \\[band\\]\\[horizon step\\]\\[probability\\]"),
        (("error_quantiles", 0, 0, 0), math.nan, "must hold finite numbers"),
        (("level_edges",), [2.0, 1.0], "'level_edges' must be increasing"),
        (("step_seconds",), "300", "step_seconds must be a positive integer"),
        (("transform",), "log", "unknown transform"),
    ],
    ids=["nan-phi", "explosive-phi", "inf-k", "delta-count", "negative-scale", "beta-count",
         "error-table-shape", "error-table-nan", "edges-order", "step-type", "transform"],
)
def test_from_params_refuses_invalid(model: ProphetModel, path: tuple, value: object, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        ProphetModel.from_params(_broken(model.to_params(), path, value))


def test_too_little_history_is_refused() -> None:
    short = synthetic(days=1)
    with pytest.raises(ModelError, match="at least two days"):
        ProphetForecaster().fit(short)


@pytest.mark.parametrize(
    "options",
    [{"changepoint_prior_scale": 0.0}, {"daily_order": 0}, {"warmup_steps": 0}, {"level_bands": 0}],
    ids=["prior", "order", "warmup", "bands"],
)
def test_settings_validated_eagerly(options: dict) -> None:
    with pytest.raises(ModelError):
        ProphetSettings(**options)


def test_walk_forward_is_exactly_what_serving_does(model: ProphetModel, series: Series) -> None:
    values = series.values.copy()
    values[14 * PER_DAY + 10: 14 * PER_DAY + 14] = np.nan  # a gap inside some windows
    gappy = Series(values=values, start=series.start, step_seconds=STEP)
    origins = np.array([5, 14 * PER_DAY, 14 * PER_DAY + 12, 14 * PER_DAY + 30, len(series) - 1])
    batch = model.walk_forward(gappy, origins, 4, (0.5, 0.95))
    assert batch.shape == (origins.size, 2, 4)
    for row, t in zip(batch, origins, strict=True):
        served = model.forecast(gappy.slice(0, int(t) + 1), 4, (0.5, 0.95))
        np.testing.assert_allclose(row, served.values, rtol=1e-12)
    assert model.window_steps == model.max_gap_steps + model.warmup_steps


def test_walk_forward_refuses_origins_outside_the_series(model: ProphetModel, series: Series) -> None:
    with pytest.raises(ModelError, match="origins must be indices"):
        model.walk_forward(series, np.array([len(series)]), 2, (0.5,))


def test_banded_errors_agree_when_noise_does_not_depend_on_level(model: ProphetModel) -> None:
    """Log-scale noise is the same at every level here, so bands must agree within sampling noise."""
    assert len(model.level_edges) == 2 and model.error_quantiles.shape[0] == 3
    width = model.error_quantiles[:, 0, -3] - model.error_quantiles[:, 0, 2]  # ~P99.5 − P0.5 at h=1
    assert width.max() / width.min() < 1.5


def test_the_data_handed_to_cmdstan_as_arrays_writes_the_same_json(train: Series, monkeypatch) -> None:
    from prophet.models import CmdStanPyBackend
    from stanio.json import dump_stan_json

    from predictive_scaler.forecasting.prophet import arrays_for_stan

    seen: list[tuple[str, str]] = []
    original = CmdStanPyBackend.prepare_data

    def spy(init, data):
        as_lists = original(init, data)
        as_arrays = arrays_for_stan(original)(init, data)
        seen.extend((dump_stan_json(a), dump_stan_json(b)) for a, b in zip(as_lists, as_arrays, strict=True))
        assert isinstance(as_arrays[1]["X"], np.ndarray)  # the vectorised path is the one taken
        return as_lists

    monkeypatch.setattr(CmdStanPyBackend, "prepare_data", staticmethod(spy))
    ProphetForecaster().fit(train)
    assert len(seen) == 2  # the inits and the data
    for lists, arrays in seen:
        assert lists == arrays
