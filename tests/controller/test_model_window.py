"""The reconciler pulls the history the served model reads, and forecasts exactly as from all of history."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from predictive_scaler.controller.ports import StoreModelPort
from predictive_scaler.forecasting.arima import ArimaForecaster
from predictive_scaler.forecasting.baselines import SeasonalNaiveForecaster
from predictive_scaler.forecasting.calibration import calibrate
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.series import load_trace
from predictive_scaler.spec import (
    DEFAULT_RECENT_WINDOW_SECONDS,
    MAX_RECENT_WINDOW_SECONDS,
    ScalerSpec,
)

REPO = Path(__file__).resolve().parents[2]
TRACE = load_trace(REPO / "backtests" / "traces" / "ms_mongodb_machine01_rps.csv").resample(300)
LONG = load_trace(REPO / "backtests" / "traces" / "nasa_http_1995.csv").resample(300)  # weekly seasons fit
SPEC = ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {"kind": "requests", "query": "up"},
                             "capacity": {"requestsPerReplica": 300.0}, "model": {"name": "llm"}})

FITS = {  # trace, training days, fit, steps it reads
    "arima-reads-one-day": (TRACE, 10, lambda train: ArimaForecaster().fit(train), 288),
    "seasonal-naive": (TRACE, 10, lambda train: SeasonalNaiveForecaster().fit(train), None),
    # A weekly season (2,017 steps) plus its coverage tracker's day: more than the 7 days (2,016
    # steps) the pull used to be capped at — a capped pull forecast differently from the backtest,
    # which hands every model its whole window (as a calibrated weekly quantile-regression reads).
    "tracked-weekly-seasonal-naive-reads-over-a-week": (
        LONG, 21, lambda train: calibrate(SeasonalNaiveForecaster().fit(train.slice(0, 19 * 288)), train,
                                          19 * 288 - 1, horizon_steps=6, tracking_rate=0.15), 2017 + 288 + 6),
}


@pytest.mark.parametrize(("trace", "days", "fit", "steps"), list(FITS.values()), ids=list(FITS))
def test_the_pull_is_what_the_model_reads_and_the_forecast_is_unchanged(tmp_path: Path, trace, days, fit,
                                                                       steps) -> None:
    train = trace.slice(0, days * 288)
    store = ModelStore(tmp_path)
    store.publish("llm", fit(train), series="llm", window=TrainingWindow.of(train))
    port = StoreModelPort(store, "llm", horizon_seconds=1800, quantile=0.95, expected_series="llm")
    assert port.window_steps is None  # nothing loaded yet: the default window
    port.refresh()
    model_steps = getattr(port.model, "window_steps", None)
    want = None if model_steps is None else min(model_steps, MAX_RECENT_WINDOW_SECONDS // 300)
    assert port.window_steps == want and (steps is None or want == steps)
    window = Reconciler(SPEC, None, port, None, None).recent_window  # type: ignore[arg-type]
    assert window == timedelta(seconds=300 * (want or DEFAULT_RECENT_WINDOW_SECONDS // 300))
    # The forecast from the pull is the forecast from all the days before it, number for number.
    end = (days + 2) * 288
    everything = trace.slice(0, end)
    pulled = trace.slice(end - int(window.total_seconds()) // 300, end)
    now = everything.end.to_pydatetime() + timedelta(seconds=60)
    a, b = port.forecast(everything, now), port.forecast(pulled, now)
    assert a.issued_at == b.issued_at
    np.testing.assert_array_equal(a.values, b.values)
