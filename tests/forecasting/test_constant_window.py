"""A fit window with one value in it (a service idle until its launch, a stuck metric) is refused by
every fitted candidate, so a week's training that ends a day after a launch serves a forecast that
follows the new traffic instead of the idle week's level."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from predictive_scaler.errors import InsufficientHistoryError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.evaluation import model_series
from predictive_scaler.forecasting.selection import settings_for_history, train_model
from predictive_scaler.forecasting.walkforward import walk_forward
from predictive_scaler.series import Series, load_trace

from .conftest import make_daily

DAY = 288
TRACE = Path(__file__).resolve().parents[2] / "backtests" / "traces" / "servegen_m_small.csv"
FITTED = ("arima", "holt-winters", "prophet", "ets", "mstl", "quantile-regression")


def _constant(value: float, days: int = 8, gaps: bool = False) -> Series:
    values = np.full(days * DAY, value)
    if gaps:
        values[100:400] = np.nan
    return dataclasses.replace(make_daily(days=days), values=values)


@pytest.mark.parametrize("kind", FITTED)
@pytest.mark.parametrize(("value", "gaps"), [(0.0, False), (42.0, True)], ids=["idle", "stuck-with-gaps"])
def test_every_fitted_candidate_refuses_a_window_with_one_value(kind, value, gaps):
    with pytest.raises(InsufficientHistoryError, match=rf"{kind} has nothing to fit .* is {value:g} \(idle or stuck\)"):
        registry.forecaster(kind).fit(_constant(value, gaps=gaps))


def test_persistence_still_fits_a_window_with_one_value():
    model = registry.forecaster("persistence").fit(_constant(0.0))
    assert model.kind == "persistence"


def test_a_window_that_moves_once_is_fitted():
    values = np.full(8 * DAY, 5.0)
    values[-1] = 6.0
    series = dataclasses.replace(make_daily(days=8), values=values)
    assert registry.forecaster("holt-winters").fit(series).kind == "holt-winters"


def _launched() -> Series:
    """The bundled servegen_m_small trace (10-minute steps) as if the service had launched 6 days and
    8 hours into it: idle (zero) before."""
    series = model_series(load_trace(TRACE, min_history=None))
    day = 86400 // series.step_seconds
    values = np.array(series.values, dtype=float)
    values[: 6 * day + day // 3] = 0.0
    return dataclasses.replace(series, values=values)


def test_a_week_idle_until_a_launch_serves_a_forecast_that_follows_the_traffic():
    """Before the refusal this served arima fitted on the idle days: a P95 about 1e-5 of the traffic
    for the whole next week (coverage 0)."""
    series = _launched()
    day = 86400 // series.step_seconds
    week = series.slice(0, 7 * day)
    result = train_model(week, registry.DEFAULT_CANDIDATES, settings=settings_for_history(week.span))
    idx = np.arange(7 * day, len(series) - 3, 3)
    p95 = walk_forward(result.model, series, idx, 3, (0.5, 0.95))[:, 1, 2]
    actual = series.values[idx + 3]
    seen = np.isfinite(actual) & np.isfinite(p95)
    assert seen.mean() > 0.9
    # the P95 stands above the traffic most of the time, and near it, not at the idle week's zero
    assert np.mean(actual[seen] <= p95[seen]) > 0.8
    assert 0.9 < np.median(p95[seen] / actual[seen]) < 2.0
