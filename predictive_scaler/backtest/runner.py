"""Run every policy of a scenario over one trace, side by side, and measure them.

Protocol: the first ``training`` of the trace (14 days; 7 for traces shorter
than 21 days) is history only — it sizes the replicas (``peak_replicas``),
trains the first model and the Holt-Winters peer. The rest is walked forward
tick by tick; models are retrained every ``retrain_every`` on what was
observed so far, and every policy starts the evaluation from a warm cluster
running the replicas its first tick needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from predictive_scaler.backtest import peers
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
from predictive_scaler.backtest.scenario import Scenario
from predictive_scaler.backtest.simulator import Demand, PolicyRun, SimulatedCluster, simulate
from predictive_scaler.errors import ConfigError, InsufficientHistoryError
from predictive_scaler.policy.budget import allowance
from predictive_scaler.series import Series, format_duration
from predictive_scaler.spec import ScalerSpec

if TYPE_CHECKING:
    from predictive_scaler.backtest.adapters import PredictiveCache

#: Models work on a 5-minute grid unless the trace is coarser (shared contract).
DEFAULT_MODEL_STEP = 300
#: Step the Holt-Winters peer is fitted at.
HOLT_WINTERS_STEP = 900
#: Daily season, in seconds.
DAY_S = 86400


@dataclass(frozen=True)
class Setup:
    """The trace cut into training and evaluation, on the simulation grid."""

    trace: Series
    scenario: Scenario
    training: timedelta
    eval_start: pd.Timestamp
    tick_s: int
    control_every: int
    model_step: int
    capacity_per_replica: float
    peak_replicas: int
    max_replicas: int
    demand: Demand
    #: Trace values of the training window (its own step).
    training_values: np.ndarray
    #: The PredictiveScaler spec the predictive policy (and the reactive peer's HPA rule) runs with.
    spec: ScalerSpec

    @property
    def bounds(self) -> peers.Bounds:
        return peers.Bounds(self.scenario.min_replicas, self.max_replicas)

    @property
    def n_ticks(self) -> int:
        return len(self.demand)

    def tick_time(self, i: int) -> pd.Timestamp:
        return self.eval_start + pd.Timedelta(seconds=i * self.tick_s)

    def describe(self) -> dict[str, Any]:
        return {
            "trace": self.trace.source or self.trace.name,
            "trace_step": format_duration(self.trace.step),
            "training": format_duration(self.training),
            "evaluation_start": self.eval_start.isoformat(),
            "evaluation": format_duration(timedelta(seconds=self.n_ticks * self.tick_s)),
            "tick": f"{self.tick_s}s",
            "model_step": f"{self.model_step}s",
            "capacity_per_replica": self.capacity_per_replica,
            "peak_replicas": self.peak_replicas,
            "max_replicas": self.max_replicas,
        }


def prepare(trace: Series, scenario: Scenario) -> Setup:
    """Cut ``trace`` per the scenario's protocol and size the replicas from the training window only."""
    span = trace.span
    if scenario.training is not None:
        training = scenario.training
    elif span >= timedelta(days=21):
        training = timedelta(days=14)
    else:
        training = timedelta(days=7)
    if span < training + timedelta(days=1):
        raise InsufficientHistoryError(
            f"trace {trace.name!r} spans {span}; the backtest needs the {format_duration(training)} training "
            f"window plus at least 1 day to evaluate — use a trace of at least {format_duration(training + timedelta(days=1))}"
            + (", or a shorter training window in the scenario" if scenario.training is not None else "")
        )
    if training.total_seconds() % trace.step_seconds:
        raise ConfigError(f"training window {format_duration(training)} is not a multiple of the trace step", field="training")
    train_steps = int(training.total_seconds() // trace.step_seconds)
    training_values = np.asarray(trace.values[:train_steps], dtype=float)
    eval_values = np.asarray(trace.values[train_steps:], dtype=float)
    if scenario.evaluation is not None:
        eval_values = eval_values[: max(1, int(scenario.evaluation.total_seconds() // trace.step_seconds))]
    if not np.isfinite(training_values).any():
        raise InsufficientHistoryError(f"trace {trace.name!r}: the training window has no observations")

    cp = scenario.control_period_s
    tick = math.gcd(cp, trace.step_seconds)
    model_step = max(DEFAULT_MODEL_STEP, trace.step_seconds)
    if model_step % trace.step_seconds:
        model_step = trace.step_seconds

    if scenario.capacity_per_replica is not None:
        capacity = float(scenario.capacity_per_replica)
        p95 = float(np.nanpercentile(training_values, 95))
        peak = max(1, int(math.ceil(p95 / capacity - 1e-9)))
    else:
        assert scenario.peak_replicas is not None
        peak = scenario.peak_replicas
        p95 = float(np.nanpercentile(training_values, 95))
        if not p95 > 0:
            raise InsufficientHistoryError(
                f"trace {trace.name!r}: the P95 of the training window is {p95:g}; cannot size replicas from it — "
                "give capacity_per_replica instead"
            )
        capacity = p95 / peak
    values = np.repeat(eval_values, trace.step_seconds // tick)
    max_replicas = scenario.resolved_max_replicas(peak)
    return Setup(
        trace=trace,
        scenario=scenario,
        training=training,
        eval_start=trace.start + pd.Timedelta(training),
        tick_s=tick,
        control_every=cp // tick,
        model_step=model_step,
        capacity_per_replica=capacity,
        peak_replicas=peak,
        max_replicas=max_replicas,
        demand=Demand(values, tick, capacity),
        training_values=training_values,
        spec=build_spec(scenario, capacity=capacity, max_replicas=max_replicas, model_step=model_step,
                        peak_factor=intra_step_peak_factor(training_values, trace.step_seconds, model_step)),
    )


#: Quantile of (demand ÷ its model-step mean) taken as the intra-step peak factor.
PEAK_FACTOR_QUANTILE = 0.8


def intra_step_peak_factor(training_values: np.ndarray, trace_step: int, model_step: int,
                           quantile: float = PEAK_FACTOR_QUANTILE) -> float:
    """How far per-sample demand runs above its model step's mean, from the training window only.

    The forecast is of step means; the simulator serves every sample. The factor is
    the ``quantile`` of sample ÷ step mean over complete steps with a positive mean
    (≥ 1; 1 when the trace is no finer than the model step). Nothing after the
    training window is read.
    """
    per_step = model_step // trace_step
    if per_step <= 1:
        return 1.0
    n = training_values.size // per_step * per_step
    steps = np.asarray(training_values[:n], dtype=float).reshape(-1, per_step)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.nanmean(steps, axis=1) if n else np.zeros(0)
    ok = np.isfinite(means) & (means > 0)
    ratios = steps[ok] / means[ok, None]
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return 1.0
    return round(max(1.0, float(np.quantile(ratios, quantile))), 3)


def build_spec(scenario: Scenario, *, capacity: float, max_replicas: int, model_step: int,
               peak_factor: float = 1.0) -> ScalerSpec:
    """The scenario's ``spec`` section laid over what the simulated cluster implies.

    The planning capacity of a replica is ``capacity × target_utilization`` (the
    HPA target); lead times are the simulator's warm and cold start times; the
    intra-step peak factor is estimated from the training window
    (:func:`intra_step_peak_factor`).
    """
    cfg = scenario.cluster
    base: dict[str, Any] = {
        "target": {"name": "backtest"},
        # The scenario's spec may set its own intraStepPeakFactor; else the training window's.
        "demand": {"kind": "requests", "query": "trace replay", "intraStepPeakFactor": peak_factor},
        "capacity": {"requestsPerReplica": capacity * scenario.planning_utilization},
        # The predictive policy's reactive rule (fallback, counterfactual) at the peers' HPA target.
        "reactive": {"targetUtilization": min(1.0, scenario.target_utilization / scenario.planning_utilization)},
        "gpusPerReplica": cfg.gpus_per_replica,
        "minReplicas": scenario.min_replicas,
        "maxReplicas": max_replicas,
        "quantile": scenario.quantile,
        # At least two model steps: a forecast starts after the last step the metrics show, and
        # for the metrics delay after a step ends it is still the newest one, by then reaching
        # into its second step (a one-step horizon would be stale there).
        "horizonSeconds": min(3600, max(1800, 2 * model_step)),
        "controlPeriodSeconds": scenario.control_period_s,
        "leadTimes": {"podStartSeconds": int(math.ceil(cfg.warm_start_s)),
                      "nodeStartSeconds": int(math.ceil(cfg.cold_start_s))},
        "prewarm": {"enabled": True, "gpusPerNode": cfg.gpus_per_node,
                    "budget": {"pricePerGpuHour": cfg.price_per_gpu_hour}},
        "model": {"stepSeconds": model_step},
        "mode": "scale",
    }
    return ScalerSpec.from_dict(deep_merge(base, scenario.spec))


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested mappings merged key by key (``over`` wins)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class ModelEvent:
    """One weekly retraining: what was trained and whether it replaced the serving model."""

    at: str
    kind: str
    promoted: bool
    reason: str
    fit_seconds: float


@dataclass(frozen=True)
class ForecastRecord:
    """The forecasts the predictive policy acted on, one per model step."""

    times: pd.DatetimeIndex  # issued_at (start of the last observed step)
    step_seconds: int
    quantiles: tuple[float, ...]
    values: np.ndarray  # [n, k, h]


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
        """The ``--json`` shape of issue 4 (undefined values are None)."""
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


Progress = Callable[[int], None]


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
            from predictive_scaler.backtest.adapters import run_predictive

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
    bound_gpus = peers.bound_gpus(demand, cfg)
    result = Result(
        setup=setup, runs=runs, measures=measures, bound=measure_bound(bound_gpus, demand, cfg),
        bound_gpus=bound_gpus, wall_seconds=wall,
    )
    for key, value in result_extras.items():
        setattr(result, key, value)
    result.notes = [*assumption_notes(setup), *result.notes]
    if "forecasts" in result_extras:
        from predictive_scaler.backtest.adapters import forecast_accuracy

        result.accuracy, result.baseline_accuracy = forecast_accuracy(setup, result.forecasts)
    return result


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
    metric = peers.observed(setup.demand, setup.scenario.cluster.metrics_delay_s)
    control = peers.HpaControl(metric, behavior=setup.spec.reactive, capacity=plan_capacity, bounds=setup.bounds,
                               floor=floor)
    return simulate(name, control, setup.n_ticks, setup.tick_s, setup.scenario.cluster,
                    initial_replicas=initial_replicas, control_every=setup.control_every,
                    has_fallback=name == "holt-winters", progress=progress)


#: Policies that run with a prewarm budget (audited every tick); the others report null.
BUDGETED = ("predictive",)


def planner_metric(setup: Setup) -> np.ndarray:
    """Per tick, the demand the planner sees (the trace ``metrics_delay_s`` ago, training included; NaN = gap)."""
    trace = setup.trace
    delay = setup.scenario.cluster.metrics_delay_s
    t = setup.eval_start.timestamp() + np.arange(setup.n_ticks) * setup.tick_s - delay
    idx = np.floor((t - trace.start.timestamp()) / trace.step_seconds).astype(np.int64)
    values = np.asarray(trace.values, dtype=float)
    ok = (idx >= 0) & (idx < values.size)
    out = np.full(setup.n_ticks, np.nan)
    out[ok] = values[idx[ok]]
    return out


def counterfactual(setup: Setup, initial_replicas: int) -> np.ndarray:
    """The HPA rule replayed on the planner's demand alone: what speculation is measured from."""
    return peers.counterfactual_schedule(
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
        replicas = peers.static_replicas(setup.training_values, setup.capacity_per_replica)
        return np.full(setup.n_ticks, replicas, dtype=np.int64)
    if name == "oracle":
        return peers.oracle_schedule(setup.demand, setup.scenario.cluster, setup.bounds)
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
    return peers.holt_winters_floor(
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
