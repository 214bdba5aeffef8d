"""Several scalers sharing one cluster-wide budget: the backtest runs the controller's pure rule too."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from predictive_scaler.backtest.fleet import FleetResult, run_fleet
from predictive_scaler.backtest.scenario import Scenario, load_scenario
from predictive_scaler.errors import ConfigError
from predictive_scaler.series import Series, load_trace

ROOT = Path(__file__).resolve().parents[2]
#: A bundled trace (10-minute steps, 14 days): 7 days of training, one day evaluated per minute.
TRACE = ROOT / "backtests" / "traces" / "servegen_m_small.csv"


@pytest.fixture(scope="module")
def trace() -> Series:
    return load_trace(TRACE)


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    shared = load_scenario(ROOT / "backtests" / "shared-budget.yaml")
    return replace(shared, evaluation=timedelta(days=1),
                   forecasters=("persistence", "seasonal-naive"))


@pytest.fixture(scope="module")
def capped(trace: Series, scenario: Scenario) -> FleetResult:
    return run_fleet(trace, scenario)


def test_the_cluster_budget_is_never_exceeded_audited_every_minute(capped: FleetResult, scenario: Scenario) -> None:
    cap = scenario.cluster_budget
    assert cap is not None and capped.max_gpus == cap["maxGpus"]
    assert [s.name for s in capped.scalers] == [x["name"] for x in scenario.scalers]
    assert all(s.run.tick_s == 60 for s in capped.scalers)  # audited every minute
    total = capped.total_speculative
    assert total.size == 24 * 60
    assert int(total.max()) <= cap["maxGpus"]
    assert capped.minutes_over_budget == 0
    assert capped.to_dict()["minutes_over_cluster_budget"] == 0


def test_the_cap_binds(capped: FleetResult, trace: Series, scenario: Scenario) -> None:
    """Without the cluster cap the same scalers take more together: the cap, not chance, held the sum."""
    loose = run_fleet(trace, replace(scenario, cluster_budget={"maxGpus": 10_000}))
    assert int(loose.total_speculative.max()) > scenario.cluster_budget["maxGpus"]  # type: ignore[index]
    assert sum(s.share_below_own_ticks for s in capped.scalers) > 0
    assert np.all(loose.total_speculative >= 0)
    # Each scaler stays within its own budget either way.
    for run in (*capped.scalers, *loose.scalers):
        assert int(run.speculative.max()) <= 8


@pytest.mark.parametrize(("doc", "field"), [
    ({"scalers": [{"name": "a"}, {"name": "a"}]}, "scalers"),
    ({"scalers": [{"peak_replicas": 3}]}, "scalers[0]"),
    ({"scalers": [{"name": "a", "replicas": 3}]}, "scalers[0].replicas"),
    ({"cluster_budget": {"maxGpus": -1}}, "cluster_budget.maxGpus"),
    ({"cluster_budget": {"gpus": 4}}, "cluster_budget"),
], ids=["duplicate-names", "no-name", "unknown-key", "negative-cap", "unknown-cap"])
def test_bad_fleet_settings_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Scenario.from_dict(doc)
    assert err.value.field == field


def test_a_one_scaler_scenario_is_unchanged() -> None:
    assert "scalers" not in Scenario().to_dict() and "cluster_budget" not in Scenario().to_dict()


def test_a_cost_cap_is_shared_too(trace: Series, scenario: Scenario) -> None:
    fleet = run_fleet(trace, replace(scenario, cluster_budget={"maxCostPerHour": 12.5}))  # 5 GPUs at 2.5/h
    assert fleet.minutes_over_budget == 0
    assert float(fleet.total_cost_per_hour.max()) <= 12.5 and int(fleet.total_speculative.max()) <= 5
