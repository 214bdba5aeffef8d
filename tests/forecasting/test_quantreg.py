"""The quantile-regression candidate on synthetic series with known structure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.metrics import coverage, pinball
from predictive_scaler.forecasting.quantreg import (
    QuantileRegressionForecaster,
    QuantileRegressionModel,
    penalty_for,
    width_features,
)
from predictive_scaler.forecasting.walkforward import walk_forward
from predictive_scaler.series import Series

from .conftest import START, make_daily

DAY = 288  # steps per day at 5 minutes
H = 6  # 30 minutes


def bursty(days: float = 16, seed: int = 5) -> Series:
    """A daily cycle whose noise switches between calm and bursty regimes lasting hours."""
    rng = np.random.default_rng(seed)
    n = int(days * DAY)
    t = np.arange(n) / DAY
    regime = np.repeat(rng.random(n // 24 + 1) < 0.3, 24)[:n]  # 2-hour regimes, 30 % bursty
    sd = np.where(regime, 0.35, 0.04)
    ar = np.zeros(n)
    for i in range(1, n):
        ar[i] = 0.7 * ar[i - 1] + rng.normal(0.0, sd[i])
    return Series(values=200 * np.exp(0.6 * np.sin(2 * np.pi * t) + ar), start=START, step_seconds=300,
                  name="bursty")


@pytest.fixture(scope="module")
def data() -> dict[str, Series]:
    return {"bursty": bursty(), "daily": make_daily(days=16, seed=3, noise=0.1)}


@pytest.fixture(scope="module")
def fitted(data) -> dict[str, QuantileRegressionModel]:
    return {name: QuantileRegressionForecaster().fit(s.slice(0, 10 * DAY)) for name, s in data.items()}


def _scored(model, series: Series, q: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """(actual, forecast) at H steps ahead for every origin of days 10..16 (out of sample)."""
    origins = np.arange(10 * DAY, len(series) - H)
    fc = walk_forward(model, series, origins, H, (0.5, q))
    return series.values[origins + H], fc[:, 1, H - 1]


@pytest.mark.parametrize("name", ["bursty", "daily"], ids=["heteroscedastic", "homoscedastic"])
def test_beats_persistence_at_the_p95_out_of_sample(name, data, fitted):
    series = data[name]
    persistence = registry.forecaster("persistence").fit(series.slice(0, 10 * DAY))
    ours = pinball(*_scored(fitted[name], series), 0.95)
    theirs = pinball(*_scored(persistence, series), 0.95)
    assert ours is not None and theirs is not None
    assert ours < 0.9 * theirs, (ours, theirs)


@pytest.mark.parametrize("name", ["bursty", "daily"], ids=["heteroscedastic", "homoscedastic"])
def test_fitted_p95_covers_about_95_percent_out_of_sample(name, data, fitted):
    cov = coverage(*_scored(fitted[name], data[name]))
    assert cov is not None and 0.92 <= cov <= 0.98, cov


def test_p95_width_follows_the_volatility(data, fitted):
    """Conditional width: the P95's distance above the median is larger in bursty hours."""
    series = data["bursty"]
    origins = np.arange(10 * DAY, len(series) - H)
    fc = walk_forward(fitted["bursty"], series, origins, H, (0.5, 0.95))
    width = np.log(fc[:, 1, -1]) - np.log(fc[:, 0, -1])
    diffs = np.abs(np.diff(np.log(series.values)))
    recent = np.array([diffs[t - 12:t].mean() for t in origins])
    calm, wild = recent < np.quantile(recent, 0.3), recent > np.quantile(recent, 0.7)
    assert width[wild].mean() > 1.5 * width[calm].mean()


@pytest.mark.parametrize(
    "quantiles", [(0.5, 0.95), (0.05, 0.5, 0.8, 0.9, 0.95, 0.975, 0.99), (0.1, 0.3)],
    ids=["fitted", "calibrated-set", "below-median"],
)
def test_quantiles_are_monotone_and_finite(quantiles, data, fitted):
    fc = fitted["bursty"].forecast(data["bursty"].slice(0, 12 * DAY), 12, quantiles)
    assert fc.values.shape == (len(quantiles), 12)
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values >= 0)
    assert np.all(np.diff(fc.values, axis=0) >= 0)
    assert fc.model == "quantile-regression"


def test_params_round_trip_through_json_gives_identical_forecasts(data, fitted):
    model = fitted["daily"]
    rebuilt = registry.model_from_params("quantile-regression", json.loads(json.dumps(model.to_params())))
    assert rebuilt == model
    recent = data["daily"].slice(0, 12 * DAY + 7)
    np.testing.assert_array_equal(model.forecast(recent, 12, (0.5, 0.95)).values,
                                  rebuilt.forecast(recent, 12, (0.5, 0.95)).values)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(format=99), "format 99"),
        (lambda p: p.pop("coefs"), "incomplete or malformed"),
        (lambda p: p["coefs"][0][0].__setitem__(0, float("nan")), "non-finite"),
        (lambda p: p["coefs"][0][0].pop(), "do not match"),
        (lambda p: p.update(features=["intercept"]), "features"),
        (lambda p: p.update(levels=[0.9, 0.95]), "levels"),
        (lambda p: p.update(horizons=[2, 1, 3, 4, 6, 8, 12]), "horizons"),
        (lambda p: p.update(log_offset=-1.0), "log offset"),
        (lambda p: p.update(week="yes"), "out of range"),
    ],
    ids=["version", "missing-key", "nan", "short-row", "features", "no-median", "horizon-order", "offset",
         "week-type"],
)
def test_a_bad_artifact_gives_a_clear_model_error(mutate, message, fitted):
    params = json.loads(json.dumps(fitted["daily"].to_params()))
    mutate(params)
    with pytest.raises(ModelError, match=message):
        QuantileRegressionModel.from_params(params)


@pytest.mark.parametrize("horizon", [1, 6, 12], ids=["1-step", "30m", "60m"])
def test_walk_forward_equals_forecast_one_origin_at_a_time(horizon, data, fitted):
    model, series = fitted["daily"], data["daily"]
    origins = np.array([10 * DAY, 10 * DAY + 77, 13 * DAY - 1, 15 * DAY + 5])
    batch = walk_forward(model, series, origins, horizon, (0.5, 0.95))
    for i, t in enumerate(origins):
        one = model.forecast(series.slice(0, int(t) + 1), horizon, (0.5, 0.95)).values
        np.testing.assert_allclose(batch[i], one, rtol=1e-12)


def test_week_lags_only_with_two_weeks_of_history():
    long = make_daily(days=15, seed=1)
    assert QuantileRegressionForecaster().fit(long).week
    assert not QuantileRegressionForecaster().fit(long.slice(0, 10 * DAY)).week


@pytest.mark.parametrize(
    "gaps",
    [((11 * DAY - 30, 11 * DAY),), ((11 * DAY - 3, 11 * DAY - 1),), ((10 * DAY - 200, 10 * DAY + 50),)],
    ids=["last-steps-missing", "short-gap", "day-lag-missing"],
)
def test_gaps_never_crash_nor_pull_the_forecast_to_zero(gaps, data):
    gappy = make_daily(days=16, seed=3, noise=0.1, gaps=((2 * DAY, 2 * DAY + 100), *gaps))
    model = QuantileRegressionForecaster().fit(gappy.slice(0, 10 * DAY + 60))
    recent = gappy.slice(0, 11 * DAY)
    fc = model.forecast(recent, 6, (0.5, 0.95)).values
    last = recent.values[np.isfinite(recent.values)][-1]
    assert np.all(np.isfinite(fc)) and np.all(fc[0] > 0.3 * last)


def test_no_recent_observation_is_an_error_not_a_zero(fitted, data):
    values = data["daily"].values[: 12 * DAY].copy()
    values[-fitted["daily"].window_steps:] = np.nan
    with pytest.raises(ModelError, match="too few observations"):
        fitted["daily"].forecast(Series(values=values, start=START, step_seconds=300), 6, (0.5, 0.95))


@pytest.mark.parametrize("days", [1.5, 5, 6.9], ids=["day-and-a-half", "five-days", "just-under-a-week"])
def test_too_little_history_is_refused(days):
    with pytest.raises(InsufficientHistoryError, match="quantile regression needs at least 7 days"):
        QuantileRegressionForecaster().fit(make_daily(days=days))


def test_a_week_of_history_is_enough():
    assert QuantileRegressionForecaster().fit(make_daily(days=7.05, seed=2)).levels


@pytest.mark.parametrize(
    ("harmonics", "expected"),
    [(0, ("intercept", "max12-last", "volatility")),
     (3, ("intercept", "max12-last", "volatility", "sin1", "cos1"))],
    ids=["no-harmonics", "hour-of-day"],
)
def test_width_features(harmonics, expected):
    assert width_features(harmonics) == expected


def noisy_hour(seed: int, days: float = 21) -> Series:
    """Calm except for three hours a day (12:00–15:00 UTC, from START at midnight) of large noise."""
    rng = np.random.default_rng(seed)
    n = int(days * DAY)
    hour = (np.arange(n) % DAY) / 12
    sd = np.where((hour >= 12) & (hour < 15), 0.4, 0.02)
    return Series(values=100 * np.exp(rng.normal(0.0, sd)), start=START, step_seconds=300, name="noisy-hour")


@pytest.mark.parametrize("seed", [1, 2, 3], ids=["seed-1", "seed-2", "seed-3"])
def test_p95_width_follows_the_hour_of_day_where_recent_volatility_cannot_see_it(seed):
    """Origins in the calm half hour before the noisy hours get a wider P95 at 30 minutes than
    origins as calm (same recent volatility) whose targets are calm: the width is fitted on the
    hour too. Measured: ratio 1.21–1.37 on these seeds; 1.01–1.07 with the width fitted on the
    volatility features alone."""
    series = noisy_hour(seed)
    model = QuantileRegressionForecaster().fit(series.slice(0, 10 * DAY))
    days = np.arange(10, 20) * DAY
    width = {}
    for name, first in (("before", 11 * 12 + 6), ("after", 16 * 12)):  # 11:30–11:55, 16:00–16:25
        origins = (days[:, None] + np.arange(first, first + 6)[None, :]).ravel()
        fc = walk_forward(model, series, origins, H, (0.5, 0.95))
        width[name] = float(np.mean(np.log(fc[:, 1, -1]) - np.log(fc[:, 0, -1])))
    assert width["before"] > 1.12 * width["after"], width


@pytest.mark.parametrize(("week", "expected"), [(False, 0.01), (True, 0.005)], ids=["under-two-weeks", "two-weeks"])
def test_penalty_for_history(week, expected):
    assert penalty_for(week) == expected


@pytest.mark.parametrize(("days", "explicit"), [(15, 0.01), (10, 0.005)], ids=["two-weeks", "ten-days"])
def test_default_penalty_is_the_history_rule(days, explicit):
    """The default fit equals the fit with the rule's penalty given, and differs from the other one."""
    history = make_daily(days=days, seed=4, noise=0.1)
    default = QuantileRegressionForecaster().fit(history)
    same = QuantileRegressionForecaster(penalty=penalty_for(default.week)).fit(history)
    other = QuantileRegressionForecaster(penalty=explicit).fit(history)
    assert default.coefs == same.coefs
    assert default.coefs != other.coefs
