"""The reconciler pulls only the history the served model reads, and forecasts exactly as from 7 days."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from predictive_scaler.controller.ports import StoreModelPort
from predictive_scaler.forecasting.arima import ArimaForecaster
from predictive_scaler.forecasting.baselines import SeasonalNaiveForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.series import load_trace
from predictive_scaler.spec import DEFAULT_RECENT_WINDOW_SECONDS, ScalerSpec

REPO = Path(__file__).resolve().parents[2]
TRACE = load_trace(REPO / "backtests" / "traces" / "ms_mongodb_machine01_rps.csv").resample(300)
SPEC = ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {"kind": "requests", "query": "up"},
                             "capacity": {"requestsPerReplica": 300.0}, "model": {"name": "llm"}})

FITS = {
    "arima-reads-one-day": (lambda train: ArimaForecaster().fit(train), 288),
    "seasonal-naive": (lambda train: SeasonalNaiveForecaster().fit(train), None),
}


@pytest.mark.parametrize(("fit", "steps"), list(FITS.values()), ids=list(FITS))
def test_the_pull_is_what_the_model_reads_and_the_forecast_is_unchanged(tmp_path: Path, fit, steps) -> None:
    train = TRACE.slice(0, 10 * 288)
    store = ModelStore(tmp_path)
    store.publish("llm", fit(train), series="llm", window=TrainingWindow.of(train))
    port = StoreModelPort(store, "llm", horizon_seconds=1800, quantile=0.95, expected_series="llm")
    assert port.window_steps is None  # nothing loaded yet: the default window
    port.refresh()
    model_steps = getattr(port.model, "window_steps", None)
    want = None if model_steps is None else min(model_steps, DEFAULT_RECENT_WINDOW_SECONDS // 300)
    assert port.window_steps == want and (steps is None or want == steps)
    window = Reconciler(SPEC, None, port, None, None).recent_window  # type: ignore[arg-type]
    assert window == timedelta(seconds=300 * (want or DEFAULT_RECENT_WINDOW_SECONDS // 300))
    # The forecast from the shorter pull is the forecast from the 7-day one, number for number.
    end = 12 * 288
    week = TRACE.slice(end - 7 * 288, end)
    pulled = TRACE.slice(end - int(window.total_seconds()) // 300, end)
    now = week.end.to_pydatetime() + timedelta(seconds=60)
    a, b = port.forecast(week, now), port.forecast(pulled, now)
    assert a.issued_at == b.issued_at
    np.testing.assert_array_equal(a.values, b.values)
