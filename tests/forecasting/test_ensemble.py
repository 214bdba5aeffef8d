"""The ensemble forecaster: weights learned out of sample, JSON round trip, the usual invariants."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.ensemble import (
    EnsembleForecaster,
    choose_weights,
    combine,
    simplex_grid,
)
from predictive_scaler.forecasting.logscale import to_log
from predictive_scaler.forecasting.walkforward import walk_forward
from predictive_scaler.series import Series

from .conftest import START, make_daily

DAY = 288  # steps per day at 5 minutes


@pytest.fixture(scope="module")
def series():
    return make_daily(days=16, seed=3)


@pytest.fixture(scope="module")
def model(series):
    """The default members on 10 days (too short for the weekly member: it is left out)."""
    return registry.forecaster("ensemble").fit(series.slice(0, 10 * DAY))


def weekly_series(days: int = 24, seed: int = 4) -> Series:
    """A daily cycle whose weekends are much quieter: only a weekly season explains it."""
    base = make_daily(days=days, noise=0.05, seed=seed)
    weekday = (np.arange(len(base)) // DAY) % 7  # START is a Monday
    return Series(values=base.values * np.where(weekday >= 5, 0.25, 1.0), start=START, step_seconds=300)


def random_walk(days: int = 12, seed: int = 7) -> Series:
    """A level that wanders with no season at all: the last value is the best guess."""
    rng = np.random.default_rng(seed)
    values = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.05, days * DAY)))
    return Series(values=values, start=START, step_seconds=300)


def test_forecast_shape_order_and_finiteness(model, series):
    recent = series.slice(0, 11 * DAY)
    fc = model.forecast(recent, 6, (0.05, 0.5, 0.95))
    assert fc.values.shape == (3, 6)
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values >= 0)
    assert np.all(np.diff(fc.values, axis=0) >= 0)
    assert fc.issued_at == recent.last_time and fc.model == "ensemble"


def test_weights_are_non_negative_and_sum_to_one_per_step(model):
    w = np.asarray(model.weights)
    assert w.shape[1] == len(model.members) and np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    assert "holt-winters" in model.member_kinds and "persistence" in model.member_kinds


def test_params_round_trip_through_json_gives_identical_forecasts(model, series):
    params = json.loads(json.dumps(model.to_params()))
    rebuilt = registry.model_from_params("ensemble", params)
    recent = series.slice(0, 12 * DAY + 7)
    np.testing.assert_array_equal(model.forecast(recent, 12, (0.5, 0.95)).values,
                                  rebuilt.forecast(recent, 12, (0.5, 0.95)).values)


def test_forecast_equals_walk_forward_at_the_same_origin(model, series):
    origin = 12 * DAY + 40
    batch = walk_forward(model, series.slice(0, origin + 1), np.array([origin]), 6, (0.5, 0.95))[0]
    single = model.forecast(series.slice(0, origin + 1), 6, (0.5, 0.95)).values
    # Holt-Winters restarts its level at the start of the window it is given (see test_forecasters).
    np.testing.assert_allclose(single, batch, rtol=0.02)


def test_forecast_reads_nothing_after_its_origin(model, series):
    origin = 11 * DAY
    spoiled = series.values.copy()
    spoiled[origin + 1:] *= 50.0
    other = Series(values=spoiled, start=series.start, step_seconds=series.step_seconds)
    idx = np.arange(origin - 20, origin + 1)
    np.testing.assert_allclose(walk_forward(model, series, idx, 6, (0.5, 0.95)),
                               walk_forward(model, other, idx, 6, (0.5, 0.95)))


@pytest.mark.parametrize(
    "gaps",
    [((11 * DAY - 30, 11 * DAY - 5),), ((10 * DAY, 10 * DAY + 100), (11 * DAY - 3, 11 * DAY - 1))],
    ids=["one-gap-before-origin", "two-gaps"],
)
def test_nan_gaps_are_tolerated(model, gaps):
    gappy = make_daily(days=16, seed=3, gaps=gaps)
    fc = model.forecast(gappy.slice(0, 11 * DAY), 6, (0.5, 0.95))
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values > 0)


def test_fit_tolerates_nan_gaps():
    gappy = make_daily(days=6, seed=5, gaps=((2 * DAY, 2 * DAY + 40), (5 * DAY, 5 * DAY + 3)))
    fitted = EnsembleForecaster(members=("holt-winters", "persistence")).fit(gappy)
    assert np.all(np.isfinite(fitted.forecast(gappy, 3, (0.5, 0.95)).values))


@pytest.mark.parametrize(
    ("make", "members", "favoured"),
    [
        (random_walk, ("seasonal-naive", "persistence"), "persistence"),
        (weekly_series, ("holt-winters", "holt-winters-weekly"), "holt-winters-weekly"),
    ],
    ids=["random-walk-favours-persistence", "weekends-favour-the-weekly-season"],
)
def test_weights_follow_the_structure_of_the_series(make, members, favoured):
    fitted = EnsembleForecaster(members=members).fit(make())
    weights = np.asarray(fitted.weights).mean(axis=0)
    assert weights[members.index(favoured)] > 0.5


def test_weekly_member_beats_the_daily_one_on_weekends_out_of_sample():
    s = weekly_series(days=28)
    fitted = EnsembleForecaster(members=("holt-winters", "holt-winters-weekly")).fit(s.slice(0, 21 * DAY))
    assert [m.kind for m in fitted.members] == ["holt-winters", "holt-winters"]
    assert len(fitted.members[1].profile) == 7 * DAY  # type: ignore[attr-defined]
    idx = np.arange(21 * DAY, 28 * DAY - 6)
    ens = walk_forward(fitted, s, idx, 6, (0.5,))[:, 0, 5]
    daily = walk_forward(fitted.members[0], s, idx, 6, (0.5,))[:, 0, 5]
    actual = s.values[idx + 6]
    assert np.nanmean(np.abs(ens - actual)) < np.nanmean(np.abs(daily - actual))


def test_too_short_history_is_refused():
    with pytest.raises(InsufficientHistoryError, match="ensemble needs at least"):
        registry.forecaster("ensemble").fit(make_daily(days=2.5))


@pytest.mark.parametrize(
    ("members", "fragment"),
    [((), "distinct"), (("persistence", "persistence"), "distinct"), (("ensemble",), "plain model kinds")],
    ids=["none", "duplicate", "nested-ensemble"],
)
def test_bad_member_lists_are_refused(members, fragment, series):
    with pytest.raises(ModelError, match=fragment):
        EnsembleForecaster(members=members).fit(series.slice(0, 6 * DAY))


def _mutations():
    def first_member(p, **kv):
        p["members"][0].update(kv)

    return [
        (lambda p: p["weights"][0].__setitem__(0, p["weights"][0][0] + 0.5), "sum to one"),
        (lambda p: p["weights"].__setitem__(0, [1.0]), "do not match"),
        (lambda p: p["spread"][0].__setitem__(3, float("nan")), "non-finite"),
        (lambda p: p.update(log_offset=-1.0), "out of range"),
        (lambda p: first_member(p, kind="calibrated"), "cannot contain"),
        (lambda p: p.pop("members"), "incomplete"),
        (lambda p: p["members"][0]["params"].update(step_seconds=600), "another step"),
    ]


@pytest.mark.parametrize(
    ("mutate", "fragment"), _mutations(),
    ids=["weights-sum", "weights-shape", "spread-nan", "offset", "nested-calibrated", "missing", "member-step"],
)
def test_malformed_params_are_refused(mutate, fragment, model):
    params = json.loads(json.dumps(model.to_params()))
    mutate(params)
    with pytest.raises(ModelError, match=fragment):
        registry.model_from_params("ensemble", params)


def test_simplex_grid_rows_are_weights():
    grid = simplex_grid(3, 4)
    assert grid.shape == (15, 3) and np.all(grid >= 0)
    np.testing.assert_allclose(grid.sum(axis=1), 1.0)
    assert len({tuple(r) for r in grid}) == len(grid)


def test_combine_leaves_out_a_member_without_a_forecast():
    logs = np.array([[[1.0], [3.0]], [[np.nan], [3.0]], [[np.nan], [np.nan]]])  # (n=3, m=2, h=1)
    out = combine(logs, np.array([[0.25, 0.75]]))
    np.testing.assert_allclose(out[:2, 0], [2.5, 3.0])
    assert np.isnan(out[2, 0])


@pytest.mark.parametrize("right", [0, 1, 2], ids=["first", "second", "third"])
def test_choose_weights_puts_everything_on_the_member_that_is_right(right):
    rng = np.random.default_rng(right)
    actual = rng.normal(3.0, 1.0, (400, 2))
    members = np.stack([actual + rng.normal(0.0, 0.5, actual.shape) for _ in range(3)], axis=1)
    members[:, right, :] = actual
    w = choose_weights(members, actual, log_offset=1.0, quantile=0.95)
    np.testing.assert_allclose(w[:, right], 1.0)


def test_members_log_offset_is_the_ensembles(model, series):
    """Members are combined on the ensemble's own log scale (one offset for all)."""
    recent = series.slice(0, 11 * DAY)
    med = model.log_median(recent, np.array([len(recent) - 1]), 1)[0, 0]
    member_meds = [m.forecast(recent, 1, (0.5,)).values[0, 0] for m in model.members]
    logs = to_log(np.array(member_meds), model.log_offset)
    assert min(logs) - 1e-9 <= med <= max(logs) + 1e-9


def test_short_history_leaves_out_members_that_cannot_fit():
    """3.5 days: Holt-Winters (3 days) cannot fit before the held-out tail, ARIMA can."""
    fitted = registry.forecaster("ensemble").fit(make_daily(days=3.5, seed=8))
    assert fitted.member_kinds == ("arima", "persistence")
    assert np.all(np.isfinite(fitted.forecast(make_daily(days=4, seed=8), 6, (0.5, 0.95)).values))
