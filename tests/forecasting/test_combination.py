"""Weights instead of a winner: the combination's weight search and its artifact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import calibrate
from predictive_scaler.forecasting.combination import (
    CombinationModel,
    choose_combination,
    combine_quantiles,
    stable_combination,
)

from .conftest import make_daily

DAY = 288


@pytest.mark.parametrize(
    ("uppers", "expected"),
    [
        # Member 0 right on the quantile, member 1 far too high: member 0 alone.
        pytest.param([1.0, 3.0], [1.0, 0.0], id="one-member-dominates"),
        # One too low, one too high by the same factor: the even mix is exact.
        pytest.param([0.5, 2.0], [0.5, 0.5], id="complementary-errors-mix"),
    ],
)
def test_weights_minimise_the_pinball_of_the_combined_quantile(uppers, expected):
    rng = np.random.default_rng(0)
    actual = np.exp(rng.normal(0, 0.01, (400, 2)))  # ≈ 1, the quantile forecast's target
    level = np.quantile(actual, 0.95)
    members = np.stack([np.full_like(actual, u * level) for u in uppers])
    np.testing.assert_allclose(choose_combination(actual, members, 0.95), expected)


def _halves(first, second, scale_first=10.0, n=400):
    """(actual, uppers): two halves of ``n`` rows; member i's q-quantile forecast is ``first[i]``
    (``second[i]``) times the right one on the first (second) half, whose actuals are
    ``scale_first`` times larger."""
    rng = np.random.default_rng(1)
    actual = np.exp(rng.normal(0, 0.01, (n, 2)))
    actual[: n // 2] *= scale_first
    level = np.quantile(actual[n // 2:], 0.95)
    factors = np.array([[first[i]] * (n // 2) + [second[i]] * (n - n // 2) for i in range(len(first))])
    uppers = factors[:, :, None] * level * np.where(np.arange(n) < n // 2, scale_first, 1.0)[None, :, None]
    return actual, np.broadcast_to(uppers, (len(first), n, 2)).copy()


@pytest.mark.parametrize(
    ("first", "second", "pooled", "stable"),
    [
        # Member 0 right on both halves: it alone, whatever the rule.
        pytest.param([1.0, 3.0], [1.0, 3.0], [1.0, 0.0], [1.0, 0.0], id="halves-agree"),
        # Member 0 right on the (large) first half, member 1 on the second: the pooled window
        # is dominated by the first half and bets on member 0 alone; each half's pick counts once.
        pytest.param([1.0, 3.0], [0.3, 1.0], [1.0, 0.0], [0.5, 0.5], id="halves-disagree-hedged"),
    ],
)
def test_stable_weights_are_the_mean_of_each_halfs_pick(first, second, pooled, stable):
    actual, uppers = _halves(first, second)
    np.testing.assert_allclose(choose_combination(actual, uppers, 0.95), pooled)
    np.testing.assert_allclose(stable_combination(actual, uppers, 0.95), stable)


def test_combination_forecasts_the_weighted_geometric_mean_and_round_trips():
    series = make_daily(days=12)
    members = []
    for kind in ("persistence", "seasonal-naive"):
        base = registry.forecaster(kind).fit(series.slice(0, 7 * DAY))
        members.append(calibrate(base, series.slice(0, 10 * DAY), 7 * DAY - 1, horizon_steps=6))
    model = CombinationModel(members=tuple(members), weights=(0.3, 0.7))
    recent = series.tail(model.window_steps)
    got = model.forecast(recent, 6, (0.5, 0.95)).values
    each = np.stack([m.forecast(recent.tail(m.window_steps), 6, (0.5, 0.95)).values for m in members])
    np.testing.assert_allclose(got, combine_quantiles(each, np.array([0.3, 0.7])), rtol=1e-9)
    rebuilt = registry.model_from_params("combination", json.loads(json.dumps(model.to_params())))
    np.testing.assert_allclose(rebuilt.forecast(recent, 6, (0.5, 0.95)).values, got)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        pytest.param((0.5, 0.6), "sum to one", id="not-a-simplex"),
        pytest.param((1.2, -0.2), "non-negative", id="negative"),
        pytest.param((1.0,), "two or more", id="one-member"),
    ],
)
def test_bad_combination_parameters_are_refused(weights, message):
    series = make_daily(days=8)
    base = registry.forecaster("persistence").fit(series.slice(0, 4 * DAY))
    member = calibrate(base, series.slice(0, 7 * DAY), 4 * DAY - 1, horizon_steps=6)
    members = (member,) * (2 if len(weights) == 2 else 1)
    with pytest.raises(ModelError, match=message):
        CombinationModel(members=members, weights=weights)
