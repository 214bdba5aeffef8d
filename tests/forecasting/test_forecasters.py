"""Every forecaster of this package on synthetic series with known structure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import calibrate
from predictive_scaler.forecasting.metrics import coverage, mae
from predictive_scaler.forecasting.walkforward import walk_forward

from .conftest import make_daily

KINDS = ("arima", "persistence", "seasonal-naive", "holt-winters", "seasonal-profile")
DAY = 288  # steps per day at 5 minutes


@pytest.fixture(scope="module")
def series():
    return make_daily(days=16, seed=3)


@pytest.fixture(scope="module")
def fitted(series):
    """Each kind fitted on the first 10 days."""
    return {kind: registry.forecaster(kind).fit(series.slice(0, 10 * DAY)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_forecast_shape_order_and_finiteness(kind, fitted, series):
    fc = fitted[kind].forecast(series.slice(0, 11 * DAY), 6, (0.05, 0.5, 0.95))
    assert fc.values.shape == (3, 6)
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values >= 0)
    assert np.all(np.diff(fc.values, axis=0) >= 0)  # quantiles never cross
    assert fc.issued_at == series.slice(0, 11 * DAY).last_time
    assert fc.model == kind


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_params_round_trip_through_json_gives_identical_forecasts(kind, fitted, series):
    model = fitted[kind]
    rebuilt = registry.model_from_params(kind, json.loads(json.dumps(model.to_params())))
    recent = series.slice(0, 12 * DAY + 7)
    a = model.forecast(recent, 12, (0.5, 0.95)).values
    b = rebuilt.forecast(recent, 12, (0.5, 0.95)).values
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kind", "rtol"),
    # Holt-Winters restarts its state from the stored profile at an anchor fixed in absolute
    # time, so both read the same window: identical numbers.
    [("arima", 1e-3), ("persistence", 1e-9), ("seasonal-naive", 1e-9), ("holt-winters", 1e-12),
     ("seasonal-profile", 1e-12)],
    ids=KINDS,
)
def test_forecast_equals_walk_forward_at_the_same_origin(kind, rtol, fitted, series):
    """Serving (one origin, recent window) and evaluation (many origins) are one code path."""
    model = fitted[kind]
    origin = 12 * DAY + 40
    batch = walk_forward(model, series.slice(0, origin + 1), np.array([origin]), 6, (0.5, 0.95))[0]
    single = model.forecast(series.slice(0, origin + 1), 6, (0.5, 0.95)).values
    np.testing.assert_allclose(single, batch, rtol=rtol)


@pytest.mark.parametrize(
    ("kind", "rtol"),
    [("arima", 1e-6), ("persistence", 0.0), ("seasonal-naive", 0.0), ("holt-winters", 0.0),
     ("seasonal-profile", 0.0)],
    ids=KINDS,
)
@pytest.mark.parametrize("history_days", [3, 6, 12], ids=["3d-before", "6d-before", "12d-before"])
def test_walk_forward_reads_only_the_model_window(kind, rtol, history_days, fitted, series):
    """Many origins over a long history give what a forecast from each origin's own recent window
    gives, however much history the caller handed over (what lets the backtest serve batches)."""
    model = fitted[kind]
    lo, hi = 13 * DAY, 13 * DAY + 150
    view_start = max(0, lo - max(history_days * DAY, model.window_steps))  # never less than the window
    view = series.slice(view_start, hi + 1)
    idx = np.arange(lo, hi + 1, 7)
    batch = walk_forward(model, view, idx - view_start, 6, (0.5, 0.95))
    for row, origin in zip(batch, idx, strict=True):
        recent = series.slice(origin + 1 - model.window_steps, origin + 1)
        single = model.forecast(recent, 6, (0.5, 0.95)).values
        np.testing.assert_allclose(single, np.maximum.accumulate(np.maximum(row, 0.0), axis=0), rtol=rtol, atol=0)


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_forecast_reads_nothing_after_its_origin(kind, fitted, series):
    origin = 11 * DAY
    spoiled = series.values.copy()
    spoiled[origin + 1:] *= 50.0  # a future that would show up in any leaky forecast
    from predictive_scaler.series import Series

    other = Series(values=spoiled, start=series.start, step_seconds=series.step_seconds)
    idx = np.arange(origin - 20, origin + 1)
    a = walk_forward(fitted[kind], series, idx, 6, (0.5, 0.95))
    b = walk_forward(fitted[kind], other, idx, 6, (0.5, 0.95))
    np.testing.assert_allclose(a, b)


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_nan_gaps_are_tolerated(kind, fitted):
    gappy = make_daily(days=16, seed=3, gaps=((11 * DAY - 30, 11 * DAY - 5),))
    fc = fitted[kind].forecast(gappy.slice(0, 11 * DAY), 6, (0.5, 0.95))
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values > 0)


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_fit_tolerates_nan_gaps(kind):
    gappy = make_daily(days=5, seed=5, gaps=((2 * DAY, 2 * DAY + 40), (4 * DAY, 4 * DAY + 3)))
    model = registry.forecaster(kind).fit(gappy)
    assert np.all(np.isfinite(model.forecast(gappy, 3, (0.5, 0.95)).values))


def test_arima_beats_persistence_on_a_daily_cycle(fitted, series):
    idx = np.arange(11 * DAY, 13 * DAY)
    actual = series.values[idx + 6]
    err = {
        kind: mae(actual, walk_forward(fitted[kind], series, idx, 6, (0.5,))[:, 0, 5])
        for kind in ("arima", "persistence")
    }
    assert err["arima"] < err["persistence"]


@pytest.mark.parametrize("kind", KINDS, ids=KINDS)
def test_calibrated_p95_covers_about_95_percent_of_later_data(kind, series):
    """Fit on 8 days, calibrate on days 8–11, measure coverage on days 11–16 (never seen)."""
    base = registry.forecaster(kind).fit(series.slice(0, 8 * DAY))
    model = calibrate(base, series.slice(0, 11 * DAY), 8 * DAY - 1, horizon_steps=6)
    idx = np.arange(11 * DAY, len(series) - 6)
    fc = walk_forward(model, series, idx, 6, (0.5, 0.95))
    cov = coverage(series.values[idx + 6], fc[:, 1, 5])
    assert cov == pytest.approx(0.95, abs=0.03)


def test_seasonal_naive_picks_the_week_when_weeks_differ():
    base = make_daily(days=21, noise=0.02, seed=1)
    weekday = (np.arange(len(base)) // DAY) % 7
    from predictive_scaler.series import Series

    weekly = Series(values=base.values * np.where(weekday >= 5, 0.3, 1.0), start=base.start,
                    step_seconds=300)
    assert registry.forecaster("seasonal-naive").fit(weekly).season_steps == 7 * DAY
    assert registry.forecaster("seasonal-naive").fit(base.slice(0, 10 * DAY)).season_steps == DAY


@pytest.mark.parametrize(
    ("kind", "days"),
    [("arima", 1.5), ("holt-winters", 2), ("seasonal-naive", 0.5)],
    ids=["arima", "holt-winters", "seasonal-naive"],
)
def test_too_short_history_is_refused(kind, days):
    with pytest.raises(InsufficientHistoryError):
        registry.forecaster(kind).fit(make_daily(days=days))


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [
        ("arima", lambda p: p.update(coef=[float("nan")] * len(p["coef"]))),
        ("arima", lambda p: p.update(arima_params=[0.1])),
        ("arima", lambda p: p.pop("t_ref")),
        ("persistence", lambda p: p.update(spread=[[1.0, 2.0]])),
        ("holt-winters", lambda p: p.update(alpha=float("inf"))),
        ("seasonal-naive", lambda p: p.update(season_steps=0)),
    ],
    ids=["arima-nan", "arima-param-count", "arima-missing", "persistence-shape", "hw-inf", "snaive-season"],
)
def test_malformed_params_are_refused(kind, mutate, fitted):
    params = json.loads(json.dumps(fitted[kind].to_params()))
    mutate(params)
    with pytest.raises(ModelError):
        registry.model_from_params(kind, params)


def test_recent_data_at_a_finer_step_is_merged_and_coarser_refused(fitted):
    fine = make_daily(days=11, step_seconds=60, seed=3)
    fc = fitted["arima"].forecast(fine, 6, (0.5, 0.95))
    assert fc.step_seconds == 300
    with pytest.raises(ModelError, match="300s step"):
        fitted["arima"].forecast(make_daily(days=11, step_seconds=900), 6, (0.5,))


def test_persistence_refuses_a_window_without_observations(fitted):
    empty = make_daily(days=11, seed=3, gaps=((0, 11 * DAY),))
    with pytest.raises(ModelError, match="too few observations"):
        fitted["persistence"].forecast(empty, 3, (0.5,))


@pytest.mark.parametrize(
    ("season_days", "days", "fits"),
    [(1, 10, True), (7, 10, False), (7, 15, True)],
    ids=["daily-10d", "weekly-10d-too-short", "weekly-15d"],
)
def test_holt_winters_season_length_needs_two_whole_seasons(season_days, days, fits):
    from predictive_scaler.forecasting.baselines import HoltWintersForecaster

    history = make_daily(days=days, seed=2)
    forecaster = HoltWintersForecaster(season=season_days * 86400)
    if not fits:
        with pytest.raises(InsufficientHistoryError, match=f"{season_days}-day season"):
            forecaster.fit(history)
        return
    model = forecaster.fit(history)
    assert len(model.profile) == season_days * DAY
    assert np.all(np.isfinite(model.forecast(history, 6, (0.5, 0.95)).values))


def _hw_case_grow(y):  # the serving pattern: one more observation each minute
    return [y[:500], y[:501], y[:502], y[:540]]


def _hw_case_shorter(y):  # an earlier end after a later one: the stored pass is cut, not re-run
    return [y[:540], y[:500]]


def _hw_case_corrected(y):  # a late or corrected sample inside what was read: a pass from the anchor
    fixed = y.copy()
    fixed[200] += 0.5
    return [y[:500], fixed[:501]]


def _hw_case_gap_then_data(y):  # nothing observed yet, then observations
    gap = y.copy()
    gap[:300] = np.nan
    return [gap[:250], gap[:400], gap[:401]]


def _hw_case_nan_tail(y):  # a missing newest sample, then it arrives
    tail = y[:501].copy()
    tail[500] = np.nan
    return [tail, np.r_[tail, y[501]], y[:502]]


@pytest.mark.parametrize(
    "requests",
    [_hw_case_grow, _hw_case_shorter, _hw_case_corrected, _hw_case_gap_then_data, _hw_case_nan_tail],
    ids=["grows-by-one", "shorter-after-longer", "corrected-sample", "gap-then-data", "nan-newest-sample"],
)
@pytest.mark.parametrize("capacity", [64, 0], ids=["kept", "nothing-kept"])
def test_continued_holt_winters_pass_is_the_pass_from_the_anchor(requests, capacity):
    """Serving continues the last pass of the recursion instead of re-running the window: every
    answer is bit-identical to a fresh pass over the same values, whatever came before it."""
    from predictive_scaler.forecasting.baselines import _hw_filter, _HWResume

    rng = np.random.default_rng(5)
    steps = np.arange(600)
    y = np.log1p(50 + 20 * np.sin(2 * np.pi * steps / 96) + rng.normal(0, 2, steps.size))
    profile = tuple(0.1 * np.sin(2 * np.pi * np.arange(96) / 96))
    phase = steps % 96
    params = (0.3, 0.01, 0.1, 0.9)
    resume = _HWResume(capacity=capacity)
    for logy in requests(y):
        got = resume.filter(("m", 0), logy, phase[: logy.size], profile, *params)
        want = _hw_filter(logy, phase[: logy.size], profile, *params)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            assert np.array_equal(g, w, equal_nan=True)
    assert len(resume._runs) == min(capacity, 1)


def test_holt_winters_passes_are_kept_per_model_and_anchor_and_bounded():
    """Two models or two anchors never share a pass; the least recently used is forgotten."""
    from predictive_scaler.forecasting.baselines import _hw_filter, _HWResume

    y = np.log1p(np.linspace(10, 20, 300))
    phase = np.arange(300) % 24
    resume = _HWResume(capacity=2)
    a = resume.filter(("a", 0), y, phase, (0.0,) * 24, 0.3, 0.0, 0.1, 0.9)
    b = resume.filter(("b", 0), y, phase, (0.0,) * 24, 0.6, 0.0, 0.1, 0.9)
    assert not np.array_equal(a[0], b[0])
    np.testing.assert_array_equal(b[0], _hw_filter(y, phase, (0.0,) * 24, 0.6, 0.0, 0.1, 0.9)[0])
    resume.filter(("a", 72), y, phase, (0.0,) * 24, 0.3, 0.0, 0.1, 0.9)
    assert list(resume._runs) == [("b", 0), ("a", 72)]
