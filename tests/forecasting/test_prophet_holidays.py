"""Past occurrences of scheduled events as Prophet holidays (and left out of the fit): the seasonal curve is
not bent by them, the curve kept is Prophet's without the holiday terms, and the error table does not learn
from them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.prophet import (
    ERROR_PROBABILITIES,
    ProphetForecaster,
    _curve_from_prophet,
    _holiday_frame,
    _in_windows,
)
from predictive_scaler.policy.events import forecaster_options, holiday_windows
from predictive_scaler.spec import ScalerSpec
from tests.forecasting.test_prophet import PER_DAY, STEP, synthetic

#: A weekly launch, Mondays 10:00-13:00 UTC (the synthetic trace starts on a Monday).
SPEC = ScalerSpec.from_dict({"target": {"name": "x"}, "demand": {"query": "q"},
                             "capacity": {"requestsPerReplica": 1}, "maxReplicas": 100,
                             "events": [{"name": "launch", "start": "2024-01-01T11:00:00+01:00",
                                         "end": "2024-01-01T13:00:00Z", "minReplicas": 50,
                                         "recurrence": "weekly"}]})


@pytest.fixture(scope="module")
def series():  # noqa: ANN201
    s = synthetic(days=14)
    t = s.timestamps()
    inside = (t.day_of_week == 0) & (t.hour >= 10) & (t.hour < 13)
    values = s.values.copy()
    values[inside] *= 4.0  # the launch quadruples demand, every Monday morning
    return type(s)(values=values, start=s.start, step_seconds=s.step_seconds, name=s.name)


def windows(series) -> tuple[tuple[str, float, float], ...]:  # noqa: ANN001
    return holiday_windows(SPEC.events, series.start.timestamp(), series.end.timestamp())


def test_past_occurrences_become_holidays(series) -> None:  # noqa: ANN001
    found = windows(series)
    assert [pd.Timestamp(s, unit="s").isoformat() for _, s, _ in found] == ["2024-01-01T10:00:00", "2024-01-08T10:00:00"]
    assert forecaster_options(SPEC.events, series.start.timestamp(), series.end.timestamp()) == {
        "prophet": {"holidays": found}}
    assert forecaster_options((), 0, 1) == {}
    frame = _holiday_frame(found)
    assert frame is not None and list(frame["ds"].dt.strftime("%Y-%m-%d")) == ["2024-01-01", "2024-01-08"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_kept_curve_is_prophets_without_the_holiday_terms(series) -> None:  # noqa: ANN001
    from prophet import Prophet

    times = series.timestamps()
    usual = ~_in_windows(times.as_unit("ns").asi8 / 1e9, windows(series))
    assert usual.sum() == len(series) - 2 * 3 * 4  # two 3-hour windows at 15 minutes are left out
    frame = pd.DataFrame({"ds": times.tz_localize(None)[usual], "y": np.log1p(series.values[usual])})
    prophet = Prophet(changepoint_prior_scale=0.001, yearly_seasonality=False, weekly_seasonality=5,
                      daily_seasonality=10, uncertainty_samples=0, holidays=_holiday_frame(windows(series))
                      ).fit(frame)
    when = pd.date_range(frame["ds"].iloc[0], periods=16 * PER_DAY, freq=f"{STEP}s")
    parts = prophet.predict(pd.DataFrame({"ds": when}))
    expected = (parts["yhat"] - parts["holidays"]).to_numpy()
    assert (parts["holidays"] != 0).any()  # the holiday terms exist (on the event days only)
    got = _curve_from_prophet(prophet, holidays=True).evaluate(when.as_unit("ns").asi8 / 1e9)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    with pytest.raises(ModelError, match="holidays"):
        _curve_from_prophet(prophet)  # a model with holidays is refused unless they were asked for


def test_the_launch_does_not_bend_the_seasonal_curve(series) -> None:  # noqa: ANN001
    plain = ProphetForecaster(daily_order=10, weekly_order=5).fit(series)
    told = ProphetForecaster(daily_order=10, weekly_order=5, holidays=windows(series)).fit(series)
    base = synthetic(days=21)
    # Next Monday 11:30, outside the training data: the usual level, not the launch.
    t = pd.Timestamp("2024-01-15T11:30:00Z")
    usual = float(base.values[base.index_at(t)])
    at = pd.DatetimeIndex([t])
    bent = float(np.expm1(plain.seasonal_curve(at))[0])
    kept = float(np.expm1(told.seasonal_curve(at))[0])
    assert bent > 1.3 * usual  # without the holidays the weekly terms learned the launch as "Monday"
    assert abs(kept - usual) < 0.15 * usual
    # And the error table is not widened by the launch windows.
    hi, lo = ERROR_PROBABILITIES.index(0.975), ERROR_PROBABILITIES.index(0.025)
    spread = lambda m: float(m.error_quantiles[0, 0, hi] - m.error_quantiles[0, 0, lo])  # noqa: E731
    assert spread(told) <= spread(plain)


def test_bad_holidays_are_refused() -> None:
    with pytest.raises(ModelError, match="end after its start"):
        ProphetForecaster(holidays=(("x", 10.0, 5.0),))
