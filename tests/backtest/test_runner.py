"""The harness end to end on a small synthetic trace, and the ports it plugs into the Reconciler."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler import reconcile
from predictive_scaler.backtest.adapters import TraceMetrics
from predictive_scaler.backtest.records import PEAK_FACTOR_QUANTILE, intra_step_peak_factor, prepare
from predictive_scaler.backtest.runner import run_backtest
from predictive_scaler.backtest.scenario import POLICIES, Scenario, load_scenario
from predictive_scaler.errors import ConfigError, InsufficientHistoryError, SourceError
from predictive_scaler.series import Series

START = pd.Timestamp("2024-01-01T00:00:00Z")


def daily_trace(days: int = 9, step: int = 300, seed: int = 1) -> Series:
    n = days * 86400 // step
    t = np.arange(n) * step
    rng = np.random.default_rng(seed)
    values = 100 + 60 * np.sin(2 * np.pi * t / 86400) + rng.normal(0, 4, n)
    return Series(np.clip(values, 1, None), START, step, name="synthetic")


FAST = Scenario(forecasters=("persistence",), evaluation=timedelta(days=1),
                spec={"prewarm": {"enabled": True, "budget": {"maxGpus": 8}}})


@pytest.fixture(scope="module")
def result():
    return run_backtest(daily_trace(), FAST)


def test_every_policy_runs_side_by_side_and_json_matches_the_issue(result) -> None:  # noqa: ANN001
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert set(doc) == {"scenario", "bound", "policies", "forecast"}
    assert set(doc["policies"]) == set(POLICIES)
    keys = {"gpu_hours", "cost", "slo_attainment", "unmet_minutes", "unserved_requests", "prewarm_gpu_hours",
            "wasted_prewarm_cost", "wasted_placeholder_cost", "wasted_replica_cost", "scale_events",
            "reactive_minutes", "max_speculative_gpus", "minutes_over_budget"}
    for name, m in doc["policies"].items():
        assert set(m) == keys, name
        assert 0.0 <= m["slo_attainment"] <= 1.0
        assert m["gpu_hours"] >= doc["bound"]["gpu_hours"] - 1e-9, f"{name} beat the physical bound"
    assert doc["forecast"]["quantile"] == 0.95
    assert set(doc["forecast"]["horizons"]) == {"10m", "20m", "30m"}
    assert doc["policies"]["oracle"]["slo_attainment"] == pytest.approx(1.0)
    assert doc["policies"]["static"]["reactive_minutes"] is None
    for name, m in doc["policies"].items():
        assert m["wasted_placeholder_cost"] + m["wasted_replica_cost"] == pytest.approx(m["wasted_prewarm_cost"])
        if name == "predictive":  # the one budgeted policy: audited every minute against the counterfactual
            assert m["minutes_over_budget"] == 0 and 0 <= m["max_speculative_gpus"] <= 8
        else:
            assert m["max_speculative_gpus"] is None and m["minutes_over_budget"] is None


def test_peak_replicas_sizes_from_the_training_window_only() -> None:
    trace = daily_trace()
    spiked = Series(np.concatenate([trace.values[:-10], np.full(10, 1e6)]), trace.start, trace.step_seconds)
    a, b = prepare(trace, FAST), prepare(spiked, FAST)
    assert a.capacity_per_replica == b.capacity_per_replica
    train = trace.values[: 7 * 288]
    assert a.capacity_per_replica == pytest.approx(np.percentile(train, 95) / 10)
    assert a.max_replicas == 20


PEAK_CASES = [
    # (id, one 5-minute step of 1-minute samples repeated, trace step, expected factor)
    ("flat", [10.0] * 5, 60, 1.0),
    ("bursts", [5.0, 5.0, 30.0, 30.0, 30.0], 60, 1.5),  # mean 20: 3 of 5 minutes at 1.5 × the mean
    ("trace-as-coarse-as-the-model", [5.0, 30.0], 300, 1.0),
]


@pytest.mark.parametrize(("step_values", "trace_step", "expected"), [c[1:] for c in PEAK_CASES],
                         ids=[c[0] for c in PEAK_CASES])
def test_intra_step_peak_factor(step_values: list[float], trace_step: int, expected: float) -> None:
    values = np.tile(step_values, 50)
    assert intra_step_peak_factor(values, trace_step, 300) == pytest.approx(expected)


def test_a_step_wholly_inside_a_gap_is_skipped_without_a_warning() -> None:
    values = np.tile([5.0, 5.0, 30.0, 30.0, 30.0], 50)
    values[10:20] = np.nan  # two whole model steps missing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert intra_step_peak_factor(values, 60, 300) == pytest.approx(1.5)


def test_peak_factor_comes_from_the_training_window_only() -> None:
    minute = daily_trace(step=60)
    rng = np.random.default_rng(3)
    bursty = minute.values * rng.choice([0.5, 2.5], size=len(minute), p=[0.75, 0.25])
    train = 7 * 1440
    calm_future = Series(np.concatenate([bursty[:train], minute.values[train:]]), minute.start, 60)
    a, b = prepare(Series(bursty, minute.start, 60), FAST), prepare(calm_future, FAST)
    factor = a.spec.demand.intra_step_peak_factor
    assert factor == b.spec.demand.intra_step_peak_factor > 1.2
    ratios = bursty[:train].reshape(-1, 5) / bursty[:train].reshape(-1, 5).mean(axis=1, keepdims=True)
    assert factor == pytest.approx(np.quantile(ratios, PEAK_FACTOR_QUANTILE), abs=1e-3)
    pinned = prepare(calm_future, replace(FAST, spec={**FAST.spec, "demand": {"intraStepPeakFactor": 1.2}}))
    assert pinned.spec.demand.intra_step_peak_factor == 1.2


@pytest.mark.parametrize(
    ("days", "training_days"), [(9, 7), (14, 7), (21, 14)], ids=["short", "exactly-14", "three-weeks"],
)
def test_training_window_rule(days: int, training_days: int) -> None:
    setup = prepare(daily_trace(days, step=1800), replace(FAST, evaluation=None))
    assert setup.training == timedelta(days=training_days)
    assert setup.n_ticks * setup.tick_s == (days - training_days) * 86400


def test_too_short_a_trace_is_refused() -> None:
    with pytest.raises(InsufficientHistoryError):
        prepare(daily_trace(5), FAST)


def _idle_until(trace: Series, live_steps: int) -> Series:
    """``trace`` as if its service launched ``live_steps`` steps before the end of a 7-day training window."""
    values = np.array(trace.values, dtype=float)
    values[: 7 * 86400 // trace.step_seconds - live_steps] = 0.0
    return replace(trace, values=values)


def test_a_service_launched_late_in_the_training_window_is_sized_on_its_traffic_since() -> None:
    """The window's P95 is zero (idle most of it): the replicas are sized on the steps after it first moved."""
    trace = daily_trace(9, step=1800)
    launched = _idle_until(trace, 12)
    setup = prepare(launched, replace(FAST, evaluation=None))
    live = launched.values[7 * 48 - 12: 7 * 48]
    assert setup.capacity_per_replica == pytest.approx(np.percentile(live, 95) / FAST.peak_replicas)


def test_a_training_window_idle_throughout_is_refused() -> None:
    trace = daily_trace(9, step=1800)
    with pytest.raises(InsufficientHistoryError, match="P95 of the training window is 0.*capacity_per_replica"):
        prepare(_idle_until(trace, 0), replace(FAST, evaluation=None))


def test_predictive_policy_runs_through_the_reconciler(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[datetime] = []
    real_step = reconcile.Reconciler.step

    def counting_step(self, state):  # noqa: ANN001, ANN202
        calls.append(self.clock.now())
        return real_step(self, state)

    monkeypatch.setattr(reconcile.Reconciler, "step", counting_step)
    scenario = replace(FAST, policies=("predictive",), evaluation=timedelta(hours=6))
    res = run_backtest(daily_trace(), scenario)
    setup = res.setup
    assert len(calls) == setup.n_ticks // setup.control_every
    assert calls[0] == setup.eval_start.to_pydatetime()
    assert calls[1] - calls[0] == timedelta(seconds=scenario.control_period_s)
    assert res.forecasts is not None and res.forecasts.values.shape[0] > 0


@pytest.mark.parametrize(
    ("now_s", "demand", "last_step_start_min", "last_mean"),
    [
        (630, 9.0, 0, 2.0),    # seen = 9m30s: [5m, 10m) is not complete yet
        (660, 10.0, 5, 7.0),   # seen = 10m: it is
    ],
    ids=["step-incomplete", "step-complete"],
)
def test_trace_metrics_show_only_the_past(now_s: int, demand: float, last_step_start_min: int, last_mean: float) -> None:
    trace = Series(np.arange(20, dtype=float), START, 60)
    metrics = TraceMetrics(trace, delay_s=60)
    now = (START + pd.Timedelta(seconds=now_s)).to_pydatetime()
    assert metrics.demand_now(now).value == demand  # the value 60 s old
    recent = metrics.recent(now, timedelta(minutes=10), 300)
    assert recent.last_time == START + pd.Timedelta(minutes=last_step_start_min)
    assert recent.values[-1] == pytest.approx(last_mean)


def test_trace_gap_is_a_source_error_not_zero() -> None:
    trace = Series(np.array([1.0, np.nan, 3.0]), START, 60)
    metrics = TraceMetrics(trace, delay_s=0)
    with pytest.raises(SourceError):
        metrics.demand_now((START + pd.Timedelta(seconds=90)).to_pydatetime())


@pytest.mark.parametrize("name", ["default", "karpenter", "cluster-autoscaler"])
def test_bundled_scenarios_load(name: str) -> None:
    scenario = load_scenario(f"backtests/{name}.yaml")
    assert scenario.name == name
    assert scenario.spec["prewarm"]["budget"]["maxGpus"] > 0


@pytest.mark.parametrize(
    ("data", "field"),
    [({"preset": "gke"}, "preset"), ({"control_period": "0s"}, "control_period"), ({"bogus": 1}, "bogus"),
     ({"policies": ["magic"]}, "policies"), ({"cluster": {"gpus_per_node": 0}}, "gpus_per_node")],
    ids=["preset", "control-period", "unknown-key", "policy", "cluster"],
)
def test_bad_scenarios_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Scenario.from_dict(data)
    assert err.value.field is not None and field in err.value.field


def test_start_time_is_utc() -> None:
    assert prepare(daily_trace(), FAST).eval_start.tzinfo is not None
    assert prepare(daily_trace(), FAST).eval_start.to_pydatetime().utcoffset() == UTC.utcoffset(None)


def test_scenario_spec_section_is_validated_when_loaded(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "s.yaml"
    path.write_text("spec:\n  minReplicas: 50\n  maxReplicas: 3\n")
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert "minReplicas" in (err.value.field or "")


@pytest.mark.parametrize("kind", ["holt-winters", "seasonal-naive", "persistence"])
def test_served_forecasts_are_what_forecast_returns_and_ignore_the_future(kind: str) -> None:
    from predictive_scaler.backtest.adapters import ServedModel
    from predictive_scaler.forecasting import registry

    trace = daily_trace(9)
    model = registry.forecaster(kind).fit(trace.slice(0, 7 * 288))
    first, last = 7 * 288, 7 * 288 + 40
    poisoned = Series(np.concatenate([trace.values[:2037], trace.values[2037:] * 10]), trace.start, 300)
    for series in (trace, poisoned):
        served = ServedModel(model, "v1", horizon_steps=6, quantiles=(0.5, 0.95), recent_steps=288)
        served.precompute(series, first, last)
        for origin in (first, 2030, 2036):
            recent = trace.slice(origin + 1 - 288, origin + 1)   # what the reconciler hands over
            got = served.forecast(recent, recent.last_time.to_pydatetime()).values
            direct = model.forecast(recent, 6, (0.5, 0.95)).values
            np.testing.assert_allclose(got, direct, rtol=1e-6)


@pytest.mark.parametrize(
    "kind", ["holt-winters", "ensemble", "calibrated-holt-winters"], ids=["holt-winters", "ensemble", "calibrated"])
def test_a_batch_over_a_whole_period_is_served_when_the_model_reads_only_its_window(kind: str) -> None:
    """The batch (one walk_forward over the period, all history before it handed over) is what a
    direct forecast from the reconciler's recent window gives at every origin, so it is served:
    no rejection, and every served forecast equals the direct one."""
    from predictive_scaler.backtest.adapters import ServedModel
    from predictive_scaler.forecasting import registry
    from predictive_scaler.forecasting.calibration import calibrate

    trace = daily_trace(9)
    if kind == "calibrated-holt-winters":
        base = registry.forecaster("holt-winters").fit(trace.slice(0, 6 * 288))
        model = calibrate(base, trace.slice(0, 7 * 288), 6 * 288 - 1, quantiles=(0.5, 0.95), horizon_steps=6)
    else:
        model = registry.forecaster(kind).fit(trace.slice(0, 7 * 288))
    first, last = 7 * 288, 7 * 288 + 150
    served = ServedModel(model, "v1", horizon_steps=6, quantiles=(0.5, 0.95))
    served.precompute(trace, first, last)
    assert served.batch_rejections == 0
    for origin in range(first, last + 1, 10):
        recent = trace.slice(origin + 1 - served.recent_steps, origin + 1)
        got = served.forecast(recent, recent.last_time.to_pydatetime()).values
        np.testing.assert_allclose(got, model.forecast(recent, 6, (0.5, 0.95)).values, rtol=1e-9)


def test_through_an_outage_longer_than_the_window_the_batch_refuses_as_the_model_does() -> None:
    """Origins whose window holds no observation get no forecast, batched or direct, and the
    reconciler's asks every tick of such a step cost no forecast each: the batch's refusal was
    checked against the model's own, and a refusal is remembered per step of data."""
    from predictive_scaler.backtest.adapters import ServedModel
    from predictive_scaler.errors import ModelError
    from predictive_scaler.forecasting import registry

    trace = daily_trace(12)
    model = registry.forecaster("arima").fit(trace.slice(0, 7 * 288))
    values = trace.values.copy()
    values[7 * 288:9 * 288] = np.nan  # two days without data
    gappy = Series(values, trace.start, 300)
    first, last = 7 * 288, 10 * 288

    served = ServedModel(model, "v1", horizon_steps=6, quantiles=(0.5, 0.95))
    calls = []
    direct = model.forecast

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return direct(*args, **kwargs)

    object.__setattr__(model, "forecast", counted)
    served.precompute(gappy, first, last)
    assert served.batch_rejections == 0
    checks = len(calls)
    blind = 8 * 288 + 100
    recent = gappy.slice(blind + 1 - served.recent_steps, blind + 1)
    for _ in range(5):  # five ticks of one step
        with pytest.raises(ModelError, match="too few"):
            served.forecast(recent, recent.last_time.to_pydatetime())
    assert len(calls) == checks
    # Another operating point of a frontier shares the refusals (it has no batch of its own).
    again = ServedModel(model, "v1", horizon_steps=6, quantiles=(0.5, 0.95), refusals=served.refusals)
    with pytest.raises(ModelError, match="too few"):
        again.forecast(recent, recent.last_time.to_pydatetime())
    assert len(calls) == checks
    with pytest.raises(ModelError, match="too few"):
        direct(recent, 6, (0.5, 0.95))
    back = 9 * 288 + 12  # an hour after the data is back: a forecast again
    recent = gappy.slice(back + 1 - served.recent_steps, back + 1)
    assert np.all(np.isfinite(served.forecast(recent, recent.last_time.to_pydatetime()).values))
