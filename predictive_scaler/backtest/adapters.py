"""The simulator's side of the reconciler's ports, and the predictive policy built on them.

The predictive policy is :class:`predictive_scaler.reconcile.Reconciler` — the
class the in-cluster controller runs — with these adapters plugged in:

- :class:`TraceMetrics` (MetricsPort): the trace as a metrics source would show
  it: ``metrics_delay_s`` old through the scenario's measurement chain, a gap is an error (Prometheus answers an empty
  result, never 0), and ``recent`` returns only model steps complete by then;
- :class:`ServedModel` (ModelPort): the model the weekly retraining promoted;
  it records every forecast the reconciler asked for, for the accuracy report;
- :class:`SimulatorCluster` (ClusterPort): observe/apply on the simulated cluster.

Retraining *is* the retraining job: at the start and every ``retrain_every`` the
job's own training function (:func:`~predictive_scaler.retrain.training.train_and_promote`)
runs on what was observed so far, with :class:`TraceHistory` (the trace replay) as
its history port and an in-memory model store; the model it promotes is served
next, and one it keeps leaves the serving model in place.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from predictive_scaler.backtest.measures import HorizonAccuracy, horizon_accuracy
from predictive_scaler.backtest.records import ForecastRecord, ModelEvent, Progress, Setup
from predictive_scaler.backtest.scenario import MeasurementChain
from predictive_scaler.backtest.simulator import PolicyRun, SimulatedCluster, simulate
from predictive_scaler.clock import FakeClock
from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.errors import DataError, ModelError, SourceError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.evaluation import model_series
from predictive_scaler.forecasting.metrics import naive_scale
from predictive_scaler.forecasting.walkforward import too_few_observations
from predictive_scaler.policy.planner import ClusterState, Decision
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.retrain.history import GpuUsage
from predictive_scaler.retrain.job import default_run_id
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget
from predictive_scaler.retrain.stores import MemoryStore, ServingModel
from predictive_scaler.retrain.training import train_and_promote
from predictive_scaler.series import Series, check_history, format_duration, observed_history
from predictive_scaler.spec import ScalerSpec


class TraceMetrics:
    """MetricsPort over a trace: only what was observable at ``now`` (minus the metrics delay)."""

    def __init__(self, trace: Series, delay_s: float, chain: MeasurementChain | None = None) -> None:
        self.trace = trace
        self.delay_s = float(delay_s)
        # With a chain, demand_now is what the demand query returns (rate() of scraped counters), not the step.
        self._chain = None if chain is None else chain.sampler(trace.values, trace.start.timestamp(),
                                                              trace.step_seconds, self.delay_s)
        self._start_s = trace.start.timestamp()
        self._grids: dict[int, Series] = {}

    def grid(self, step_seconds: int) -> Series:
        if step_seconds not in self._grids:
            self._grids[step_seconds] = self.trace.resample(step_seconds)
        return self._grids[step_seconds]

    def demand_now(self, now: datetime) -> DemandSample:
        seen = now.timestamp() - self.delay_s
        i = math.floor((seen - self._start_s) / self.trace.step_seconds)
        value = float(self.trace.values[i]) if 0 <= i < len(self.trace) else math.nan
        if self._chain is not None:
            value = float(self._chain(np.array([now.timestamp()]))[0])
        if not math.isfinite(value):
            raise SourceError(
                f"no demand sample at {datetime.fromtimestamp(seen, UTC).isoformat()}: the trace has a gap there "
                "(a real Prometheus query answers an empty result)"
            )
        return DemandSample(value=value, observed_at=datetime.fromtimestamp(seen, UTC))

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        grid = self.grid(step_seconds)
        seen = now.timestamp() - self.delay_s
        complete = math.floor((seen - grid.start.timestamp()) / step_seconds)  # steps ending by ``seen``
        if complete <= 0:
            raise SourceError(f"no complete {step_seconds}s step observed before {now.isoformat()}")
        first = complete - int(window.total_seconds() // step_seconds)
        return grid.slice(first, complete)


class ServedModel:
    """ModelPort: the serving model, swapped by the retraining; records the forecasts it serves.

    Speed: when the model has the forecasting engine's batch path
    (``walk_forward``, documented as the same causal code as ``forecast``), the
    forecasts of a whole retraining period are computed in one call, each origin
    reading only the observations up to it, and served when the reconciler asks
    with a ``recent`` window ending at that origin. The batch is checked against
    direct forecasts from ``recent_steps``-long windows (what the reconciler
    passes) at its first and last origins and dropped if they differ, so the
    served numbers are exactly what ``forecast`` would return. A NaN row (a window
    with too few observations) is the model's refusal, checked once per batch against
    the direct one; refusals are remembered per step of data. Any other request is
    forecast directly.
    """

    def __init__(self, model: FittedModel, version: str, *, horizon_steps: int, quantiles: tuple[float, ...],
                 recent_steps: int | None = None,
                 memo: dict[tuple[str | None, int], Forecast] | None = None,
                 refusals: dict[tuple[str | None, int], str] | None = None) -> None:
        self.model = model
        #: Forecasts served before, by (version, origin): shared by the operating points of a frontier.
        self.memo = memo
        #: ... and the model's refusals (ModelError's message): the reconciler asks again every tick of
        #: a step, and through an outage longer than the model's window every ask is refused.
        self.refusals: dict[tuple[str | None, int], str] = {} if refusals is None else refusals
        self._recent_steps = recent_steps
        self.batch_rejections = 0
        self._version = version
        self.horizon_steps = horizon_steps
        self.quantiles = quantiles
        self.issued: list[pd.Timestamp] = []
        self.values: list[np.ndarray] = []
        self.seconds = 0.0
        self._batch: dict[int, np.ndarray] = {}
        self._label = _label(model)

    @property
    def version(self) -> str | None:
        return self._version

    @property
    def step_seconds(self) -> int:
        return int(self.model.step_seconds)

    @property
    def window_steps(self) -> int:
        """Steps of history the serving model reads (the reconciler's default recent window)."""
        return int(getattr(self.model, "window_steps", 7 * 86400 // self.step_seconds))

    @property
    def recent_steps(self) -> int:
        """Steps the reconciler hands over: the spec's window if set, else the model's own."""
        return self._recent_steps if self._recent_steps is not None else self.window_steps

    def swap(self, model: FittedModel, version: str) -> None:
        self.model, self._version, self._label = model, version, _label(model)
        self._batch = {}

    def precompute(self, grid: Series, first: int, last: int) -> None:
        """Forecasts for origins ``first..last`` (indices into ``grid``), each from data up to it."""
        batch = getattr(self.model, "walk_forward", None)
        if batch is None or grid.step_seconds != self.step_seconds:
            return
        first, last = max(0, first), min(len(grid) - 1, last)
        if last < first:
            return
        window = int(getattr(self.model, "window_steps", 7 * 288))
        lo = max(0, first - window)
        view = grid.slice(lo, last + 1)  # nothing after the last origin is handed over
        started = time.perf_counter()
        values = np.asarray(batch(view, np.arange(first - lo, last - lo + 1), self.horizon_steps, self.quantiles))
        self.seconds += time.perf_counter() - started
        for j in (0, values.shape[0] - 1):
            origin = first + j
            recent = grid.slice(origin + 1 - self.recent_steps, origin + 1)
            try:
                direct = np.asarray(self.model.forecast(recent, self.horizon_steps, self.quantiles).values)
            except ModelError:
                continue
            # Forecast clips to non-negative and sorts quantiles; compare like with like.
            expected = np.maximum.accumulate(np.maximum(np.nan_to_num(values[j], nan=0.0), 0.0), axis=0)
            if not np.allclose(expected, direct, rtol=1e-6, atol=1e-9):
                self.batch_rejections += 1
                return
        # A NaN row is the batch's "no forecast" (a window with too few observations); the first
        # one is checked to be the direct forecast's refusal too, so the others are refused without
        # forecasting each again (an outage of days is a thousand such origins).
        blind = np.flatnonzero(~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1))
        if blind.size:
            origin = first + int(blind[0])
            try:
                self.model.forecast(grid.slice(origin + 1 - self.recent_steps, origin + 1), self.horizon_steps,
                                    self.quantiles)
            except ModelError:
                pass
            else:
                self.batch_rejections += 1
                return
        t0 = int(grid.start.timestamp())
        for j, origin in enumerate(range(first, last + 1)):
            self._batch[t0 + origin * grid.step_seconds] = values[j]

    def forecast(self, recent: Series, now: datetime) -> Forecast:
        key = int(recent.last_time.timestamp()) if len(recent) else None
        memo_key = (self._version, key) if key is not None and recent.step_seconds == self.step_seconds else None
        if self.memo is not None and memo_key is not None and memo_key in self.memo:
            forecast = self.memo[memo_key]
            self.issued.append(forecast.issued_at)
            self.values.append(np.asarray(forecast.values))
            return forecast
        if memo_key is not None and memo_key in self.refusals:
            raise ModelError(self.refusals[memo_key])
        cached = self._batch.get(key) if key is not None and recent.step_seconds == self.step_seconds else None
        if cached is not None and not np.isfinite(cached).all():
            refused = too_few_observations(self._label, recent)
            if memo_key is not None:
                self.refusals[memo_key] = str(refused)
            raise refused
        if cached is not None:
            forecast = Forecast(issued_at=recent.last_time, step_seconds=self.step_seconds,
                                quantiles=self.quantiles, values=cached, model=self._label)
        else:
            started = time.perf_counter()
            try:
                forecast = self.model.forecast(recent, self.horizon_steps, self.quantiles)
            except ModelError as exc:
                if memo_key is not None:
                    self.refusals[memo_key] = str(exc)
                raise
            finally:
                self.seconds += time.perf_counter() - started
        self.issued.append(forecast.issued_at)
        self.values.append(np.asarray(forecast.values))
        if self.memo is not None and memo_key is not None:
            self.memo[memo_key] = forecast
        return forecast


def _label(model: FittedModel) -> str:
    base = getattr(model, "base", None)
    return f"{base.kind}+calibrated" if base is not None else model.kind


class SimulatorCluster:
    """ClusterPort over a :class:`SimulatedCluster`; times are seconds since ``origin``."""

    def __init__(self, origin: datetime) -> None:
        self.origin_s = origin.timestamp()
        self.cluster: SimulatedCluster | None = None

    def _sim(self) -> SimulatedCluster:
        if self.cluster is None:
            raise RuntimeError("SimulatorCluster used before the simulation attached its cluster")
        return self.cluster

    def observe(self, now: datetime) -> ClusterState:
        snap = self._sim().snapshot(now.timestamp() - self.origin_s)
        return ClusterState(
            desired_replicas=snap.desired_replicas,
            ready_replicas=snap.ready_replicas,
            starting_replicas=snap.starting_replicas,
            placeholder_gpus=snap.placeholder_gpus,
            free_gpus=snap.free_gpus,
        )

    def apply(self, decision: Decision, now: datetime) -> None:
        self._sim().apply(decision.desired_replicas, decision.placeholder_gpus, now.timestamp() - self.origin_s)


# -- training -------------------------------------------------------------------------------------

class TraceHistory:
    """HistoryPort over the trace replay: what was observed by a retraining, at the model step.

    It refuses a history as the Prometheus pull does (``sources/history.py``): fewer than
    ``min_history`` from the first value to the retraining's time (:func:`observed_history`)
    → InsufficientHistoryError;
    more than ``max_missing_fraction`` missing since the first value → DataError. There is
    no DCGM in a trace: :meth:`gpu_usage` reports nothing.
    """

    def __init__(self, observed: Series) -> None:
        self.observed = observed

    def demand(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int, *,
               min_history: timedelta | None, max_missing_fraction: float | None) -> Series:
        grid = model_series(self.observed, step_seconds)
        cut = grid.slice(math.ceil((pd.Timestamp(start) - grid.start) / grid.step), grid.index_at(end))
        present = np.flatnonzero(np.isfinite(cut.values))
        if present.size == 0:
            raise DataError(f"the trace has no observations between {start.isoformat()} and {end.isoformat()}")
        observed = observed_history(cut, end)
        with warnings.catch_warnings():  # a protocol below 14 days is said once, in the report's notes
            warnings.simplefilter("ignore", UserWarning)
            check_history(observed, min_history, max_missing=None)
        if max_missing_fraction is not None and observed.missing_fraction > max_missing_fraction:
            raise DataError(f"{observed.missing_fraction:.0%} of the trace's steps since {observed.start} are "
                            f"missing (> {max_missing_fraction:.0%} allowed)")
        return observed

    def gpu_usage(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int) -> GpuUsage:
        return GpuUsage()


#: With a training window shorter than the job's minimum history, the candidates train on this
#: much before they are scored (what the backtest used before it trained through the job).
SHORT_MIN_FIT = timedelta(days=4)


def retrain_settings(setup: Setup) -> tuple[RetrainSettings, str | None]:
    """The retraining job's settings for this backtest, and a note when they differ from the CronJob's.

    The CronJob's own (28 days pulled, 14 required, 2 held out, candidates fitted on 10 days
    and scored on up to 7 after them), with the scenario's candidates — unless the training
    window is shorter than the 14 days the job requires (traces shorter than 21 days train
    on 7): then the minimum is the training window, the holdout shrinks in proportion and the
    candidates train on 4 days before they are scored.
    """
    job = RetrainSettings(kinds=setup.scenario.forecasters)
    if setup.training >= job.min_history:
        return job, None
    holdout = max(timedelta(hours=1), job.holdout * (setup.training / job.min_history))
    scaled = replace(job, min_history=setup.training, holdout=holdout, min_compare=min(job.min_compare, holdout),
                     min_fit=min(job.min_fit, SHORT_MIN_FIT))
    return scaled, (
        f"the {format_duration(setup.training)} training window is shorter than the "
        f"{format_duration(job.min_history)} of history the retraining job requires (the CronJob would skip "
        f"this scaler): its training function ran with a minimum of {format_duration(scaled.min_history)}, a "
        f"{format_duration(scaled.holdout)} holdout and {format_duration(scaled.min_fit)} to fit candidates on "
        "before scoring them")


@dataclass
class Trainer:
    """The predictive policy's retraining: the retraining job's own function
    (:func:`~predictive_scaler.retrain.training.train_and_promote` — window, candidates, holdout,
    score window, minimum-history guard and promotion rule) with the trace replay as its history
    port and an in-memory model store; the model it promotes is the one served next.
    """

    spec: ScalerSpec
    settings: RetrainSettings
    store: MemoryStore = field(default_factory=MemoryStore)
    events: list[ModelEvent] = field(default_factory=list)

    @property
    def target(self) -> ScalerTarget:
        return ScalerTarget("backtest", "backtest", self.spec)

    def retrain(self, observed: Series, at: datetime) -> ServingModel | None:
        """The job's run at ``at`` on what was ``observed`` by then: the model it promoted, else None."""
        outcome = train_and_promote(self.target, TraceHistory(observed), self.store, self.settings, at,
                                    default_run_id(at))
        promoted = outcome.result == "promoted"
        reason = outcome.reason if outcome.result in ("promoted", "kept") else f"{outcome.result}: {outcome.reason}"
        self.events.append(ModelEvent(at=pd.Timestamp(at).isoformat(), kind=outcome.kind or "-", promoted=promoted,
                                      reason=reason, fit_seconds=outcome.seconds))
        return self.store.load_serving(self.target.model_name) if promoted else None


# -- the predictive policy ------------------------------------------------------------------------

@dataclass
class PredictiveCache:
    """What the predictive policy's operating points share: the trained models and the served forecasts.

    Training, promotion and forecasts depend on the trace, the protocol, the quantile and the horizon —
    never on the planner's headroom knobs (which only change what is done with a forecast), so the
    first run fills this and later runs with another knob reuse it. A run whose quantile, horizon,
    forecasters or protocol differ must use a cache of its own (:meth:`key` guards that).
    """

    key: tuple[Any, ...] | None = None
    initial: ServingModel | None = None
    retrained: dict[float, ServingModel | None] = field(default_factory=dict)
    events: list[ModelEvent] = field(default_factory=list)
    forecasts: dict[tuple[str | None, int], Forecast] = field(default_factory=dict)
    refusals: dict[tuple[str | None, int], str] = field(default_factory=dict)
    filled: bool = False

    @staticmethod
    def key_of(setup: Setup) -> tuple[Any, ...]:
        sc, spec = setup.scenario, setup.spec
        return (setup.trace.name, len(setup.trace), setup.eval_start, setup.n_ticks, setup.model_step, spec.quantile,
                spec.horizon_seconds, spec.model.recent_window_seconds, sc.forecasters, sc.retrain_every,
                sc.cluster.metrics_delay_s, sc.measurement)

    def check(self, setup: Setup) -> None:
        key = self.key_of(setup)
        if self.key is None:
            self.key = key
        elif self.key != key:
            raise ValueError("PredictiveCache reused for a run whose forecasts differ (quantile, horizon, "
                             "forecasters or protocol); give it a cache of its own")


def run_predictive(setup: Setup, *, initial_replicas: int, progress: Progress | None = None,  # noqa: PLR0915
                   reconciler_class: type[Reconciler] = Reconciler,
                   cache: PredictiveCache | None = None) -> tuple[PolicyRun, dict[str, Any]]:
    """Walk the evaluation forward through the reconciler; returns the run and the forecast record.

    With a filled ``cache`` (from a run of the same trace and protocol), models and forecasts are
    taken from it instead of being trained and computed again.
    """
    scenario, spec = setup.scenario, setup.spec
    if cache is not None:
        cache.check(setup)
    reuse = cache is not None and cache.filled
    start = setup.eval_start.to_pydatetime()
    metrics = TraceMetrics(_observable(setup), scenario.cluster.metrics_delay_s, scenario.measurement)
    step = setup.model_step
    settings, settings_note = retrain_settings(setup)
    trainer = Trainer(spec=spec, settings=settings)
    if reuse:
        assert cache is not None and cache.initial is not None
        first = cache.initial
    else:
        # The training window is history, all of it observed when the evaluation starts.
        initial = trainer.retrain(metrics.trace.until(setup.eval_start - pd.Timedelta(seconds=1)), start)
        if initial is None:
            raise ModelError(f"the retraining job's first run, on the {format_duration(setup.training)} training "
                             f"window, produced no model: {trainer.events[-1].reason}")
        first = initial
        if cache is not None:
            cache.initial = first
    quantiles = tuple(sorted({0.5, spec.quantile}))
    served = ServedModel(first.model, first.version, horizon_steps=max(1, spec.horizon_seconds // step), quantiles=quantiles,
                         recent_steps=None if spec.model.recent_window_seconds is None
                         else max(1, spec.model.recent_window_seconds // step),
                         memo=None if cache is None else cache.forecasts,
                         refusals=None if cache is None else cache.refusals)
    grid = metrics.grid(step)
    g0 = grid.start.timestamp()

    def precompute(from_s: float) -> None:
        if reuse:
            return
        first = math.floor((from_s - g0) / step) - 2
        last = math.floor((from_s + retrain_every - g0) / step) + 1
        served.precompute(grid, first, last)

    retrain_every = scenario.retrain_every.total_seconds()
    precompute(start.timestamp())
    port = SimulatorCluster(start)
    clock = FakeClock(start)
    reconciler = reconciler_class(spec, metrics, served, port, clock)
    carry: dict[str, Any] = {"state": PlannerState(), "next_retrain": retrain_every}

    def control(i: int, now_s: float, cluster: SimulatedCluster) -> bool:
        port.cluster = cluster
        now = start + timedelta(seconds=now_s)
        if now_s >= carry["next_retrain"]:
            carry["next_retrain"] += retrain_every
            observed_until = pd.Timestamp(now) - pd.Timedelta(seconds=scenario.cluster.metrics_delay_s)
            if reuse:
                assert cache is not None
                challenger = cache.retrained[now_s]
            else:
                challenger = trainer.retrain(metrics.trace.until(observed_until - metrics.trace.step), now)
                if cache is not None:
                    cache.retrained[now_s] = challenger
            if challenger is not None:
                served.swap(challenger.model, challenger.version)
            precompute(now.timestamp())
        clock.set(now)
        result = reconciler.step(carry["state"])
        carry["state"] = result.state
        return result.decision.strategy == "reactive"

    run = simulate("predictive", control, setup.n_ticks, setup.tick_s, scenario.cluster,
                   initial_replicas=initial_replicas, control_every=setup.control_every,
                   has_fallback=True, progress=progress)
    record = ForecastRecord(
        times=pd.DatetimeIndex(served.issued),
        step_seconds=step,
        quantiles=quantiles,
        values=np.stack(served.values) if served.values else np.zeros((0, len(quantiles), 1)),
    )
    if cache is not None:
        if reuse:
            trainer.events = list(cache.events)
        else:
            cache.events, cache.filled = list(trainer.events), True
    notes = [settings_note] if settings_note else []
    notes.append(f"forecasting time inside the reconciler: {served.seconds:.1f} s for {len(served.issued)} forecasts")
    if served.batch_rejections:
        notes.append(f"{served.batch_rejections} batched forecast period(s) differed from direct forecasts "
                     "and were forecast step by step instead")
    return run, {"forecasts": record, "model_events": trainer.events, "notes": notes}


def _observable(setup: Setup) -> Series:
    """The trace up to the end of the evaluation (nothing after it exists for any policy)."""
    trace = setup.trace
    steps = setup.training_values.size + setup.n_ticks * setup.tick_s // trace.step_seconds
    return trace.slice(0, steps)


# -- forecast accuracy ----------------------------------------------------------------------------

def forecast_accuracy(setup: Setup, record: ForecastRecord | None) -> tuple[dict[str, HorizonAccuracy], dict[str, dict[str, HorizonAccuracy]]]:
    """Accuracy per horizon of the forecasts the predictive policy used, and of persistence beside it."""
    if record is None or record.values.shape[0] == 0:
        return {}, {}
    scenario = setup.scenario
    grid = _observable(setup).resample(record.step_seconds)
    g0 = grid.start.timestamp()
    issued_idx = np.round((record.times.asi8 / 1e9 - g0) / record.step_seconds).astype(int)
    q = scenario.quantile
    k_med = record.quantiles.index(0.5)
    k_up = record.quantiles.index(q)
    train_grid = grid.values[: int((setup.eval_start.timestamp() - g0) // record.step_seconds)]
    scale = naive_scale(train_grid)
    ours: dict[str, HorizonAccuracy] = {}
    persistence: dict[str, HorizonAccuracy] = {}
    for h in scenario.horizons:
        label = format_duration(h)
        seconds = h.total_seconds()
        if seconds % record.step_seconds or seconds / record.step_seconds > record.values.shape[2]:
            ours[label] = HorizonAccuracy(None, None, None, None, None, 0)
            continue
        k = int(seconds // record.step_seconds)
        target = issued_idx + k
        inside = (target >= 0) & (target < len(grid))
        actual = np.full(target.size, np.nan)
        actual[inside] = grid.values[target[inside]]
        med = record.values[:, k_med, k - 1]
        up = record.values[:, k_up, k - 1]
        ours[label] = horizon_accuracy(med, up, actual, quantile=q, naive_mae=scale)
        last = np.full(target.size, np.nan)
        ok = (issued_idx >= 0) & (issued_idx < len(grid))
        last[ok] = grid.values[issued_idx[ok]]
        persistence[label] = horizon_accuracy(last, last, actual, quantile=q, naive_mae=scale)
    return ours, {"persistence (last value as P50 and P95)": persistence}
