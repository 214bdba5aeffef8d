"""The seasonal profile: quantiles of the same time of day on past days, from today's level."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.profile import SeasonalProfileModel
from predictive_scaler.forecasting.walkforward import walk_forward
from predictive_scaler.series import Series

DAY = 288  # 5-minute steps
START = pd.Timestamp("2024-03-04", tz="UTC")


def recurring(days: int, level: float = 100.0, seed: int = 0) -> Series:
    """A flat level with a 3x burst of 10 minutes near 10:00 every day, starting up to 15 minutes early or late."""
    rng = np.random.default_rng(seed)
    values = level * (1 + 0.02 * rng.standard_normal(days * DAY))
    for d in range(days):
        start = d * DAY + 120 + int(rng.integers(-3, 4))  # 10:00 ± 15 min
        values[start:start + 2] *= 3
    return Series(values=values, start=START, step_seconds=300)


def test_a_burst_that_recurs_near_a_time_of_day_widens_the_band_there_and_only_there() -> None:
    history = recurring(10)
    model = registry.forecaster("seasonal-profile").fit(history)

    def at(hour: int) -> np.ndarray:
        return walk_forward(model, history, np.array([9 * DAY + hour * 12 - 6]), 6, (0.5, 0.95))[0]

    morning, afternoon = at(10), at(14)
    assert morning[1].max() > 2.0 * 100  # the burst's time: the P95 reaches the burst
    assert morning[0].max() < 1.2 * 100  # … the median does not (most steps there are calm)
    assert afternoon[1].max() < 1.2 * 100  # elsewhere the band stays narrow


def test_the_level_moves_every_quantile() -> None:
    history = recurring(10)
    doubled = history.values.copy()
    doubled[-24:] *= 2  # the last two hours at twice the level
    shifted = Series(values=doubled, start=history.start, step_seconds=300)
    model = registry.forecaster("seasonal-profile").fit(history)
    origin = np.array([len(shifted) - 1])
    before = walk_forward(model, history, origin, 3, (0.5,))[0, 0]
    after = walk_forward(model, shifted, origin, 3, (0.5,))[0, 0]
    np.testing.assert_allclose(after / before, 2.0, rtol=0.05)


def test_too_little_history_or_too_coarse_a_step_is_refused() -> None:
    with pytest.raises(InsufficientHistoryError, match="more than a day"):
        registry.forecaster("seasonal-profile").fit(recurring(1))
    daily = Series(values=np.ones(30), start=START, step_seconds=86400)
    with pytest.raises(InsufficientHistoryError, match="6 hours"):
        registry.forecaster("seasonal-profile").fit(daily)


@pytest.mark.parametrize("step_s", [600, 1800])
def test_a_step_too_coarse_for_a_pool_of_analogues_is_refused_with_the_finest_that_works(step_s: int) -> None:
    coarse = Series(values=np.full(14 * 86400 // step_s, 100.0), start=START, step_seconds=step_s)
    with pytest.raises(ModelError, match=r"step of at most 300 s or leave seasonal-profile out"):
        registry.forecaster("seasonal-profile").fit(coarse)
    fine = Series(values=np.full(14 * DAY, 100.0), start=START, step_seconds=300)
    assert registry.forecaster("seasonal-profile").fit(fine).half_width_steps == 3


def test_a_window_without_observations_gives_no_forecast() -> None:
    model = registry.forecaster("seasonal-profile").fit(recurring(3))
    empty = Series(values=np.full(DAY, np.nan), start=START, step_seconds=300)
    with pytest.raises(ModelError, match="too few observations"):
        model.forecast(empty, 3, (0.5, 0.95))


@pytest.mark.parametrize(("field", "value"), [
    ("days", 0), ("days", 29), ("half_width_steps", 288), ("half_width_steps", -1), ("level_steps", 0),
    ("log_offset", 0.0), ("step_seconds", 0), ("day_steps", "many"),
])
def test_out_of_range_parameters_are_refused(field: str, value: object) -> None:
    params = registry.forecaster("seasonal-profile").fit(recurring(3)).to_params()
    params[field] = value
    with pytest.raises(ModelError, match="seasonal-profile parameters"):
        SeasonalProfileModel.from_params(params)
    del params[field]
    with pytest.raises(ModelError, match="retrain"):
        SeasonalProfileModel.from_params(params)
