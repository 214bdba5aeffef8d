"""Properties every forecast must keep, whatever the recent data looks like (hypothesis)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import calibrate
from predictive_scaler.series import Series

from .conftest import make_daily

KINDS = ("arima", "persistence", "seasonal-naive", "holt-winters", "quantile-regression", "seasonal-profile",
         "calibrated")
DAY = 288


@functools.cache
def fitted(kind: str):
    history = make_daily(days=8, seed=21)
    if kind == "calibrated":
        base = registry.forecaster("persistence").fit(history.slice(0, 5 * DAY))
        return calibrate(base, history, 5 * DAY - 1, horizon_steps=12)
    return registry.forecaster(kind).fit(history)


@st.composite
def recent_windows(draw):
    """Two days of plausible-to-awkward demand: scaled, with gaps, spikes and zeros."""
    base = make_daily(days=2, seed=draw(st.integers(0, 10_000)))
    values = base.values * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    mask = np.array(draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))))
    values = values.copy()
    values[mask & (np.arange(len(values)) < len(values) - 1)] = np.nan  # keep the last step observed
    if draw(st.booleans()):
        values[draw(st.integers(0, len(values) - 1))] *= 50  # a spike
    if draw(st.booleans()):
        values[-draw(st.integers(1, 20)):] = 0.0  # a quiet stretch
    return Series(values=values, start=base.start, step_seconds=300)


quantile_sets = st.lists(st.floats(0.01, 0.99), min_size=1, max_size=4, unique=True).map(
    lambda qs: tuple(sorted({round(q, 3) for q in qs}))
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), recent=recent_windows(), horizon=st.integers(1, 12), qs=quantile_sets)
def test_forecasts_are_finite_non_negative_and_ordered(kind, recent, horizon, qs):
    fc = fitted(kind).forecast(recent, horizon, qs)
    assert fc.values.shape == (len(qs), horizon)
    assert np.all(np.isfinite(fc.values)) and np.all(fc.values >= 0)
    assert np.all(np.diff(fc.values, axis=0) >= 0)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), recent=recent_windows(), horizon=st.integers(1, 12))
def test_round_trip_gives_identical_forecasts(kind, recent, horizon):
    model = fitted(kind)
    rebuilt = registry.model_from_params(model.kind, json.loads(json.dumps(model.to_params())))
    try:
        a = model.forecast(recent, horizon, (0.5, 0.95)).values
    except ModelError:
        with pytest.raises(ModelError):  # refused alike
            rebuilt.forecast(recent, horizon, (0.5, 0.95))
        return
    np.testing.assert_array_equal(a, rebuilt.forecast(recent, horizon, (0.5, 0.95)).values)
