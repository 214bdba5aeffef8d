"""The artifacts committed under models/ (trained on the bundled trace) load, verify and forecast."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.series import load_trace

REPO = Path(__file__).resolve().parents[2]


def test_bundled_nasa_model_verifies_and_forecasts() -> None:
    loaded = ModelStore(REPO / "models").serving("nasa_http_1995", expected_series="nasa_http_1995")
    trace = load_trace(REPO / "backtests" / "traces" / "nasa_http_1995.csv").resample(loaded.model.step_seconds)
    forecast = loaded.model.forecast(trace.tail(7 * 288), 6, (0.5, 0.95))
    p50, p95 = forecast.quantile(0.5), forecast.quantile(0.95)
    assert np.all(np.isfinite(p95)) and np.all(p95 > p50) and np.all(p50 > 0)
    assert loaded.manifest.metrics  # evaluation figures travel with the model
