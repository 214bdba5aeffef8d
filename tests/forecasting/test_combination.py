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
    OnlineWeights,
    Shift,
    choose_combination,
    combine_quantiles,
    online_weights,
    recalibration,
    stable_combination,
)
from predictive_scaler.forecasting.metrics import pinball_losses
from predictive_scaler.forecasting.walkforward import walk_forward

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


def _draws(seed: int, n: int = 800) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(0, 0.05, (n, 2)))


@pytest.mark.parametrize(
    ("factors", "prior", "expected"),
    [
        # Member 0 right everywhere: every part picks it alone.
        pytest.param([1.0, 1.5], None, [1.0, 0.0], id="one-right-no-prior"),
        # ... and the prior (member 1) counts as one more part's vote: 1 / (4 + 1) of the weight.
        pytest.param([1.0, 1.5], [0.0, 1.0], [0.8, 0.2], id="prior-is-one-vote"),
        # The prior agrees with every part: it alone.
        pytest.param([1.0, 1.5], [1.0, 0.0], [1.0, 0.0], id="prior-agrees"),
    ],
)
def test_the_prior_counts_as_one_more_parts_pick(factors, prior, expected):
    actual = _draws(4)
    level = np.quantile(actual, 0.95)
    uppers = np.stack([np.full_like(actual, f * level) for f in factors])
    got = stable_combination(actual, uppers, 0.95, prior=None if prior is None else np.asarray(prior))
    np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize(
    "factors",
    [pytest.param((0.8, 1.3), id="one-low-one-high"), pytest.param((0.9, 1.6), id="slightly-low-far-high")],
)
def test_members_that_disagree_combine_no_worse_than_the_best_on_held_out_data(factors):
    """One member's P95 too low, the other's too high: the weights (chosen on one sample) mix them,
    and on a fresh sample the mix scores no worse than the better member alone."""
    from predictive_scaler.forecasting.metrics import pinball_losses

    chosen, held_out = _draws(5), _draws(6)
    level = np.quantile(np.concatenate([chosen, held_out]), 0.95)
    uppers = np.stack([np.full_like(chosen, f * level) for f in factors])
    w = stable_combination(chosen, uppers, 0.95)
    assert 0.0 < w[0] < 1.0  # a mix, not a winner
    each = [float(np.mean(pinball_losses(held_out, u, 0.95))) for u in uppers]
    mixed = float(np.mean(pinball_losses(held_out, combine_quantiles(uppers, w), 0.95)))
    assert mixed <= min(each)


@pytest.mark.parametrize(
    ("factor", "shifted"),
    [
        # The combined P95 is already right: no shift of its own.
        pytest.param(1.0, False, id="calibrated-kept"),
        # Twice too wide (members that disagree, mixed): shifted down to cover 0.95.
        pytest.param(2.0, True, id="too-wide-shifted"),
        # A third too low: shifted up.
        pytest.param(0.7, True, id="too-low-shifted"),
    ],
)
def test_the_combination_recalibrates_its_own_quantile_two_fold(factor, shifted):
    rng = np.random.default_rng(3)
    actual = 100 * np.exp(rng.normal(0, 0.2, (600, 3)))
    right = 100 * np.exp(0.2 * 1.6449)
    upper = np.full_like(actual, factor * right)
    shift, scored = recalibration(actual, upper, 0.95, 1.0, (2, 4, 6))
    assert (shift is not None) is shifted
    coverage = float(np.mean(actual <= scored))
    if shifted:
        assert shift.quantile == 0.95 and len(shift.steps) == 6  # steps 1..6, interpolated
        assert abs(coverage - 0.95) < 0.03  # two-fold, out of sample
        served = shift.apply(upper[:, None, :1].repeat(2, axis=1) * np.array([0.5, 1.0])[None, :, None],
                             (0.5, 0.95))
        assert abs(float(np.mean(actual[:, 0] <= served[:, 1, 0])) - 0.95) < 0.03
        np.testing.assert_allclose(served[:, 0, 0], 0.5 * upper[:, 0])  # the median is not moved
    else:
        np.testing.assert_array_equal(scored, upper)


@pytest.mark.parametrize(
    ("scale", "steps"),
    [
        pytest.param("log", (-0.1, -0.2), id="log-down"),
        pytest.param("additive", (30.0,), id="additive-up"),
        # So far down that the P95 would cross the median: held at the quantile below it.
        pytest.param("log", (-0.5, -0.7), id="log-down-held-in-order"),
    ],
)
def test_a_shift_moves_upper_quantiles_in_proportion_and_keeps_their_order(scale, steps):
    shift = Shift(quantile=0.95, scale=scale, steps=steps, offset=1.0)
    values = np.array([[[100.0, 100.0, 100.0], [110.0, 110.0, 110.0], [150.0, 150.0, 150.0]]])  # P50, P60, P95
    got = shift.apply(values, (0.5, 0.6, 0.95))
    np.testing.assert_allclose(got[0, 0], values[0, 0])
    assert np.all(np.diff(got[0], axis=0) >= 0)  # quantiles stay ordered
    full = np.asarray(steps)[np.minimum(np.arange(3), len(steps) - 1)]
    p60 = np.exp(np.log(111.0) + full * 0.1 / 0.45) - 1 if scale == "log" else 110 + full * 0.1 / 0.45
    p95 = np.exp(np.log(151.0) + full) - 1 if scale == "log" else 150 + full
    np.testing.assert_allclose(got[0, 1], np.maximum(p60, 100.0))
    np.testing.assert_allclose(got[0, 2], np.maximum.reduce([p95, p60, np.full(3, 100.0)]))


def _two_members(days: int = 14):
    series = make_daily(days=days)
    members = []
    for kind in ("persistence", "seasonal-naive"):
        base = registry.forecaster(kind).fit(series.slice(0, 7 * DAY))
        members.append(calibrate(base, series.slice(0, 10 * DAY), 7 * DAY - 1, horizon_steps=6))
    return series, tuple(members)


def test_combination_forecasts_the_weighted_geometric_mean_and_round_trips():
    series, members = _two_members(days=12)
    model = CombinationModel(members=members, weights=(0.3, 0.7))
    recent = series.tail(model.window_steps)
    got = model.forecast(recent, 6, (0.5, 0.95)).values
    each = np.stack([m.forecast(recent.tail(m.window_steps), 6, (0.5, 0.95)).values for m in members])
    np.testing.assert_allclose(got, combine_quantiles(each, np.array([0.3, 0.7])), rtol=1e-9)
    rebuilt = registry.model_from_params("combination", json.loads(json.dumps(model.to_params())))
    np.testing.assert_allclose(rebuilt.forecast(recent, 6, (0.5, 0.95)).values, got)
    # With its own shift: applied to the combined quantiles, and stored.
    shifted = CombinationModel(members=members, weights=(0.3, 0.7),
                               shift=Shift(quantile=0.95, scale="log", steps=(-0.1,) * 6, offset=1.0))
    moved = shifted.forecast(recent, 6, (0.5, 0.95)).values
    np.testing.assert_allclose(moved[0], got[0])
    np.testing.assert_allclose(moved[1], np.maximum(np.exp(np.log(got[1] + 1.0) - 0.1) - 1.0, moved[0]))
    again = registry.model_from_params("combination", json.loads(json.dumps(shifted.to_params())))
    np.testing.assert_allclose(again.forecast(recent, 6, (0.5, 0.95)).values, moved)


@pytest.mark.parametrize(
    ("mean", "expected"),
    [
        pytest.param("arithmetic", [0.25 * 10.0 + 0.75 * 1000.0], id="arithmetic-follows-the-burst"),
        pytest.param("geometric", [10.0 ** 0.25 * 1000.0 ** 0.75], id="geometric-pulled-low"),
    ],
)
def test_quantiles_combine_by_the_stored_mean(mean, expected):
    """One member's P95 jumps with a burst (1000), the other's does not (10)."""
    got = combine_quantiles(np.array([[10.0], [1000.0]]), np.array([0.25, 0.75]), mean)
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_the_combination_stores_its_mean_and_old_artifacts_stay_geometric():
    series, members = _two_members(days=12)
    model = CombinationModel(members=members, weights=(0.3, 0.7), mean="arithmetic",
                             online=OnlineWeights.for_horizon(6, series.step_seconds, 0.95))
    recent = series.tail(model.window_steps)
    got = model.forecast(recent, 6, (0.5, 0.95)).values
    rebuilt = registry.model_from_params("combination", json.loads(json.dumps(model.to_params())))
    assert rebuilt.mean == "arithmetic"
    np.testing.assert_array_equal(rebuilt.forecast(recent, 6, (0.5, 0.95)).values, got)
    origins = np.arange(len(series) - 60, len(series), 7)
    batch = walk_forward(model, series, origins, 6, (0.5, 0.95))
    np.testing.assert_allclose(model.forecast(series.slice(0, int(origins[-1]) + 1), 6, (0.5, 0.95)).values,
                               batch[-1], rtol=1e-12)
    doc = model.to_params()
    del doc["mean"]  # written before the choice: the geometric mean it was trained with
    old = registry.model_from_params("combination", doc)
    assert old.mean == "geometric"
    assert np.all(old.forecast(recent, 6, (0.5, 0.95)).values[1] <= got[1] + 1e-9)  # AM >= GM
    assert not np.allclose(old.forecast(recent, 6, (0.5, 0.95)).values, got)


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


_NAN = float("nan")


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        pytest.param([[1.0, 3.0], [1.0, 3.0]], [0.3, 0.7], id="equal-losses-keep-the-stored-weights"),
        # relative losses 4/3 and 2/3 at both origins: weights 0.3 e^(-4 * 2/3) : 0.7
        pytest.param([[2.0, 2.0], [1.0, 1.0]],
                     [0.3 * np.exp(-8 / 3) / (0.3 * np.exp(-8 / 3) + 0.7),
                      0.7 / (0.3 * np.exp(-8 / 3) + 0.7)], id="the-worse-member-loses-weight"),
        # a calm origin and a burst weigh alike: relative losses, not absolute ones
        pytest.param([[2.0, 200.0], [1.0, 100.0]],
                     [0.3 * np.exp(-8 / 3) / (0.3 * np.exp(-8 / 3) + 0.7),
                      0.7 / (0.3 * np.exp(-8 / 3) + 0.7)], id="each-origin-counts-alike"),
        pytest.param([[_NAN, _NAN], [_NAN, _NAN]], [0.3, 0.7], id="nothing-scored-keeps-the-stored-weights"),
        # the second origin misses member 0: it is not held against member 1 alone
        pytest.param([[1.0, _NAN], [1.0, 50.0]], [0.3, 0.7], id="an-origin-missing-a-member-is-skipped"),
    ],
)
def test_online_weights_follow_the_members_recent_relative_pinball(losses, expected):
    # losses: one row per member, one column per past origin; one forecast
    got = online_weights(np.array([0.3, 0.7]), np.array([losses]), rate=4.0)
    np.testing.assert_allclose(got, [expected], rtol=1e-12)
    np.testing.assert_allclose(got.sum(axis=1), 1.0)


def test_online_combination_weighs_each_forecast_by_the_members_last_day():
    series, members = _two_members()
    rule = OnlineWeights.for_horizon(6, series.step_seconds, 0.95)
    assert (rule.steps, rule.origins) == (6, 48)  # origins 30 minutes apart over one day
    model = CombinationModel(members=members, weights=(0.3, 0.7), online=rule)
    t = len(series) - 1
    got = model.forecast(series, 6, (0.5, 0.95)).values
    # Recomputed by hand: each member's P95 pinball over steps 1..6 at t - 6k, k = 1..48.
    past = t - 6 * np.arange(1, 49)
    rel = []
    for p in past:
        loss = [np.mean(pinball_losses(series.values[p + 1: p + 7],
                                       walk_forward(m, series, np.array([p]), 6, (0.95,))[0, 0], 0.95))
                for m in members]
        rel.append(np.array(loss) / np.mean(loss))
    score = np.mean(rel, axis=0)
    w = np.array([0.3, 0.7]) * np.exp(-4.0 * score)
    w /= w.sum()
    each = np.stack([m.forecast(series, 6, (0.5, 0.95)).values for m in members])
    np.testing.assert_allclose(got, combine_quantiles(each, w), rtol=1e-9)
    assert not np.allclose(w, [0.3, 0.7])  # the members did differ over that day
    static = CombinationModel(members=members, weights=(0.3, 0.7)).forecast(series, 6, (0.5, 0.95)).values
    assert not np.allclose(got, static)


def test_online_combination_serves_what_its_batch_forecasts_and_round_trips():
    series, members = _two_members()
    model = CombinationModel(members=members, weights=(0.4, 0.6),
                             online=OnlineWeights.for_horizon(6, series.step_seconds, 0.95))
    assert model.window_steps == max(m.window_steps for m in members) + 6 * 48
    origins = np.arange(len(series) - 120, len(series), 7)
    batch = walk_forward(model, series, origins, 6, (0.5, 0.95))
    for i, t in enumerate(origins):
        served = model.forecast(series.slice(0, t + 1), 6, (0.5, 0.95)).values
        np.testing.assert_allclose(served, batch[i], rtol=1e-12)
    assert walk_forward(model, series, np.array([], dtype=int), 6, (0.5, 0.95)).shape == (0, 2, 6)
    rebuilt = registry.model_from_params("combination", json.loads(json.dumps(model.to_params())))
    assert rebuilt.online == model.online
    np.testing.assert_array_equal(walk_forward(rebuilt, series, origins, 6, (0.5, 0.95)), batch)
    # An artifact written before online weights has no "online": it keeps its stored weights.
    doc = model.to_params()
    del doc["online"]
    assert registry.model_from_params("combination", doc).online is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param("online", {"rate": 0.0, "steps": 6, "origins": 48, "quantile": 0.95}, "rate must be positive",
                     id="zero-rate"),
        pytest.param("online", {"rate": 4.0, "steps": 0, "origins": 48, "quantile": 0.95}, "at least 1",
                     id="no-steps"),
        pytest.param("online", {"rate": 4.0, "steps": 6, "origins": 48, "quantile": 1.5}, "quantile inside",
                     id="bad-quantile"),
        pytest.param("online", {"rate": 4.0, "steps": 6.5, "origins": 48, "quantile": 0.95}, "malformed",
                     id="fractional-steps"),
        pytest.param("online", {"rate": 4.0, "steps": 6, "quantile": 0.95}, "malformed", id="missing-origins"),
        pytest.param("mean", "median", "not one of", id="unknown-mean"),
        pytest.param("mean", 1, "malformed", id="mean-not-a-string"),
    ],
)
def test_bad_online_weight_or_mean_parameters_are_refused(field, value, message):
    series, members = _two_members(days=12)
    doc = CombinationModel(members=members, weights=(0.5, 0.5)).to_params()
    doc[field] = value
    with pytest.raises(ModelError, match=message):
        registry.model_from_params("combination", doc)
