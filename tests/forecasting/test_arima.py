"""ARIMA: the steady-state forecast path against statsmodels' Kalman filter, where it stands aside, and the residual fit."""

from __future__ import annotations

import numpy as np
import pytest

from predictive_scaler.forecasting.arima import (
    MA_LIMIT,
    ArimaModel,
    fit_residual_arima,
    steady_state_moments,
)


def _model(order: tuple[int, int, int], params: tuple[float, ...]) -> ArimaModel:
    return ArimaModel(step_seconds=300, order=order, coef=(0.0,), arima_params=params, daily_k=0, weekly_k=0,
                      t_ref=0.0, log_offset=1.0, window=288)


def _arima_path(phi: tuple[float, ...], theta: tuple[float, ...], sigma2: float, n: int, seed: int) -> np.ndarray:
    """A residual path of ARIMA(p, 1, q) with these coefficients (SARIMAX's signs)."""
    rng = np.random.default_rng(seed)
    e = rng.normal(0.0, np.sqrt(sigma2), n)
    w = np.zeros(n)
    for t in range(n):
        w[t] = e[t] + sum(phi[i] * w[t - 1 - i] for i in range(len(phi)) if t - 1 - i >= 0) \
            + sum(theta[j] * e[t - 1 - j] for j in range(len(theta)) if t - 1 - j >= 0)
    return np.cumsum(w)


@pytest.mark.parametrize(
    ("order", "params"),
    [
        ((1, 1, 1), (0.27, -0.9, 0.04)),
        ((1, 1, 1), (0.76, -0.93, 0.0034)),
        ((0, 1, 1), (-0.6, 0.01)),
        ((1, 1, 0), (0.5, 0.01)),
        ((2, 1, 1), (0.5, 0.2, -0.7, 0.02)),
        ((1, 1, 2), (0.4, -0.5, 0.2, 0.02)),
        ((2, 1, 2), (0.3, 0.1, -0.4, -0.2, 0.05)),
    ],
    ids=["nasa-like", "mongo-like", "ima", "ari", "ar2", "ma2", "arma22"],
)
def test_steady_state_moments_are_the_kalman_filters(order, params):
    model = _model(order, params)
    resid = _arima_path(params[:order[0]], params[order[0]:order[0] + order[2]], params[-1], 900, seed=len(params))
    origins = np.arange(600, 890, 7)
    steady = steady_state_moments(order, np.asarray(params), resid, origins, 6)
    assert steady is not None
    mean, var = model._kalman_moments(resid, origins, 6)
    # statsmodels starts the integrated state approximately diffuse (variance 1e6), which leaves
    # ~1e-6 of its start in every later step; the steady state is the limit without it.
    np.testing.assert_allclose(steady[1], var, rtol=1e-5)
    assert np.max(np.abs(steady[0] - mean) / np.sqrt(var)) < 1e-4
    # Variance grows with the horizon.
    assert np.all(np.diff(steady[1], axis=1) > 0)


@pytest.mark.parametrize(
    ("order", "params", "mutate", "origins"),
    [
        ((1, 1, 1), (0.3, -0.5, 0.01), lambda r: r, np.array([5, 300])),
        ((1, 1, 1), (0.3, -0.5, 0.01), lambda r: np.where(np.arange(r.size) == 150, np.nan, r), np.array([300])),
        ((1, 0, 1), (0.3, -0.5, 0.01), lambda r: r, np.array([300])),
        ((1, 1, 1), (0.3, -0.995, 0.01), lambda r: r, np.array([300])),
        ((1, 1, 1), (1.0, -0.5, 0.01), lambda r: r, np.array([300])),
        ((1, 1, 1), (0.3, -0.5, 0.01), lambda r: r, np.array([], dtype=int)),
    ],
    ids=["origin-near-the-start", "missing-residual", "stationary-order", "ma-near-unit-root",
         "ar-unit-root", "no-origins"],
)
def test_steady_state_path_stands_aside_where_the_filter_is_needed(order, params, mutate, origins):
    resid = mutate(_arima_path((0.3,), (-0.5,), 0.01, 400, seed=3))
    assert steady_state_moments(order, np.asarray(params), resid, origins, 6) is None


def test_a_gap_in_the_window_still_forecasts_through_the_kalman_filter():
    model = _model((1, 1, 1), (0.3, -0.5, 0.01))
    resid = _arima_path((0.3,), (-0.5,), 0.01, 400, seed=4)
    resid[350:355] = np.nan
    mean, var = model._residual_moments(resid, np.array([360, 399]), 6)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var))
    np.testing.assert_array_equal(mean, model._kalman_moments(resid, np.array([360, 399]), 6)[0])


def _arma_111(n: int, phi: float, theta: float, seed: int) -> np.ndarray:
    """A path of ARIMA(1,1,1): the cumulative sum of an ARMA(1,1)."""
    from scipy.signal import lfilter

    e = np.random.default_rng(seed).standard_normal(n)
    return np.cumsum(lfilter([1.0, theta], [1.0, -phi], e))


def _unbounded_then_clipped(resid: np.ndarray) -> np.ndarray:
    """The fit before the MA was searched inside its limit: unbounded, then clipped."""
    import warnings

    from statsmodels.tsa.statespace.sarimax import SARIMAX

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = SARIMAX(resid, order=(1, 1, 1), concentrate_scale=True).fit(disp=False, maxiter=100, cov_type="none")
    params = np.asarray(res.params, dtype=float)
    params[1] = np.clip(params[1], -MA_LIMIT, MA_LIMIT)
    return params


def _concentrated_loglike(resid: np.ndarray, params: np.ndarray) -> float:
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    return float(SARIMAX(resid, order=(1, 1, 1), concentrate_scale=True).loglike(params[:2]))


def test_an_over_differenced_residual_gets_the_best_ar_for_the_served_ma() -> None:
    # Stationary noise differenced once: the unbounded MA runs to -1 and is clipped afterwards,
    # leaving an AR fitted for another MA. Searched inside the limit, the likelihood of what is
    # served is at least as high.
    resid = np.random.default_rng(3).standard_normal(4000) + 0.3 * np.sin(np.arange(4000) / 40)
    params = fit_residual_arima(resid, (1, 1, 1))
    assert params[1] == pytest.approx(-MA_LIMIT)
    assert params[-1] > 0  # the variance, last
    old = _unbounded_then_clipped(resid)
    assert old[1] == pytest.approx(-MA_LIMIT)
    assert _concentrated_loglike(resid, params) >= _concentrated_loglike(resid, old) - 1e-6


@pytest.mark.parametrize(("phi", "theta"), [(0.5, -0.6), (0.3, 0.4), (0.8, -0.2)])
def test_an_ma_inside_the_limit_is_the_unbounded_optimum(phi: float, theta: float) -> None:
    resid = _arma_111(5000, phi, theta, seed=int(10 * phi))
    params = fit_residual_arima(resid, (1, 1, 1))
    old = _unbounded_then_clipped(resid)
    np.testing.assert_allclose(params[:2], old, atol=2e-3)
    assert params[0] == pytest.approx(phi, abs=0.1) and params[1] == pytest.approx(theta, abs=0.1)


def test_higher_ma_orders_stay_invertible_and_inside_the_limit() -> None:
    resid = np.random.default_rng(5).standard_normal(3000)
    params = fit_residual_arima(resid, (1, 1, 2))
    assert np.all(np.abs(params[1:3]) <= MA_LIMIT)


@pytest.mark.parametrize("step", [60, 300, 3600, 7])
def test_the_design_takes_each_sine_once_per_phase_and_gives_the_same_numbers(step: int) -> None:
    from predictive_scaler.forecasting.arima import DAY, WEEK, _design

    secs = 1.7e9 + step * np.arange(5000.0)
    got = _design(secs, float(secs[-1]), 10, 5, True)
    t = secs
    cols = [np.ones_like(t), (t - secs[-1]) / WEEK]
    for period, k_max in ((DAY, 10), (WEEK, 5)):
        phase = 2.0 * np.pi * (np.mod(t, period) / period)
        for k in range(1, k_max + 1):
            cols += [np.sin(k * phase), np.cos(k * phase)]
    np.testing.assert_array_equal(got, np.column_stack(cols))
    assert _design(secs, float(secs[-1]), 3, 0, False).shape == (5000, 7)


def test_no_observation_in_the_window_is_no_forecast_not_a_wild_one():
    """An outage longer than the window leaves the residual's state the filter's diffuse start:
    its P95 ran to 1e304. There is no forecast then (NaN; the served path says why), and one
    observation after the outage is enough to forecast again, within reach of the data."""
    from predictive_scaler.errors import ModelError
    from predictive_scaler.forecasting.arima import ArimaForecaster
    from predictive_scaler.series import Series
    from tests.forecasting.conftest import make_daily

    history = make_daily(days=8)
    model = ArimaForecaster().fit(history)
    assert isinstance(model, ArimaModel)
    after = make_daily(days=12, seed=1).values[len(history.values):]
    outage = np.full(2 * model.window, np.nan)
    values = np.concatenate([history.values, outage, after])
    series = Series(values=values, start=history.start, step_seconds=history.step_seconds)
    n0 = len(history.values)
    blind = np.array([n0 + model.window + 10, n0 + 2 * model.window - 1])
    sighted = np.array([n0 + 5, n0 + 2 * model.window, n0 + 2 * model.window + 30])
    fc = model.walk_forward(series, np.concatenate([blind, sighted]), 6, (0.5, 0.95))
    assert np.all(np.isnan(fc[:2]))
    assert np.all(np.isfinite(fc[2:]))
    assert float(np.max(fc[2:])) < 50 * float(np.nanmax(values))
    with pytest.raises(ModelError, match="too few observations"):
        model.forecast(series.slice(0, int(blind[0]) + 1), 6, (0.5, 0.95))
    served = model.forecast(series.slice(0, int(sighted[1]) + 1), 6, (0.5, 0.95))
    assert np.all(np.isfinite(served.values)) and float(np.max(served.values)) < 50 * float(np.nanmax(values))
