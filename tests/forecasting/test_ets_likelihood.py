"""The block likelihood of additive Holt-Winters against statsmodels' own smoothing loop."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from statsmodels.tsa.exponential_smoothing.ets import ETSModel

from predictive_scaler.forecasting.ets_likelihood import (
    BLOCKS_FROM_SEASON,
    seasonal_ets,
    seasonal_ets_errors,
)


def _series(n: int, season: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 3.0 + 0.5 * np.sin(2 * np.pi * t / season) + 0.002 * t + 0.1 * rng.standard_normal(n)


def _reference(y: np.ndarray, season: int) -> ETSModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ETSModel(y, error="add", trend="add", damped_trend=True, seasonal="add",
                        seasonal_periods=season, initialization_method="heuristic")


@pytest.mark.parametrize(("season", "n"), [(7, 100), (24, 24 * 5 + 3), (288, 288 * 3), (2016, 2016 * 2 + 500)])
@pytest.mark.parametrize("seed", [0, 1])
def test_errors_are_statsmodels_residuals(season: int, n: int, seed: int) -> None:
    y = _series(n, season, seed)
    ref = _reference(y, season)
    rng = np.random.default_rng(seed + 10)
    for _ in range(4):
        alpha = rng.uniform(0.01, 0.95)
        beta, gamma, phi = rng.uniform(0, alpha), rng.uniform(0, 1 - alpha), rng.uniform(0.8, 0.98)
        params = np.array([alpha, beta, gamma, phi])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(ref.smooth(params).resid)
        got = seasonal_ets_errors(y, alpha, beta / alpha, gamma / (1 - alpha), phi, ref.initial_level,
                                  ref.initial_trend, np.asarray(ref.initial_seasonal))
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)


def test_a_short_last_block_and_an_alpha_near_one_still_match() -> None:
    y = _series(2 * 50 + 7, 50, 3)
    ref = _reference(y, 50)
    params = np.array([0.9999, 0.0, 0.0, 0.9])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.asarray(ref.smooth(params).resid)
    got = seasonal_ets_errors(y, 0.9999, 0.0, 0.0, 0.9, ref.initial_level, ref.initial_trend,
                              np.asarray(ref.initial_seasonal))
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10)


def test_a_long_season_fits_to_statsmodels_optimum() -> None:
    season = 500
    assert season >= BLOCKS_FROM_SEASON
    y = _series(season * 3, season, 4)
    ref = _reference(y, season)
    fast = seasonal_ets(y, season)
    assert type(fast) is not ETSModel  # the block likelihood is in use at this season
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p_ref = np.asarray(ref.fit(disp=False, maxiter=200, return_params=True))
        p_fast = np.asarray(fast.fit(disp=False, maxiter=200, return_params=True))
        # The optimum is statsmodels': the same likelihood (by statsmodels' own loop) to 1e-6.
        assert ref.loglike(p_fast) == pytest.approx(ref.loglike(p_ref), rel=1e-6)
    np.testing.assert_allclose(p_fast[:4], p_ref[:4], atol=1e-3)


def test_a_short_season_keeps_statsmodels_loop() -> None:
    assert type(seasonal_ets(_series(300, 24), 24)) is ETSModel
