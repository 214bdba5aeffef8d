"""One training path: the backtest retrains through the retraining job's own function.

A backtest week and the CronJob's entry point (``retrain_scaler`` over a directory model
store) run on the same history at the same times: they select the same kind, reach the same
decision for the same reason (the pinball and coverage figures in it included) and serve
models that forecast the same numbers.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.backtest.adapters import (
    TraceHistory,
    Trainer,
    retrain_settings,
    run_predictive,
)
from predictive_scaler.backtest.records import prepare
from predictive_scaler.backtest.runner import initial_replicas
from predictive_scaler.backtest.scenario import Scenario
from predictive_scaler.backtest.simulator import ClusterConfig
from predictive_scaler.errors import InsufficientHistoryError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.retrain.job import retrain_scaler
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget
from tests.backtest.test_runner import daily_trace
from tests.test_retrain import FakeHistory

KINDS = ("persistence", "seasonal-naive")
# No metrics delay, so the step that ends at a retraining is observed by then in the backtest, as
# the job's history pulled at that time holds it; a 10-minute control period keeps the week cheap.
WEEK = Scenario(forecasters=KINDS, evaluation=timedelta(days=7, minutes=10), policies=("predictive",),
                control_period=timedelta(minutes=10), cluster=ClusterConfig.preset("karpenter", metrics_delay_s=0),
                spec={"prewarm": {"enabled": True, "budget": {"maxGpus": 8}}})


def test_a_backtest_week_and_the_retraining_job_select_and_promote_the_same_model(tmp_path: Path) -> None:
    trace = daily_trace(days=22)  # 14 days of training, then a week: the CronJob's own settings apply
    setup = prepare(trace, WEEK)
    settings, note = retrain_settings(setup)
    assert note is None and settings == RetrainSettings(kinds=KINDS)

    _, extras = run_predictive(setup, initial_replicas=initial_replicas(setup))
    backtest = extras["model_events"]

    target = ScalerTarget("backtest", "backtest", setup.spec)
    store = ModelStore(tmp_path)
    history = FakeHistory({target.key: trace})
    times = [setup.eval_start.to_pydatetime(), (setup.eval_start + pd.Timedelta(days=7)).to_pydatetime()]
    job = [retrain_scaler(target, history, store, RetrainSettings(kinds=KINDS), now, f"run-{i}")
           for i, now in enumerate(times)]

    assert [e.at for e in backtest] == [pd.Timestamp(t).isoformat() for t in times]
    assert [(e.kind, e.promoted, e.reason) for e in backtest] == \
        [(o.kind, o.result == "promoted", o.reason) for o in job]
    assert job[0].result == "promoted" and job[1].result in ("promoted", "kept")
    assert "serving" in job[1].reason  # the second run was judged against the first one's model

    # The model the job serves forecasts what the backtest's trainer serves, from the same recent data.
    trainer = Trainer(spec=setup.spec, settings=settings)
    for now in times:
        trainer.retrain(trace.until(pd.Timestamp(now) - trace.step), now)
    ours = trainer.store.load_serving("backtest").model
    theirs = store.serving("backtest", expected_series="backtest").model
    recent = trace.slice(len(trace) - 2016, len(trace))
    a = ours.forecast(recent, 6, (0.5, 0.85)).values
    b = theirs.forecast(recent, 6, (0.5, 0.85)).values
    assert np.allclose(a, b, rtol=1e-9)


def test_a_short_training_window_runs_the_job_with_scaled_settings_and_says_so() -> None:
    setup = prepare(daily_trace(days=9), replace(WEEK, evaluation=timedelta(days=1)))
    settings, note = retrain_settings(setup)
    assert settings.min_history == timedelta(days=7) and settings.holdout == timedelta(days=1)
    assert settings.min_fit == timedelta(days=4) and settings.kinds == KINDS
    assert note is not None and "the CronJob would skip this scaler" in note


def test_the_trace_history_refuses_what_the_prometheus_pull_refuses() -> None:
    trace = daily_trace(days=9)
    port = TraceHistory(trace)
    target = ScalerTarget("backtest", "backtest", None)
    end = (trace.start + pd.Timedelta(days=9)).to_pydatetime()
    with pytest.raises(InsufficientHistoryError):
        port.demand(target, end - timedelta(days=28), end, 300, min_history=timedelta(days=14),
                    max_missing_fraction=None)
    got = port.demand(target, end - timedelta(days=28), end, 300, min_history=timedelta(days=7),
                      max_missing_fraction=0.2)
    assert got.step_seconds == 300 and got.span == timedelta(days=9)


def test_one_default_candidate_list() -> None:
    from predictive_scaler.commands._flags import DEFAULT_MODELS
    from predictive_scaler.forecasting import defaults

    # The default variant's (chosen held out: backtests/results/heldout.md), Prophet and the ensemble included.
    assert registry.DEFAULT_CANDIDATES == defaults.DEFAULT_VARIANT.candidates
    assert {"prophet", "ensemble", "arima"} <= set(registry.DEFAULT_CANDIDATES) <= set(registry.FORECASTER_KINDS)
    assert tuple(DEFAULT_MODELS.split(",")) == registry.DEFAULT_CANDIDATES
    assert RetrainSettings().kinds == registry.DEFAULT_CANDIDATES
    assert Scenario().forecasters == registry.DEFAULT_CANDIDATES
