"""A training run whose history was idle until a launch: the idle steps' scores are no evidence of
the live service's errors, and the short-history choice of calibration, made on daily blocks fitted
on idle days, is replaced by the launch calibration."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import (
    DEFAULT_TRACKING_RATE,
    MIN_SCORES,
    CalibratedModel,
    calibrate,
    live_origins,
)
from predictive_scaler.forecasting.selection import (
    LAUNCH_CALIBRATION,
    launched_during_calibration,
    settings_for_history,
    train_model,
)
from predictive_scaler.forecasting.walkforward import leading_idle_steps, walk_forward

from .test_constant_window import _launched


@pytest.mark.parametrize(("values", "idle"), [
    ([0, 0, 0, 5, 0], 3),
    ([3, 4, 4], 1),
    ([7, 7, 7], 3),
    ([np.nan, 0, np.nan, 0, 2], 4),
    ([np.nan, np.nan], 2),
    ([], 0),
])
def test_leading_idle_steps_counts_the_steps_before_the_series_first_moves(values, idle):
    assert leading_idle_steps(np.array(values, dtype=float)) == idle


def test_live_origins_drops_the_idle_ones_while_enough_live_ones_remain():
    origins = np.arange(100, 400)
    keep = live_origins(origins, 200, 6)
    assert keep.sum() == 200 and origins[keep].min() == 200
    assert live_origins(origins, 0, 6).all()


def test_live_origins_scores_every_origin_when_too_few_are_live():
    """The latest MIN_SCORES alone would rest the shift on the first minutes of traffic, which the tracker
    cannot unwind while the idle scores have no spread."""
    origins = np.arange(0, 600)
    assert live_origins(origins, 600 - MIN_SCORES, 6).all()
    assert live_origins(origins, 600 - MIN_SCORES - 6, 6).sum() == MIN_SCORES + 6


def _week() -> tuple[object, int]:
    series = _launched()
    return series, 86400 // series.step_seconds


def test_calibration_on_a_launched_week_scores_only_the_live_steps():
    series, day = _week()
    week = series.slice(0, 7 * day)
    base = registry.forecaster("persistence").fit(week.slice(0, 5 * day))
    live = leading_idle_steps(week.values)
    assert 6 * day <= live < 7 * day
    every = calibrate(base, week, 5 * day - 1, tracking_rate=0.0)
    scored = calibrate(base, week, 5 * day - 1, tracking_rate=0.0, live_from=live)
    k = every.quantiles.index(0.95)
    # two thirds of the window's scores were the idle steps' zero errors
    assert all(s > e for s, e in zip(scored.offsets[k], every.offsets[k], strict=True))
    idx = np.arange(7 * day, len(series) - 3, 1)
    actual = series.values[idx + 3]

    def coverage(model: CalibratedModel) -> float:
        p95 = walk_forward(model, series, idx, 3, (0.5, 0.95))[:, 1, 2]
        seen = np.isfinite(actual)
        return float(np.mean(actual[seen] <= p95[seen]))

    assert abs(coverage(scored) - 0.95) < abs(coverage(every) - 0.95)


def test_a_launch_during_the_last_calibration_window_serves_the_launch_calibration():
    series, day = _week()
    week = series.slice(0, 7 * day)
    cfg = settings_for_history(week.span)
    assert launched_during_calibration(week, cfg)
    result = train_model(week, ("persistence", "arima", "holt-winters"), settings=cfg)
    model = result.model
    assert isinstance(model, CalibratedModel)
    assert LAUNCH_CALIBRATION == (DEFAULT_TRACKING_RATE, True)
    assert model.additive and model.tracking_rate == DEFAULT_TRACKING_RATE
    assert "(a launch)" in result.metrics["selection_reason"]
    assert result.metrics["selection_reason"].startswith("the history held one value until 16h before its end")


def test_a_history_that_moved_before_its_calibration_window_is_not_a_launch():
    series, day = _week()
    values = np.array(series.values[: 7 * day], dtype=float)
    values[: 4 * day] = 0.0
    values[4 * day:] = np.where(values[4 * day:] > 0, values[4 * day:], 1.0)
    week = dataclasses.replace(series.slice(0, 7 * day), values=values)
    assert not launched_during_calibration(week, settings_for_history(week.span))
