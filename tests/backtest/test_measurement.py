"""The measurement chain: every policy but the oracle sees demand as the controller's query returns it.

``rate(counter[window])`` of counters scraped every ``scrape_interval``, evaluated ``metrics_delay_s``
after the reconcile time: a demand step reaches the planner late and smoothed over the window, never at
once. The oracle keeps perfect knowledge. A trace coarser than the window widens it to one trace step.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler import reconcile
from predictive_scaler.backtest import peer_policies
from predictive_scaler.backtest.records import prepare
from predictive_scaler.backtest.runner import Result, planner_metric, run_backtest
from predictive_scaler.backtest.scenario import MeasurementChain, Scenario
from predictive_scaler.errors import ConfigError
from predictive_scaler.series import Series

START = pd.Timestamp("2024-01-01T00:00:00Z")
LOW, HIGH = 12.0, 28.0
#: 18:20 of the evaluated day (the 8th): demand steps from LOW to HIGH there every day.
ONSET = START + pd.Timedelta(days=7, hours=18, minutes=20)


def _stepping_trace(days: int = 8) -> Series:
    t = np.arange(days * 1440) * 60
    minute_of_day = (t % 86400) // 60
    values = np.where((minute_of_day >= 18 * 60 + 20) & (minute_of_day < 20 * 60), HIGH, LOW)
    return Series(values.astype(float), START, 60, name="step")


def _scenario(**kw: object) -> Scenario:
    return Scenario(forecasters=("persistence",), evaluation=timedelta(days=1), policies=("predictive", "reactive"),
                    spec={"prewarm": {"enabled": True, "budget": {"maxGpus": 8}}}, **kw)  # type: ignore[arg-type]


def _seen_by_planner(monkeypatch: pytest.MonkeyPatch, scenario: Scenario) -> tuple[dict[float, float], Result]:
    """Run the backtest, recording the demand the planner was handed at each reconcile (seconds from ONSET)."""
    seen: dict[float, float] = {}
    real = reconcile.plan

    def spy(spec, forecast, demand, *args, **kwargs):  # type: ignore[no-untyped-def]
        now = args[2]
        seen[now.timestamp() - ONSET.timestamp()] = demand.value if demand is not None else float("nan")
        return real(spec, forecast, demand, *args, **kwargs)

    monkeypatch.setattr(reconcile, "plan", spy)
    return seen, run_backtest(_stepping_trace(), scenario)


def test_a_demand_step_reaches_the_planner_delayed_and_smoothed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, result = _seen_by_planner(monkeypatch, _scenario())
    around = {at: seen[at] for at in (-60.0, 0.0, 60.0, 120.0, 180.0, 240.0)}
    # Delay 60 s, scrapes every 30 s, [2m]: at t the mean over [t − 180 s, t − 60 s].
    assert around == {-60.0: LOW, 0.0: LOW, 60.0: LOW, 120.0: (LOW + HIGH) / 2, 180.0: HIGH, 240.0: HIGH}
    # The reactive peer and the budget's counterfactual are fed the same signal, tick by tick.
    setup = result.setup
    metric = planner_metric(setup)
    at = {float(i * setup.tick_s + setup.eval_start.timestamp() - ONSET.timestamp()): v for i, v in enumerate(metric)}
    assert {k: at[k] for k in around} == around
    # The oracle alone sees the step as it happens.
    assert setup.demand.values[int((ONSET - setup.eval_start).total_seconds() // setup.tick_s)] == HIGH
    # The report says which chain ran.
    chain = result.to_json()["scenario"]["measurement"]
    assert chain["scrape_interval"] == "30s" and chain["rate_window"] == "2m" and chain["delay"] == "60s"
    assert chain["reconcile_interval"] == "1m" and chain["effective_rate_window"] == "2m" and not chain["exact"]


def test_the_exact_signal_hands_the_step_over_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, result = _seen_by_planner(monkeypatch, _scenario(measurement=MeasurementChain(exact=True)))
    assert [seen[at] for at in (0.0, 60.0, 120.0)] == [LOW, HIGH, HIGH]  # the whole step, one delay late
    assert "no controller" in result.to_json()["scenario"]["measurement"]["seen"]


def test_a_coarse_trace_widens_the_window_to_its_step() -> None:
    """A 5-minute value is its step's mean: a [2m] window would resolve what the trace does not hold, and
    read the part of a step after the scrape. The window is one trace step: never finer, never ahead."""
    values = np.array([10.0, 20.0, 30.0, 40.0])
    chain = MeasurementChain()
    assert chain.window_for(300) == 300 and chain.window_for(60) == 120
    t0 = START.timestamp()
    got = chain.signal(values, t0, 300, t0 + np.array([600.0, 660.0, 750.0, 900.0]), 60)
    # Scrapes at 540, 600, 690, 840 s: means over the 300 s before each.
    assert got == pytest.approx([18.0, 20.0, 23.0, 28.0])
    setup = prepare(Series(np.full(9 * 288, 5.0), START, 300, name="coarse"), Scenario(evaluation=timedelta(days=1)))
    described = setup.describe()["measurement"]
    assert described["effective_rate_window"] == "5m" and "widened" in described["seen"]
    assert setup.spec.drift.signal_lag_seconds == 300 + 30


def test_a_gap_is_missing_not_zero() -> None:
    """The scrape that closes a gap step has no sample: no value (the planner holds), not a fall in demand."""
    values = np.array([8.0, np.nan, 8.0, 8.0])
    t0 = START.timestamp()
    got = MeasurementChain().signal(values, t0, 60, t0 + np.array([120.0, 150.0, 240.0]), 0)
    assert np.isnan(got[0]) and got[1] == 8.0 and got[2] == 8.0


def test_peers_and_planner_read_one_function() -> None:
    trace = _stepping_trace()
    times = ONSET.timestamp() + np.arange(0, 300, 30.0)
    chain = MeasurementChain(scrape_interval_s=15, rate_window_s=60)
    assert np.array_equal(peer_policies.observed(trace, times, chain, 30),
                          chain.signal(trace.values, START.timestamp(), 60, times, 30), equal_nan=True)


@pytest.mark.parametrize(
    ("measurement", "field"),
    [({"scrape_interval": "0s"}, "measurement.scrape_interval"),
     ({"scrape_interval": "30s", "rate_window": "45s"}, "measurement.rate_window"),
     ({"rate_window": "2h"}, "measurement.rate_window"),
     ({"exact": "yes"}, "measurement.exact"),
     ({"delay": "30s"}, "measurement.delay"),
     ("2m", "measurement")],
    ids=["no-scrape", "window-under-two-scrapes", "window-too-long", "exact-not-bool", "delay-is-the-clusters",
         "not-a-mapping"],
)
def test_a_bad_chain_is_refused_when_read(measurement: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Scenario.from_dict({"measurement": measurement})
    assert err.value.field == field


def test_the_chain_round_trips_and_defaults_as_the_shipped_examples() -> None:
    default = Scenario().measurement
    assert (default.scrape_interval_s, default.rate_window_s, default.exact) == (30, 120, False)
    custom = Scenario.from_dict({"measurement": {"scrape_interval": "15s", "rate_window": "1m"}})
    assert Scenario.from_dict({"measurement": custom.to_dict()["measurement"]}).measurement == custom.measurement
