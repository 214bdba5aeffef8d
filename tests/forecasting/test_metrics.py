from __future__ import annotations

import math

import numpy as np
import pytest

from predictive_scaler.forecasting import metrics as m

NAN = float("nan")


@pytest.mark.parametrize(
    ("actual", "point", "expect_mae", "expect_wape"),
    [
        ([1, 2, 3], [1, 2, 3], 0.0, 0.0),
        ([1, 2, 3], [2, 3, 4], 1.0, 3 / 6),
        ([1, NAN, 3], [2, 100, 4], 1.0, 2 / 4),  # the NaN actual is excluded
        ([0, 0], [1, 1], 1.0, None),  # WAPE undefined on all-zero actuals
        ([NAN, NAN], [1, 1], None, None),
    ],
    ids=["perfect", "off-by-one", "nan-excluded", "zero-actuals", "all-nan"],
)
def test_mae_and_wape(actual, point, expect_mae, expect_wape):
    a, f = np.array(actual, float), np.array(point, float)
    assert m.mae(a, f) == (pytest.approx(expect_mae) if expect_mae is not None else None)
    assert m.wape(a, f) == (pytest.approx(expect_wape) if expect_wape is not None else None)


def test_mape_ignores_zero_actuals():
    a = np.array([0.0, 10.0, 20.0])
    f = np.array([5.0, 11.0, 18.0])
    assert m.mape(a, f) == pytest.approx(np.mean([1 / 10, 2 / 20]))
    assert m.mape(np.zeros(3), f) is None


@pytest.mark.parametrize("q", [0.5, 0.9, 0.95], ids=["p50", "p90", "p95"])
def test_pinball_is_minimised_by_the_true_quantile(q):
    rng = np.random.default_rng(1)
    actual = rng.normal(size=20000)
    true_q = np.quantile(actual, q)
    losses = {shift: m.pinball(actual, np.full_like(actual, true_q + shift), q) for shift in (-0.3, 0.0, 0.3)}
    assert losses[0.0] < losses[-0.3] and losses[0.0] < losses[0.3]
    assert m.coverage(actual, np.full_like(actual, true_q)) == pytest.approx(q, abs=0.01)


def test_pinball_penalises_under_forecast_by_q():
    # one actual 10 above the forecast costs q·10; one 10 below costs (1-q)·10
    assert m.pinball(np.array([10.0]), np.array([0.0]), 0.95) == pytest.approx(9.5)
    assert m.pinball(np.array([0.0]), np.array([10.0]), 0.95) == pytest.approx(0.5)


def test_mase_scales_by_in_sample_naive_error():
    history = np.array([1.0, 3.0, 2.0, NAN, 4.0])  # |diffs| finite: 2, 1 → scale 1.5
    assert m.naive_scale(history) == pytest.approx(1.5)
    assert m.mase(np.array([2.0]), np.array([5.0]), 1.5) == pytest.approx(2.0)
    assert m.mase(np.array([2.0]), np.array([5.0]), None) is None
    assert m.naive_scale(np.ones(5)) is None  # a constant history has no naive error


def test_all_metrics_are_finite_or_none():
    out = m.all_metrics(np.array([NAN, 0.0]), np.array([1.0, NAN]), np.array([1.0, 2.0]), 0.95, 0.0)
    assert set(out) == set(m.METRIC_NAMES)
    assert all(v is None or math.isfinite(v) for v in out.values())


INTERVAL_CASES = [
    # (id, per-day numerator sums, per-day denominator sums, check on (lo, hi))
    ("identical-sides", [3.0, 5.0, 2.0, 4.0], [3.0, 5.0, 2.0, 4.0], lambda lo, hi: lo == pytest.approx(1.0)
     and hi == pytest.approx(1.0)),
    ("better-every-day", [0.8, 0.85, 0.9, 0.82, 0.88, 0.86, 0.84], [1.0] * 7, lambda lo, hi: 0.8 <= lo < hi < 0.9),
    ("one-day-decides", [0.9, 0.95, 0.9, 0.92, 0.94, 0.9, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5],
     lambda lo, hi: lo < 1.0 < hi),
    ("coverage-hits-over-origins", [46, 45, 48, 40, 47, 44, 46], [48] * 7, lambda lo, hi: lo < 316 / 336 < hi <= 1.0),
]


@pytest.mark.parametrize(("num", "den", "check"), [c[1:] for c in INTERVAL_CASES], ids=[c[0] for c in INTERVAL_CASES])
def test_grouped_ratio_interval_resamples_whole_groups(num: list[float], den: list[float], check) -> None:
    got = m.grouped_ratio_interval(np.array(num, float), np.array(den, float))
    assert got is not None and check(*got), got
    # Seeded: the same sums give the same interval.
    assert got == m.grouped_ratio_interval(np.array(num, float), np.array(den, float))


@pytest.mark.parametrize(("num", "den"), [([1.0], [1.0]), ([1.0, np.nan], [1.0, 1.0]), ([1.0, 1.0], [0.0, 0.0])],
                         ids=["one-group", "not-finite", "zero-denominator"])
def test_grouped_ratio_interval_is_none_when_undefined(num: list[float], den: list[float]) -> None:
    assert m.grouped_ratio_interval(np.array(num), np.array(den)) is None


def test_grouped_ratio_interval_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="level"):
        m.grouped_ratio_interval(np.ones(3), np.ones(3), level=1.0)
    with pytest.raises(ValueError, match="alike"):
        m.grouped_ratio_interval(np.ones(3), np.ones(4))


def test_the_geometric_mean_interval_holds_the_geometric_mean_of_the_ratios() -> None:
    rng = np.random.default_rng(5)
    series = [(rng.uniform(0.8, 1.0, 7), np.ones(7)), (rng.uniform(1.0, 1.2, 8), np.ones(8))]
    lo, hi = m.geometric_mean_interval(series)
    point = math.exp(np.mean([math.log(n.sum() / d.sum()) for n, d in series]))
    assert lo < point < hi
    # Narrower than either series' own interval: independent errors average out.
    own = [m.grouped_ratio_interval(n, d) for n, d in series]
    assert all(hi - lo < b - a for a, b in own)
    assert m.geometric_mean_interval([*series, (np.ones(1), np.ones(1))]) is None
    assert m.geometric_mean_interval([]) is None
