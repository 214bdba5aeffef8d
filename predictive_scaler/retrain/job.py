"""The weekly retraining job: for each PredictiveScaler, pull history, fit, compare, promote only if not worse.

Per scaler (:func:`retrain_scaler`):

1. pull ``history`` (28 days) of demand at the model step ending at ``now``;
   fewer than 14 observed days, more than ``max_missing_fraction`` gaps or a
   query error → *skipped* with the reason (an existing serving model keeps
   serving; without one the controller stays reactive);
2. hold out the most recent ``holdout`` (2 days): the challenger never sees it;
3. :func:`~predictive_scaler.forecasting.selection.train_model` on the rest:
   candidates scored by rolling origin on the latest data before the holdout,
   the best one fitted and calibrated;
4. score the challenger and the serving model on the held-out window — data
   neither was fitted on (the serving model was fitted in an earlier run; if
   its training window reaches into the holdout, only the part after it is
   used) — and apply :func:`~predictive_scaler.forecasting.selection.promote`:
   not worse at the target quantile (pinball loss and coverage) → publish and
   serve; otherwise *kept*, with the reason;
5. record the outcome in ``<store>/<model>/retrain/<run_id>.json``.

What is published is exactly the model that was compared (fitted without the
holdout): the numbers in its manifest describe the bytes that serve.

Resumable and idempotent: a scaler whose record for ``run_id`` says it is done
is skipped; a version already published by this run (found by the run id in
its manifest) is reused, never duplicated. Store writes are atomic, so a crash
at any point leaves every serving pointer on a complete, verified version.

Work is split across the pods of an Indexed Job by a stable hash of
``namespace/name`` (:func:`shard_of`) and across processes with the ``spawn``
start method (:func:`run_retrain`). Sources and store are injected; the clock
is the ``now`` argument.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from predictive_scaler.capacity_estimate import (
    CapacityEstimate,
    IdleGpus,
    estimate_capacity,
    summarise_idle,
)
from predictive_scaler.errors import ConfigError, DataError, ModelError, ScalerError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.evaluation import (
    DEFAULT_HORIZONS,
    EvaluationSettings,
    horizon_steps,
    model_series,
)
from predictive_scaler.forecasting.metrics import all_metrics, naive_scale
from predictive_scaler.forecasting.selection import PromotionDecision, promote, train_model
from predictive_scaler.forecasting.store import (
    ModelStore,
    TrainingWindow,
    write_atomic,
)
from predictive_scaler.forecasting.walkforward import DEFAULT_WINDOW_STEPS, walk_forward
from predictive_scaler.policy import events as event_policy
from predictive_scaler.retrain.history import HistoryPort
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget
from predictive_scaler.retrain.sharding import select_shard
from predictive_scaler.series import Series, format_duration
from predictive_scaler.spec import ScalerSpec

log = logging.getLogger(__name__)

RETRAIN_DIR = "retrain"
#: numpy's BLAS spawns a thread per core in every process; with several worker processes on a
#: small machine they fight over the cores (a 5-minute ARIMA fit went from 0.5 s to 7 s here).
SINGLE_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

Result = Literal["promoted", "kept", "skipped", "failed", "already-done"]
#: Outcomes that finish a scaler for a run: a re-run with the same run id skips them.
DONE: frozenset[str] = frozenset({"promoted", "kept"})



def default_run_id(now: datetime) -> str:
    """The ISO week of ``now`` (``2026-W48``): one run per week, re-runs in the same week resume it."""
    year, week, _ = now.astimezone(UTC).isocalendar()
    return f"{year}-W{week:02d}"



# -- outcome and the run record ------------------------------------------------------------------

@dataclass(frozen=True)
class ScalerOutcome:
    """What the job did for one scaler, and why (the job's output, the store's record, the status)."""

    key: str
    model: str
    result: Result
    reason: str
    run_id: str
    version: str | None = None
    serving_version: str | None = None
    kind: str | None = None
    seconds: float = 0.0
    #: Pinball/coverage of challenger and serving model on the held-out window.
    comparison: Mapping[str, Any] = field(default_factory=dict)
    capacity: Mapping[str, Any] | None = None
    idle_gpus: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return self.result in DONE

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["notes"] = list(self.notes)
        doc["done"] = self.done
        return _finite_json(doc)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ScalerOutcome:
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in doc.items() if k in names}
        kwargs["notes"] = tuple(kwargs.get("notes") or ())
        return cls(**kwargs)

    def status(self, now: datetime) -> dict[str, Any]:
        """The ``status.retrain`` block written to the PredictiveScaler (camelCase, small)."""
        doc: dict[str, Any] = {"runId": self.run_id, "time": _iso(now), "result": self.result,
                               "reason": self.reason}
        if self.serving_version:
            doc["servingVersion"] = self.serving_version
        if self.capacity:
            doc["capacity"] = {"requestsPerReplica": self.capacity["requests_per_replica"],
                               "low": self.capacity["low"], "high": self.capacity["high"]}
        if self.idle_gpus:
            doc["idleGpus"] = {"mean": self.idle_gpus["mean"],
                               "costPerDay": self.idle_gpus["cost_per_day"],
                               "currency": self.idle_gpus["currency"]}
        return _finite_json(doc)


def record_path(store: ModelStore, model: str, run_id: str) -> Path:
    store.version_dir(model, run_id)  # validates both names (no traversal)
    return store.root / model / RETRAIN_DIR / f"{run_id}.json"


def read_record(store: ModelStore, model: str, run_id: str) -> ScalerOutcome | None:
    path = record_path(store, model, run_id)
    try:
        doc = json.loads(path.read_text())
        return ScalerOutcome.from_dict(doc)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, OSError) as exc:
        log.warning("ignoring unreadable retrain record %s (%s); the scaler is retrained", path, exc)
        return None


def write_record(store: ModelStore, outcome: ScalerOutcome) -> None:
    path = record_path(store, outcome.model, outcome.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps(outcome.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, body.encode("utf-8"))


def _published_by_run(store: ModelStore, model: str, run_id: str) -> str | None:
    """The version this run already published for ``model`` (crash after publish, before the record)."""
    for info in reversed(store.list(model)):
        meta = (info.manifest.metrics or {}).get("retrain") if info.manifest else None
        if isinstance(meta, Mapping) and meta.get("run_id") == run_id:
            return info.version
    return None


# -- scoring on the held-out window ----------------------------------------------------------

def horizons_for(spec: ScalerSpec) -> tuple[timedelta, ...]:
    horizon = timedelta(seconds=spec.horizon_seconds)
    return tuple(sorted({*(h for h in DEFAULT_HORIZONS if h <= horizon), horizon}))


def score_window(model: FittedModel, grid: Series, start: int, horizons: Sequence[timedelta],
                 quantile: float) -> dict[str, Any]:
    """``{"horizons": {label: metrics}}`` of ``model``'s forecasts for steps ``start…`` of ``grid``.

    Each forecast reads observations up to its origin only (the serving code path).
    """
    g = model_series(grid, model.step_seconds)
    first = int(math.ceil(start * grid.step_seconds / g.step_seconds))
    if first < 1 or first >= len(g):
        raise ModelError(f"{grid.name}: no held-out steps to score the {model.kind} model on")
    labels = {format_duration(h): horizon_steps(h, g.step_seconds) for h in horizons}
    defined = [s for s in labels.values() if s is not None]
    if not defined:
        raise ModelError(f"no horizon is a whole number of the {g.step_seconds}s model step")
    h_max = max(defined)
    qs = tuple(sorted({0.5, quantile}))
    window = int(getattr(model, "window_steps", DEFAULT_WINDOW_STEPS))
    lo = max(0, first - 1 - window)
    origins = np.arange(first - 1, len(g) - 1)
    fc = walk_forward(model, g.slice(lo, len(g)), origins - lo, h_max, qs)
    scale = naive_scale(g.values[:first])
    out: dict[str, Any] = {}
    for label, h in labels.items():
        if h is None:
            out[label] = None
            continue
        target = origins + h
        inside = target < len(g)
        actual = np.full(origins.size, np.nan)
        actual[inside] = g.values[target[inside]]
        out[label] = all_metrics(actual, fc[:, 0, h - 1], fc[:, qs.index(quantile), h - 1], quantile, scale)
    return {"horizons": out, "origins": int(origins.size), "from": _iso(g.start + g.step * first),
            "to": _iso(g.end)}


# -- one scaler --------------------------------------------------------------------------------

def retrain_scaler(
    target: ScalerTarget,
    history: HistoryPort,
    store: ModelStore,
    settings: RetrainSettings,
    now: datetime,
    run_id: str,
) -> ScalerOutcome:
    """Retrain one scaler (see the module doc). Expected problems become a *skipped* outcome."""
    t0 = time.perf_counter()
    base = ScalerOutcome(key=target.key, model=target.model_name, result="skipped", reason="", run_id=run_id)
    try:
        outcome = _retrain(target, history, store, settings, now, run_id, base)
    except ScalerError as exc:
        outcome = replace(base, result="skipped", reason=f"{type(exc).__name__}: {exc}",
                          serving_version=_serving_version(store, target.model_name))
    outcome = replace(outcome, seconds=round(time.perf_counter() - t0, 3))
    if outcome.result != "already-done":
        write_record(store, outcome)
    return outcome


def _serving_version(store: ModelStore, model: str) -> str | None:
    try:
        pointer = store.pointer(model)
    except (ModelError, ConfigError):
        return None
    return None if pointer is None else pointer.version


def _retrain(target: ScalerTarget, history: HistoryPort, store: ModelStore, settings: RetrainSettings,
             now: datetime, run_id: str, base: ScalerOutcome) -> ScalerOutcome:
    if target.spec is None:
        return replace(base, reason=target.problem or "invalid spec")
    spec = target.spec
    model_name = target.model_name
    store.version_dir(model_name, "check")  # a name the store refuses is a config problem, said early
    earlier = read_record(store, model_name, run_id)
    if earlier is not None and earlier.done:
        return replace(earlier, result="already-done",
                       reason=f"done earlier in run {run_id}: {earlier.result} ({earlier.reason})")
    reused = _published_by_run(store, model_name, run_id)
    if reused is not None:
        try:
            store.promote(model_name, reused)  # verified; idempotent when it already serves
        except ModelError as exc:
            log.warning("%s: version %s from this run is refused (%s); training again", target.key, reused, exc)
        else:
            return replace(base, result="promoted", version=reused, serving_version=reused,
                           reason=f"version {reused} was published by this run before an interruption; "
                                  "serving it")

    step = spec.model.step_seconds
    end = datetime.fromtimestamp(math.floor(now.timestamp() / step) * step, UTC)
    start = end - settings.history
    demand = history.demand(target, start, end, step, min_history=settings.min_history,
                            max_missing_fraction=settings.max_missing_fraction)
    grid = model_series(demand, step)
    notes: list[str] = []
    capacity, idle = _gpu_facts(target, history, grid, end, settings, notes)

    hold = int(settings.holdout.total_seconds() // grid.step_seconds)
    fit_part = grid.slice(0, len(grid) - hold)
    scored = min(settings.evaluation_window, fit_part.span - timedelta(days=10))
    if scored < timedelta(hours=6):
        raise DataError(f"{target.key}: {format_duration(fit_part.span)} before the holdout leaves too little "
                        "to evaluate candidates; it needs about 12 days of history")
    horizons = horizons_for(spec)
    eval_settings = EvaluationSettings(quantile=spec.quantile, horizons=horizons,
                                       min_history=fit_part.span - scored)
    # Past occurrences of the scaler's scheduled events are Prophet's holidays for this fit.
    options = event_policy.forecaster_options(spec.events, fit_part.start.timestamp(), fit_part.end.timestamp())
    result = train_model(fit_part, settings.kinds, spec.quantile, max(horizons),
                         min_history=eval_settings.min_history, step_seconds=step, settings=eval_settings,
                         options=options)
    challenger = result.model

    serving_version = _serving_version(store, model_name)
    hold_start = len(grid) - hold
    compare_from, serving_model, serving_note = hold_start, None, None
    if serving_version is not None:
        try:
            loaded = store.serving(model_name, expected_series=model_name)
            serving_model = loaded.model
            trained_until = loaded.manifest.window.end
            if trained_until > grid.start + grid.step * hold_start:
                compare_from = max(hold_start, int(math.ceil((trained_until - grid.start) / grid.step)))
        except (ModelError, ConfigError) as exc:
            serving_note = f"serving version {serving_version} was refused ({exc})"
            notes.append(serving_note)
    compare_span = grid.step * (len(grid) - compare_from)
    challenger_scores = score_window(challenger, grid, compare_from, horizons, spec.quantile)
    serving_scores = None
    if serving_model is not None:
        if compare_span < settings.min_compare:
            return replace(
                base, result="kept", kind=result.kind, serving_version=serving_version, notes=tuple(notes),
                capacity=capacity, idle_gpus=idle,
                reason=(f"serving version {serving_version} was fitted on data up to {len(grid) - compare_from} "
                        f"steps before now: only {format_duration(compare_span)} neither model saw "
                        f"(< {format_duration(settings.min_compare)}); keep serving"))
        try:
            serving_scores = score_window(serving_model, grid, compare_from, horizons, spec.quantile)
        except ScalerError as exc:
            notes.append(f"serving model could not be scored ({exc})")
    decision = promote(challenger_scores, serving_scores, spec.quantile)
    if serving_version is None:
        decision = PromotionDecision(decision.promote, f"no serving model yet; {decision.reason}")
    elif serving_note is not None and serving_model is None:
        decision = PromotionDecision(decision.promote, f"{serving_note}; {decision.reason}")
    comparison = {"window": {"from": challenger_scores["from"], "to": challenger_scores["to"]},
                  "quantile": spec.quantile, "challenger": challenger_scores["horizons"],
                  "serving": serving_scores["horizons"] if serving_scores else None}
    outcome = replace(base, kind=result.kind, comparison=comparison, capacity=capacity, idle_gpus=idle,
                      notes=tuple(notes), serving_version=serving_version, reason=decision.reason,
                      result="promoted" if decision.promote else "kept")
    if not decision.promote:
        return outcome
    metrics = dict(result.metrics)
    metrics["fit_seconds_final"] = result.fit_seconds
    metrics["holdout"] = comparison
    metrics["retrain"] = {"run_id": run_id, "scaler": target.key, "decision": decision.reason}
    version = store.publish(model_name, challenger, series=model_name, window=TrainingWindow.of(fit_part),
                            metrics=metrics, capacity=capacity, serve=False)
    try:
        store.promote(model_name, version)  # verifies the written artifact before the pointer moves
    except ModelError as exc:
        return replace(outcome, result="failed", version=version,
                       reason=(f"published version {version} was refused when verified ({exc}); still "
                               f"serving {serving_version or 'nothing (the controller stays reactive)'}"))
    return replace(outcome, version=version, serving_version=version)


def _gpu_facts(target: ScalerTarget, history: HistoryPort, grid: Series, end: datetime,
               settings: RetrainSettings, notes: list[str]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Capacity (request-rate scalers) and idle GPUs from DCGM; problems are notes, never failures."""
    spec = target.spec
    assert spec is not None
    try:
        usage = history.gpu_usage(target, grid.start.to_pydatetime(), end, grid.step_seconds)
    except ScalerError as exc:
        notes.append(f"no DCGM history ({exc})")
        return None, None
    capacity: CapacityEstimate | None = None
    if spec.demand.kind == "requests" and usage.busy_gpus is not None:
        try:
            capacity = estimate_capacity(grid, usage.busy_gpus, mean_utilisation=usage.mean_utilisation,
                                         utilization_target=spec.capacity.gpu_utilization_target,
                                         gpus_per_replica=spec.gpus_per_replica)
        except DataError as exc:
            notes.append(str(exc))
    idle: IdleGpus | None = None
    if usage.idle_gpus is not None:
        window = int(settings.idle_window.total_seconds() // usage.idle_gpus.step_seconds)
        budget = spec.prewarm.budget
        try:
            idle = summarise_idle(usage.idle_gpus.tail(window),
                                  allocated=usage.allocated_gpus.tail(window) if usage.allocated_gpus else None,
                                  price_per_gpu_hour=budget.price_per_gpu_hour, currency=budget.currency)
        except DataError as exc:
            notes.append(str(exc))
    return (capacity.to_dict() if capacity else None), (idle.to_dict() if idle else None)


# -- the whole run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RetrainReport:
    run_id: str
    now: datetime
    shard_index: int
    shard_count: int
    processes: int
    outcomes: tuple[ScalerOutcome, ...]
    seconds: float

    @property
    def failed(self) -> int:
        return sum(o.result == "failed" for o in self.outcomes)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.result] = out.get(o.result, 0) + 1
        return out

    def idle_summary(self) -> dict[str, Any]:
        rows = [o.idle_gpus for o in self.outcomes if o.idle_gpus]
        costs = [r["cost_per_day"] for r in rows if r.get("cost_per_day") is not None]
        return {"scalers": len(rows), "mean_idle_gpus": sum(r["mean"] for r in rows),
                "idle_gpu_hours_per_day": sum(r["idle_gpu_hours_per_day"] for r in rows),
                "cost_per_day": sum(costs) if costs else None,
                "currencies": sorted({r["currency"] for r in rows})}

    def to_dict(self) -> dict[str, Any]:
        return _finite_json({
            "run_id": self.run_id, "now": _iso(self.now),
            "shard": {"index": self.shard_index, "count": self.shard_count}, "processes": self.processes,
            "seconds": round(self.seconds, 3), "counts": self.counts(), "idle_gpus": self.idle_summary(),
            "scalers": [o.to_dict() for o in self.outcomes],
        })


@dataclass(frozen=True)
class _Work:
    """Everything a worker process needs (picklable)."""

    history: Any
    store_root: str
    settings: RetrainSettings
    now: datetime
    run_id: str


def _work(work: _Work, target: ScalerTarget) -> ScalerOutcome:
    store = ModelStore(work.store_root, keep=work.settings.keep)
    return retrain_scaler(target, work.history, store, work.settings, work.now, work.run_id)


def run_retrain(
    targets: Sequence[ScalerTarget],
    *,
    history: HistoryPort,
    store: ModelStore,
    settings: RetrainSettings,
    now: datetime,
    run_id: str | None = None,
    processes: int = 1,
    shard_index: int = 0,
    shard_count: int = 1,
    on_outcome: Callable[[ScalerOutcome], None] | None = None,
) -> RetrainReport:
    """Retrain this shard's scalers, in this process or in ``processes`` spawned workers.

    Exceptions that are not :class:`ScalerError` mark that scaler *failed* and the
    run goes on; a worker that dies marks the scalers it had not finished failed.
    ``on_outcome`` is called in this process as each scaler finishes (status, logs).
    """
    if processes < 1:
        raise ConfigError(f"processes must be at least 1, got {processes}", field="processes")
    run = run_id or default_run_id(now)
    mine = select_shard(targets, shard_index, shard_count)
    log.info("retrain run %s: shard %d/%d has %d of %d scalers, %d process(es)",
             run, shard_index, shard_count, len(mine), len(targets), processes)
    work = _Work(history=history, store_root=str(store.root), settings=settings, now=now, run_id=run)
    t0 = time.perf_counter()
    outcomes: list[ScalerOutcome] = []

    def finished(outcome: ScalerOutcome) -> None:
        outcomes.append(outcome)
        log.info("[%d/%d] %s: %s in %.1fs — %s", len(outcomes), len(mine), outcome.key, outcome.result,
                 outcome.seconds, outcome.reason)
        if on_outcome is not None:
            on_outcome(outcome)

    if processes == 1 or len(mine) <= 1:
        for target in mine:
            try:
                outcome = retrain_scaler(target, history, store, settings, now, run)
            except Exception as exc:  # a bug must not stop the other scalers
                log.exception("retraining %s failed", target.key)
                outcome = _failed(target, run, f"unexpected {type(exc).__name__}: {exc}")
            finished(outcome)
    else:
        _run_in_processes(mine, work, processes, finished)
    return RetrainReport(run_id=run, now=now, shard_index=shard_index, shard_count=shard_count,
                         processes=processes, outcomes=tuple(outcomes), seconds=time.perf_counter() - t0)


def _failed(target: ScalerTarget, run_id: str, reason: str) -> ScalerOutcome:
    return ScalerOutcome(key=target.key, model=target.model_name, result="failed", reason=reason, run_id=run_id)


def _run_in_processes(targets: Sequence[ScalerTarget], work: _Work, processes: int,
                      finished: Callable[[ScalerOutcome], None]) -> None:
    import multiprocessing

    for name in SINGLE_THREAD_ENV:  # inherited by the spawned workers
        os.environ.setdefault(name, "1")
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(targets)), mp_context=ctx) as pool:
        pending: dict[Future[ScalerOutcome], ScalerTarget] = {pool.submit(_work, work, t): t for t in targets}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                target = pending.pop(fut)
                try:
                    outcome = fut.result()
                except BrokenProcessPool:
                    outcome = _failed(target, work.run_id, "a worker process died (killed or out of memory) "
                                      "before this scaler finished; re-run the job to resume")
                except Exception as exc:
                    outcome = _failed(target, work.run_id, f"unexpected {type(exc).__name__}: {exc}")
                finished(outcome)


# -- helpers -----------------------------------------------------------------------------------

def _iso(ts: datetime | pd.Timestamp) -> str:
    t = pd.Timestamp(ts)
    t = t.tz_localize(UTC) if t.tzinfo is None else t.tz_convert(UTC)
    return t.isoformat().replace("+00:00", "Z")


def _finite_json(obj: Any) -> Any:
    """JSON-ready: numpy scalars unwrapped, NaN/inf → None, tuples → lists."""
    if isinstance(obj, Mapping):
        return {str(k): _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite_json(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
