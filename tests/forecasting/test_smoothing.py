"""The statsmodels exponential-smoothing candidates, ets and mstl: the model contract on series
with known structure (shape, JSON round trip, serving equals evaluation, no look-ahead)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import calibrate
from predictive_scaler.forecasting.metrics import coverage, mae
from predictive_scaler.forecasting.smoothing import MstlModel
from predictive_scaler.forecasting.walkforward import walk_forward
from predictive_scaler.series import Series

from .conftest import make_daily

KINDS = ("ets", "mstl")
DAY = 288


@pytest.fixture(scope="module")
def series() -> Series:
    return make_daily(days=16, seed=3)


@pytest.fixture(scope="module")
def fitted(series: Series) -> dict[str, object]:
    return {kind: registry.forecaster(kind).fit(series.slice(0, 10 * DAY)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_forecast_shape_order_and_finiteness(kind, fitted, series):
    fc = fitted[kind].forecast(series.slice(0, 11 * DAY), 6, (0.05, 0.5, 0.95))
    assert fc.values.shape == (3, 6) and fc.model == kind
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values >= 0)
    assert np.all(np.diff(fc.values, axis=0) >= 0)


@pytest.mark.parametrize("kind", KINDS)
def test_params_round_trip_through_json_gives_identical_forecasts(kind, fitted, series):
    model = fitted[kind]
    rebuilt = registry.model_from_params(kind, json.loads(json.dumps(model.to_params())))
    recent = series.slice(0, 12 * DAY + 7)
    np.testing.assert_array_equal(model.forecast(recent, 12, (0.5, 0.95)).values,
                                  rebuilt.forecast(recent, 12, (0.5, 0.95)).values)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("history_days", [2, 6])
def test_serving_one_origin_equals_many_origins_over_any_history(kind, history_days, fitted, series):
    """The recursion restarts at an anchor fixed in absolute time: a forecast from the model's own
    window is what a batch over a long history gives (the backtest serves batches)."""
    model = fitted[kind]
    lo, hi = 13 * DAY, 13 * DAY + 100
    start = lo - history_days * DAY
    view = series.slice(start, hi + 1)
    idx = np.arange(lo, hi + 1, 9)
    batch = walk_forward(model, view, idx - start, 6, (0.5, 0.95))
    for row, origin in zip(batch, idx, strict=True):
        single = model.forecast(series.slice(origin + 1 - model.window_steps, origin + 1), 6, (0.5, 0.95)).values
        np.testing.assert_allclose(single, row, rtol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_forecast_reads_nothing_after_its_origin(kind, fitted, series):
    origin = 11 * DAY
    spoiled = series.values.copy()
    spoiled[origin + 1:] *= 50.0
    other = Series(values=spoiled, start=series.start, step_seconds=series.step_seconds)
    idx = np.arange(origin - 20, origin + 1)
    np.testing.assert_allclose(walk_forward(fitted[kind], series, idx, 6, (0.5, 0.95)),
                               walk_forward(fitted[kind], other, idx, 6, (0.5, 0.95)))


def test_mstl_follows_the_daily_cycle_better_than_ets():
    strong = make_daily(days=14, amplitude=1.0, noise=0.03, seed=3)
    models = {k: registry.forecaster(k).fit(strong.slice(0, 10 * DAY)) for k in KINDS}
    idx = np.arange(11 * DAY, 13 * DAY)
    actual = strong.values[idx + 6]
    err = {k: mae(actual, walk_forward(m, strong, idx, 6, (0.5,))[:, 0, 5]) or 0.0 for k, m in models.items()}
    assert 0 < err["mstl"] < 0.85 * err["ets"]


def _periods(days: float) -> tuple[int, ...]:
    model = registry.forecaster("mstl").fit(make_daily(days=days, seed=1))
    assert isinstance(model, MstlModel)
    return model.periods


def test_mstl_fits_a_weekly_season_on_two_weeks():
    assert _periods(15) == (DAY, 7 * DAY)
    assert _periods(10) == (DAY,)
    # Exactly two weeks: MSTL cannot fit a week on two whole weeks, so the day alone.
    assert _periods(14) == (DAY,)


@pytest.mark.parametrize("kind", KINDS)
def test_calibrated_p95_covers_about_95_percent(kind, fitted, series):
    model = calibrate(fitted[kind], series.slice(0, 12 * DAY), 10 * DAY - 1)
    idx = np.arange(12 * DAY, 16 * DAY - 7)
    upper = walk_forward(model, series, idx, 6, (0.95,))[:, 0, 5]
    assert 0.88 <= (coverage(series.values[idx + 6], upper) or 0.0) <= 0.995


@pytest.mark.parametrize("kind", KINDS)
def test_gaps_are_tolerated(kind, fitted):
    gappy = make_daily(days=16, seed=3, gaps=((11 * DAY - 30, 11 * DAY - 5),))
    assert np.all(np.isfinite(fitted[kind].forecast(gappy.slice(0, 11 * DAY), 6, (0.5, 0.95)).values))
    model = registry.forecaster(kind).fit(make_daily(days=5, seed=5, gaps=((2 * DAY, 2 * DAY + 40),)))
    assert np.all(np.isfinite(model.forecast(make_daily(days=5, seed=5), 3, (0.5, 0.95)).values))


@pytest.mark.parametrize(("kind", "days"), [("ets", 0.05), ("mstl", 1.5)])
def test_too_short_history_is_refused(kind, days):
    with pytest.raises(InsufficientHistoryError):
        registry.forecaster(kind).fit(make_daily(days=days))


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [
        ("ets", lambda p: p.update(alpha=float("nan"))),
        ("ets", lambda p: p.pop("phi")),
        ("mstl", lambda p: p.update(profiles=[[0.0, 1.0]])),
        ("mstl", lambda p: p.update(periods=[])),
    ],
    ids=["ets-nan", "ets-missing", "mstl-profile-length", "mstl-no-period"],
)
def test_malformed_params_are_refused(kind, mutate, fitted):
    params = json.loads(json.dumps(fitted[kind].to_params()))
    mutate(params)
    with pytest.raises(ModelError):
        registry.model_from_params(kind, params)
