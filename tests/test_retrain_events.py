"""The weekly retraining hands a scaler's past scheduled events to Prophet as holidays."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.retrain import job as retrain
from predictive_scaler.retrain import (
    training,  # the training function: monkeypatched where it looks names up
)
from tests.test_retrain import FAST, START, FakeHistory, synthetic, target


def test_past_occurrences_reach_prophet_as_holidays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = training.train_model

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("options"))
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "train_model", recording)
    t = target("chat", events=[{"name": "launch", "start": "2026-01-06T10:00:00+01:00",
                                "end": "2026-01-06T12:00:00+01:00", "minReplicas": 3, "recurrence": "weekly"}])
    now = START + timedelta(days=16)
    outcome = retrain.retrain_scaler(t, FakeHistory({t.key: synthetic(16)}), ModelStore(tmp_path), FAST, now, "r")
    assert outcome.result == "promoted", outcome.reason
    [options] = seen
    windows = options["prophet"]["holidays"]
    # Tuesdays 09:00-11:00 UTC inside the fit part (the last 2 days are held out): Jan 6 and Jan 13.
    assert [(name, pd.Timestamp(s, unit="s", tz="UTC").isoformat(), (e - s) / 3600) for name, s, e in windows] == [
        ("launch", "2026-01-06T09:00:00+00:00", 2.0), ("launch", "2026-01-13T09:00:00+00:00", 2.0)]


def test_no_events_no_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = training.train_model
    monkeypatch.setattr(training, "train_model", lambda *a, **k: seen.append(k.get("options")) or real(*a, **k))
    t = target("plain")
    retrain.retrain_scaler(t, FakeHistory({t.key: synthetic(16)}), ModelStore(tmp_path), FAST,
                           START + timedelta(days=16), "r")
    assert seen == [{}]
