"""The backtest's bounds: every bundled scenario and shipped example fits the work bound, a spec whose
simulation would not is refused before anything runs (naming the setting), and the cluster's settings
are checked against what the spec they become allows."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from predictive_scaler.backtest.records import prepare
from predictive_scaler.backtest.runner import MAX_SIMULATION_WORK, check_work, planned_runs
from predictive_scaler.backtest.scenario import Scenario, build_spec, deep_merge, load_scenario
from predictive_scaler.commands.backtest import frontier_points
from predictive_scaler.commands.backtest_scaler import scenario_for_scaler
from predictive_scaler.errors import ConfigError, InsufficientHistoryError
from predictive_scaler.series import Series, load_trace
from predictive_scaler.spec import MAX_REPLICAS

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "backtests").glob("*.yaml"))
#: The bundled traces long enough to backtest (the Azure LLM ones are an hour each).
TRACES = [p for p in sorted((REPO / "backtests" / "traces").glob("*.csv")) if "azure" not in p.name]
EXAMPLES = REPO / "deploy" / "examples"


@pytest.fixture(scope="module")
def traces() -> dict[str, Series]:
    return {p.name: load_trace(p, min_history=None) for p in TRACES}


def work(setup: Any, *, frontier: bool) -> float:
    return sum(r.work(setup) for r in planned_runs(setup, frontier_points() if frontier else None))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_bundled_scenario_fits_the_work_bound_on_every_bundled_trace(path: Path,
                                                                          traces: dict[str, Series]) -> None:
    scenario = load_scenario(path)
    subs = [scenario] if not scenario.scalers else [
        Scenario(**{**scenario.__dict__, "scalers": (), "cluster_budget": None, "policies": ("predictive",),
                    "peak_replicas": s.get("peak_replicas", scenario.peak_replicas),
                    "spec": deep_merge(scenario.spec, s["spec"])}) for s in scenario.scalers]
    for name, trace in traces.items():
        for sub in subs:
            try:
                setup = prepare(trace, sub)
            except InsufficientHistoryError:  # a trace the backtest refuses (too short, all zero) runs nothing
                continue
            for frontier in (False, True):
                check_work(setup, frontier_points() if frontier else None)
                assert work(setup, frontier=frontier) < MAX_SIMULATION_WORK / 3, (path.name, name, frontier)


def _example_specs() -> list[tuple[str, dict[str, Any]]]:
    base = yaml.safe_load((EXAMPLES / "vllm-forecast-only" / "predictivescaler.yaml").read_text())["spec"]
    keda = next(d for d in yaml.safe_load_all((EXAMPLES / "vllm-keda" / "predictivescaler-keda.yaml").read_text())
                if d)["spec"]  # a kustomize patch over the forecast-only example
    return [("vllm-forecast-only", base), ("vllm-keda", deep_merge(base, keda))]


@pytest.mark.parametrize(("name", "spec"), _example_specs(), ids=[n for n, _ in _example_specs()])
def test_every_shipped_example_fits_the_work_bound(name: str, spec: dict[str, Any],
                                                   traces: dict[str, Series]) -> None:
    setup = prepare(traces["nasa_http_1995.csv"], scenario_for_scaler(load_scenario(None), spec).scenario)
    check_work(setup, frontier_points())


EVENT = {"name": "launch", "start": "2024-01-16T00:00:00Z", "end": "2024-01-17T00:00:00Z"}
GOOD_SPEC = {"target": {"name": "web"}, "demand": {"query": "q"}, "capacity": {"requestsPerReplica": 10}}


@pytest.mark.parametrize(("spec", "says"), [
    ({"maxReplicas": MAX_REPLICAS, "events": [{**EVENT, "minReplicas": MAX_REPLICAS}]},
     "spec.events[0].minReplicas 100,000"),
    ({"maxReplicas": MAX_REPLICAS, "minReplicas": MAX_REPLICAS}, "min_replicas 100,000 (spec.minReplicas)"),
], ids=["event-floor", "min-replicas"])
def test_a_simulation_past_the_work_bound_is_refused_naming_the_setting(spec: dict[str, Any], says: str,
                                                                         traces: dict[str, Series]) -> None:
    trace = traces["nasa_http_1995.csv"]
    mapped = scenario_for_scaler(load_scenario(None), {**GOOD_SPEC, **copy.deepcopy(spec)})
    events = [{**e, "start": "1995-07-20T00:00:00Z", "end": "1995-07-21T00:00:00Z"} for e in spec.get("events", [])]
    scenario = Scenario(**{**mapped.scenario.__dict__,
                           "spec": {**mapped.scenario.spec, **({"events": events} if events else {})}})
    with pytest.raises(ConfigError, match="replica-ticks") as info:
        check_work(prepare(trace, scenario))
    assert says in str(info.value)


def test_a_big_max_replicas_with_small_demand_is_not_refused(traces: dict[str, Series]) -> None:
    # The bound is on the replicas a run can reach, not on the cap: a generous maxReplicas costs nothing.
    mapped = scenario_for_scaler(load_scenario(None), {**GOOD_SPEC, "maxReplicas": MAX_REPLICAS,
                                                        "capacity": {"requestsPerReplica": 100}})
    check_work(prepare(traces["nasa_http_1995.csv"], mapped.scenario))


@pytest.mark.parametrize(("cluster", "spec", "says"), [
    ({"metrics_delay_s": 86400}, {}, "longer than spec.demand.maxAgeSeconds (180 s)"),
    ({"metrics_delay_s": 600}, {"horizonSeconds": 600, "demand": {"maxAgeSeconds": 3600}},
     "is not shorter than spec.horizonSeconds (600 s)"),
], ids=["stale", "beyond-horizon"])
def test_a_metrics_delay_the_spec_cannot_work_with_is_refused(cluster: dict[str, Any], spec: dict[str, Any],
                                                               says: str) -> None:
    scenario = Scenario.from_dict({"cluster": cluster, "spec": spec})
    with pytest.raises(ConfigError, match="cluster.metrics_delay_s") as info:
        build_spec(scenario, capacity=1.0, max_replicas=20, model_step=300)
    assert says in str(info.value)


@pytest.mark.parametrize(("data", "says"), [
    ({1: "x"}, "1 (int) is not a setting name"),
    ({"cluster": {None: 4}}, "cluster: None (NoneType) is not a setting name"),
    ({"measurement": {True: "30s"}}, "measurement: True (bool) is not a setting name"),
    ({"cluster": {"price_per_gpu_hour": 1e308}}, "cluster.price_per_gpu_hour 1e+308"),
    ({"cluster": {"gpus_per_node": 10**8}}, "cluster.gpus_per_node 100000000"),
    ({"peak_replicas": float("inf")}, "peak_replicas must be a whole number, got inf"),
    ({"capacity_per_replica": 10**400}, "capacity_per_replica must be a finite number, got a 401-digit number"),
], ids=["int-key", "null-key", "bool-key", "price", "gpus-per-node", "infinite-peak", "huge-capacity"])
def test_scenario_values_are_refused_by_name(data: dict[Any, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        Scenario.from_dict(data)
    assert says in str(info.value)
