"""Run every policy of a scenario over one trace, side by side, and measure them.

Protocol (:mod:`~predictive_scaler.backtest.records`): the first ``training`` of the
trace (14 days; 7 for traces shorter than 21 days) is history only — it sizes the
replicas (``peak_replicas``), trains the first model and the Holt-Winters peer. The
rest is walked forward tick by tick; the predictive policy's models are retrained every
``retrain_every`` by the retraining job's own function on what was observed so far, and
every policy starts the evaluation from a warm cluster running the replicas its first
tick needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np

from predictive_scaler.backtest import peer_policies
from predictive_scaler.backtest.adapters import PredictiveCache, forecast_accuracy, run_predictive
from predictive_scaler.backtest.measures import (
    BoundMeasures,
    BudgetAudit,
    HorizonAccuracy,
    PolicyMeasures,
    audit_budget,
    measure_bound,
    measure_policy,
    ratio,
)
from predictive_scaler.backtest.records import ForecastRecord, ModelEvent, Progress, Setup, prepare
from predictive_scaler.backtest.scenario import Scenario
from predictive_scaler.backtest.simulator import PolicyRun, SimulatedCluster, simulate
from predictive_scaler.errors import ConfigError
from predictive_scaler.policy.budget import allowance
from predictive_scaler.series import Series, format_duration

# The protocol's names, as the runner has always offered them.
__all__ = ["MAX_SIMULATION_WORK", "Result", "check_work", "run_backtest"]

#: Step the Holt-Winters peer is fitted at.
HOLT_WINTERS_STEP = 900
#: Daily season, in seconds.
DAY_S = 86400
#: Most simulation work one backtest takes on, in replica-ticks: each tick of each policy's run walks
#: every replica and node of its simulated cluster, and placing a replica scans the nodes. A
#: replica-tick costs about 0.1 µs on a 2-core machine, so this is about two minutes of simulation;
#: the bundled scenarios on the bundled traces and the shipped examples need at most 3e8, --frontier
#: included (tests/backtest/test_scenario_bounds.py checks them all).
MAX_SIMULATION_WORK = 1e9


@dataclass
class Result:
    setup: Setup
    runs: dict[str, PolicyRun]
    measures: dict[str, PolicyMeasures]
    bound: BoundMeasures
    bound_gpus: np.ndarray
    wall_seconds: dict[str, float]
    forecasts: ForecastRecord | None = None
    accuracy: dict[str, HorizonAccuracy] = field(default_factory=dict)
    baseline_accuracy: dict[str, dict[str, HorizonAccuracy]] = field(default_factory=dict)
    model_events: list[ModelEvent] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` shape: scenario, bound, each policy's measures, forecast accuracy (undefined: None)."""
        scenario = self.setup.scenario.to_dict()
        scenario.update(self.setup.describe())
        scenario["notes"] = list(self.notes)  # what the run assumed ("prewarm disabled: no budget" …)
        out: dict[str, Any] = {
            "scenario": scenario,
            "bound": self.bound.to_dict(),
            "policies": {name: m.to_dict() for name, m in self.measures.items()},
            "forecast": {
                "quantile": self.setup.scenario.quantile,
                "horizons": {h: a.to_dict() for h, a in self.accuracy.items()},
            },
        }
        return _clean(out)

    def ratios(self) -> dict[str, dict[str, float | None]]:
        """GPU-hours against the bound, the oracle and reactive; unmet minutes against reactive."""
        oracle = self.measures.get("oracle")
        reactive = self.measures.get("reactive")
        out = {}
        for name, m in self.measures.items():
            out[name] = {
                "gpu_hours_vs_bound": ratio(m.gpu_hours, self.bound.gpu_hours),
                "gpu_hours_vs_oracle": ratio(m.gpu_hours, oracle.gpu_hours) if oracle else None,
                "gpu_hours_vs_reactive": ratio(m.gpu_hours, reactive.gpu_hours) if reactive else None,
                "unmet_minutes_vs_reactive": ratio(m.unmet_minutes, reactive.unmet_minutes) if reactive else None,
            }
        return out


def _clean(value: Any) -> Any:
    """Replace NaN/inf with None all the way down, so ``json.dumps(allow_nan=False)`` holds."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def run_backtest(
    trace: Series,
    scenario: Scenario,
    *,
    progress_factory: Callable[[str, int], Progress] | None = None,
    cache: PredictiveCache | None = None,
) -> Result:
    """Run the scenario's policies over ``trace``. ``progress_factory(policy, ticks)`` gives a tick counter;
    ``cache`` keeps the predictive policy's models and forecasts for other operating points."""
    setup = prepare(trace, scenario)
    check_work(setup)
    demand = setup.demand
    cfg = scenario.cluster
    n = setup.n_ticks
    first_need = initial_replicas(setup)
    reactive_need = demand.need(scenario.target_utilization)

    runs: dict[str, PolicyRun] = {}
    wall: dict[str, float] = {}
    result_extras: dict[str, Any] = {}

    def progress(name: str) -> Progress | None:
        return progress_factory(name, n) if progress_factory else None

    # Reactive first: its schedule is the yardstick of speculation for every other policy.
    order = ["reactive"] + [p for p in scenario.policies if p != "reactive"]
    for name in order:
        started = time.perf_counter()
        if name == "predictive":
            run, extras = run_predictive(setup, initial_replicas=first_need, progress=progress(name), cache=cache)
            result_extras.update(extras)
        elif name in ("reactive", "holt-winters"):
            run = hpa_run(setup, name, scenario.target_utilization, initial_replicas=first_need,
                          progress=progress(name) if name in scenario.policies else None)
        else:
            schedule = _peer_schedule(name, setup)
            run = _play(name, schedule, setup, progress(name))
        runs[name] = run
        wall[name] = time.perf_counter() - started
    reactive_billed = runs["reactive"].billed_gpus
    if "reactive" not in scenario.policies:
        del runs["reactive"], wall["reactive"]

    audits = {name: budget_audit(setup, run, first_need) for name, run in runs.items() if name in BUDGETED}
    measures = {
        name: measure_policy(run, demand, cfg, reactive_billed=reactive_billed, reactive_need=reactive_need,
                             demand_unit_seconds=scenario.demand_unit_seconds, audit=audits.get(name))
        for name, run in runs.items()
    }
    bound_gpus = peer_policies.bound_gpus(demand, cfg)
    result = Result(
        setup=setup, runs=runs, measures=measures, bound=measure_bound(bound_gpus, demand, cfg),
        bound_gpus=bound_gpus, wall_seconds=wall,
    )
    for key, value in result_extras.items():
        setattr(result, key, value)
    result.notes = [*assumption_notes(setup), *result.notes]
    if "forecasts" in result_extras:
        result.accuracy, result.baseline_accuracy = forecast_accuracy(setup, result.forecasts)
    return result


@dataclass(frozen=True)
class PlannedRun:
    """One simulated run of a policy and the most replicas it can hold, with the settings that allow them."""

    policy: str
    replicas: int
    why: str

    def work(self, setup: Setup) -> float:
        """Replica-ticks: every tick walks the replicas and nodes, every placement scans the nodes."""
        cfg = setup.scenario.cluster
        nodes = cfg.nodes_for(self.replicas) * (2 if self.policy == "predictive" else 1)  # placeholders' nodes
        return float(setup.n_ticks) * (self.replicas + nodes) + float(self.replicas) * nodes


@dataclass(frozen=True)
class FrontierPoints:
    """The operating points a frontier adds to a backtest (backtest/frontier.py's, which imports this module)."""

    hpa_targets: tuple[float, ...] = ()
    predictive_targets: tuple[float, ...] = ()
    static_sizes: Callable[[int], list[int]] = lambda top: []
    #: The predictive default point once more with the service tracker switched (frontier.py).
    service_alternative: bool = False


def planned_runs(setup: Setup, frontier: FrontierPoints | None = None) -> list[PlannedRun]:
    """The runs a backtest (with ``frontier``, also every frontier point) simulates, before any runs."""
    extra = frontier or FrontierPoints()
    scenario, spec = setup.scenario, setup.spec
    top = setup.max_replicas
    capped = f"max_replicas {top:,} (spec.maxReplicas)" if scenario.max_replicas is not None else (
        f"max_replicas {top:,} (unset: 2 × the {setup.peak_replicas:,} peak replicas)")
    sized = "the trace's demand ÷ capacity_per_replica (spec.capacity.requestsPerReplica)"

    low = setup.bounds.min_replicas

    def demand_run(policy: str, lowest_target: float, factor: float = 1.0) -> PlannedRun:
        need = math.ceil(int(setup.demand.need(lowest_target).max(initial=0)) * factor)
        if low >= min(need, top):
            return PlannedRun(policy, low, f"min_replicas {low:,} (spec.minReplicas)")
        if need >= top:
            return PlannedRun(policy, top, f"{sized}, up to {capped}")
        return PlannedRun(policy, need, sized)

    runs: list[PlannedRun] = []
    for name in ("reactive", "holt-winters"):
        if name in scenario.policies or name == "reactive":  # reactive always runs: the yardstick
            targets = (scenario.target_utilization, *(extra.hpa_targets if name in scenario.policies else ()))
            runs += [demand_run(name, min(targets), 2.0 if name == "holt-winters" else 1.0)] * len(set(targets))
    if "predictive" in scenario.policies:
        targets = (scenario.planning_utilization, *extra.predictive_targets)
        # A forecast may run above the demand it was for: twice it, at most maxReplicas.
        multiplier = max((e.demand_multiplier or 1.0 for e in spec.events), default=1.0)
        run = demand_run("predictive", min(targets), 2.0 * spec.demand.intra_step_peak_factor * multiplier)
        floors = [(e.min_replicas, i) for i, e in enumerate(spec.events) if e.min_replicas is not None]
        if floors and max(floors)[0] > run.replicas:
            floor, i = max(floors)
            run = PlannedRun("predictive", floor, f"spec.events[{i}].minReplicas {floor:,} (under {capped})")
        runs += [run] * len(set(targets))
        if extra.service_alternative:
            # Switched on, the tracker may widen the plan up to its multiplier.
            widened = 1.0 if spec.service.enabled else spec.service.max_multiplier
            alt = demand_run("predictive", scenario.planning_utilization,
                             2.0 * spec.demand.intra_step_peak_factor * multiplier * widened)
            runs.append(alt if alt.replicas >= run.replicas else run)
    if "static" in scenario.policies:
        runs.append(PlannedRun("static", peer_policies.static_replicas(setup.training_values, setup.capacity_per_replica),
                               "the training window's peak ÷ capacity_per_replica (spec.capacity.requestsPerReplica)"))
        runs += [PlannedRun("static", r, f"the static frontier's fleet sizes up to {capped}")
                 for r in extra.static_sizes(top)]
    if "oracle" in scenario.policies:
        runs.append(demand_run("oracle", 1.0))
    return runs


def check_work(setup: Setup, frontier: FrontierPoints | None = None) -> None:
    """Refuse, before anything runs, a backtest whose simulation would exceed MAX_SIMULATION_WORK."""
    runs = planned_runs(setup, frontier)
    total = sum(r.work(setup) for r in runs)
    if total <= MAX_SIMULATION_WORK:
        return
    biggest = max(runs, key=lambda r: r.work(setup))
    span = format_duration(timedelta(seconds=setup.n_ticks * setup.tick_s))
    raise ConfigError(
        f"the backtest would simulate {len(runs)} policy run(s) over {setup.n_ticks:,} ticks ({span} at "
        f"{setup.tick_s}s), the {biggest.policy} policy with up to {biggest.replicas:,} replicas — set by "
        f"{biggest.why}: about {total:.2g} replica-ticks of work, more than the {MAX_SIMULATION_WORK:.0e} a backtest "
        "takes on (about two minutes); lower that setting, evaluate a shorter span (evaluation, --evaluation) or "
        "run fewer policies (--policies)")


def assumption_notes(setup: Setup) -> list[str]:
    """What the run assumed that silently shapes its figures: said out loud in every report."""
    notes = []
    budget = setup.spec.prewarm.budget
    if "predictive" in setup.scenario.policies and budget.max_cost_per_hour is None and not budget.max_gpus:
        why = "maxGpus is 0" if budget.max_gpus == 0 else "spec.prewarm.budget sets neither maxGpus nor maxCostPerHour"
        notes.append(f"prewarm disabled: no budget ({why}), so the predictive policy holds no capacity ahead of "
                     "demand and its columns match reactive's; give spec.prewarm.budget.maxGpus in the scenario "
                     "to let it prewarm")
    need = setup.demand.need(1.0)
    over = need > setup.max_replicas
    if over.any():
        share = float(over.mean())
        when = "never fits" if over.all() else f"does not fit in {share:.1%} of the evaluated time"
        notes.append(
            f"demand {when} under maxReplicas {setup.max_replicas}: it needs up to {int(need.max()):,} replicas "
            f"at full capacity ({setup.capacity_per_replica:.4g}/replica), so no policy can serve it all and those "
            "unmet minutes are the cap's, not a policy's; raise max_replicas (spec.maxReplicas) or "
            "capacity_per_replica")
    return notes


def initial_replicas(setup: Setup) -> int:
    """Replicas every policy starts the evaluation with: what its first tick needs at the peers' target."""
    need = setup.demand.need(setup.scenario.target_utilization)[0]
    return int(np.clip(need, setup.bounds.min_replicas, setup.bounds.max_replicas))


def hpa_run(setup: Setup, name: str, utilization: float, *, initial_replicas: int,
            progress: Progress | None = None) -> PolicyRun:
    """The reactive peer (or, ``name == "holt-winters"``, the Holt-Winters peer) at HPA target ``utilization``."""
    plan_capacity = setup.capacity_per_replica * utilization
    floor = _holt_winters_floor(setup, utilization) * plan_capacity if name == "holt-winters" else None
    metric = planner_metric(setup)
    control = peer_policies.HpaControl(metric, behavior=setup.spec.reactive, capacity=plan_capacity, bounds=setup.bounds,
                               floor=floor)
    return simulate(name, control, setup.n_ticks, setup.tick_s, setup.scenario.cluster,
                    initial_replicas=initial_replicas, control_every=setup.control_every,
                    has_fallback=name == "holt-winters", progress=progress)


#: Policies that run with a prewarm budget (audited every tick); the others report null.
BUDGETED = ("predictive",)


def planner_metric(setup: Setup) -> np.ndarray:
    """Per tick, the demand every policy but the oracle sees: the trace (training included) through the
    scenario's measurement chain (NaN = no value)."""
    times = setup.eval_start.timestamp() + np.arange(setup.n_ticks) * setup.tick_s
    return peer_policies.observed(setup.trace, times, setup.scenario.measurement,
                                  setup.scenario.cluster.metrics_delay_s)


def counterfactual(setup: Setup, initial_replicas: int) -> np.ndarray:
    """The HPA rule replayed on the planner's demand alone: what speculation is measured from."""
    return peer_policies.counterfactual_schedule(
        planner_metric(setup), behavior=setup.spec.reactive,
        capacity=setup.spec.capacity_per_replica * setup.spec.reactive.target_utilization,
        bounds=setup.bounds, initial_replicas=initial_replicas, tick_s=setup.tick_s,
        control_every=setup.control_every)


def budget_audit(setup: Setup, run: PolicyRun, initial_replicas: int) -> BudgetAudit:
    """Speculative GPUs every tick against the counterfactual and the spec's budget."""
    allowed = allowance(setup.spec.prewarm.budget).gpus
    return audit_budget(run, counterfactual(setup, initial_replicas), setup.scenario.cluster, allowed)


def _peer_schedule(name: str, setup: Setup) -> np.ndarray:
    if name == "static":
        replicas = peer_policies.static_replicas(setup.training_values, setup.capacity_per_replica)
        return np.full(setup.n_ticks, replicas, dtype=np.int64)
    if name == "oracle":
        return peer_policies.oracle_schedule(setup.demand, setup.scenario.cluster, setup.bounds)
    raise ConfigError(f"unknown policy {name!r}", field="policies")


def _holt_winters_floor(setup: Setup, utilization: float) -> np.ndarray:
    """The Holt-Winters replica forecast per tick, trained on the reactive recommendation at the model step."""
    scenario = setup.scenario
    trace = setup.trace
    per = setup.capacity_per_replica * utilization
    train_steps_trace = setup.training_values.size
    full = np.asarray(trace.values[: train_steps_trace + setup.n_ticks * setup.tick_s // trace.step_seconds], dtype=float)
    # Fitted at a 15-minute step (or the trace's, if coarser): a daily season of 96
    # keeps statsmodels' fit under a second, as the Predictive HPA's small models do.
    hw_step = HOLT_WINTERS_STEP if HOLT_WINTERS_STEP % trace.step_seconds == 0 else trace.step_seconds
    hw_step = max(hw_step, trace.step_seconds)
    k = hw_step // trace.step_seconds
    usable = full.size // k * k
    with np.errstate(invalid="ignore"):
        buckets = full[:usable].reshape(-1, k)
        present = np.isfinite(buckets)
        sums = np.where(present, buckets, 0.0).sum(axis=1)
        counts = present.sum(axis=1)
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    history = np.ceil(mean / per - 1e-9)
    train_steps = train_steps_trace // k
    lead_steps = max(1, int(math.ceil(scenario.cluster.cold_start_s / hw_step)))
    return peer_policies.holt_winters_floor(
        setup.demand, history,
        ticks_per_step=hw_step // setup.tick_s,
        season_steps=max(1, DAY_S // hw_step),
        horizon_steps=lead_steps,
        retrain_steps=max(1, int(scenario.retrain_every.total_seconds() // hw_step)),
        train_steps=train_steps,
    )


def _play(name: str, schedule: np.ndarray, setup: Setup, progress: Progress | None) -> PolicyRun:
    def control(i: int, now_s: float, cluster: SimulatedCluster) -> bool:
        cluster.apply(int(schedule[i]), 0, now_s)
        return False

    return simulate(name, control, setup.n_ticks, setup.tick_s, setup.scenario.cluster,
                    initial_replicas=int(schedule[0]), control_every=setup.control_every, progress=progress)
