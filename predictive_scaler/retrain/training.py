"""The retraining job's training function — one path for the weekly CronJob and the backtest.

:func:`train_and_promote` does, for one scaler at ``now``:

1. pull ``settings.history`` (28 days) of demand at the model step ending at ``now``
   through the history port, with the minimum-history and missing-data guards
   (fewer than ``min_history`` observed → *skipped*);
2. hold out the most recent ``holdout`` (2 days): the challenger never sees it;
3. :func:`~predictive_scaler.forecasting.selection.train_model` on the rest: the
   candidates scored by rolling origin on at most ``evaluation_window`` of the latest
   data before the holdout (after ``min_fit`` to train on), the best one fitted and
   calibrated;
4. score the challenger and the serving model on the held-out window — data neither
   was fitted on (if the serving model's training window reaches into the holdout,
   only the part after it is used) — and apply
   :func:`~predictive_scaler.forecasting.selection.promote`: not worse at the target
   quantile (pinball loss and coverage) → publish and serve; otherwise *kept*.

It reads and writes only through its ports: a :class:`~predictive_scaler.retrain.history.HistoryPort`
(Prometheus in the cluster, the trace replay in the backtest) and a
:class:`~predictive_scaler.retrain.stores.ModelStorePort` (the model store's directory, or
memory). The clock is the ``now`` argument. What is published is exactly the model that
was compared (fitted without the holdout).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from predictive_scaler.capacity_estimate import (
    CapacityEstimate,
    IdleGpus,
    estimate_capacity,
    summarise_idle,
)
from predictive_scaler.errors import (
    ConfigError,
    DataError,
    ModelError,
    ScalerError,
    SourceError,
    StoreError,
)
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.evaluation import (
    DEFAULT_HORIZONS,
    EvaluationSettings,
    horizon_steps,
    model_series,
)
from predictive_scaler.forecasting.metrics import all_metrics, naive_scale
from predictive_scaler.forecasting.selection import (
    PromotionDecision,
    TrainingResult,
    promote,
    train_model,
)
from predictive_scaler.forecasting.store import TrainingWindow
from predictive_scaler.forecasting.walkforward import DEFAULT_WINDOW_STEPS, walk_forward
from predictive_scaler.policy import events as event_policy
from predictive_scaler.policy.slo_capacity import Slo, estimate_slo_capacity
from predictive_scaler.retrain.history import HistoryPort, ServingPort
from predictive_scaler.retrain.ledger import Ledger, relative_scores
from predictive_scaler.retrain.outcome import ScalerOutcome, iso_time, learned_capacity_record
from predictive_scaler.retrain.settings import RetrainSettings, ScalerTarget
from predictive_scaler.retrain.stores import ModelStorePort
from predictive_scaler.series import Series, format_duration
from predictive_scaler.spec import ScalerSpec

#: Rolling-origin scoring needs at least this much data after ``min_fit``.
MIN_SCORED = timedelta(hours=6)


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
    return {"horizons": out, "origins": int(origins.size), "from": iso_time(g.start + g.step * first),
            "to": iso_time(g.end)}


def train_and_promote(
    target: ScalerTarget,
    history: HistoryPort,
    store: ModelStorePort,
    settings: RetrainSettings,
    now: datetime,
    run_id: str,
) -> ScalerOutcome:
    """Train a challenger for ``target`` on the history up to ``now``; publish and serve it only if it
    is not worse than the serving model (see the module doc).

    Expected problems (too little history, too many gaps, no candidate could be fitted) become a
    *skipped* outcome with the reason; a source that cannot be reached or answers garbage (a
    refused query, an impossible value) a *failed* one. Either way the serving model, if any,
    keeps serving.
    """
    return guarded(target, run_id, store,
                   lambda base: _train_and_promote(target, history, store, settings, now, run_id, base))


def guarded(target: ScalerTarget, run_id: str, store: ModelStorePort,
            work: Callable[[ScalerOutcome], ScalerOutcome]) -> ScalerOutcome:
    """``work(base)`` timed; a :class:`SourceError` made a *failed* outcome, any other expected problem
    (:class:`ScalerError`) a *skipped* one."""
    t0 = time.perf_counter()
    base = ScalerOutcome(key=target.key, model=target.model_name, result="skipped", reason="", run_id=run_id)
    try:
        outcome = work(base)
    except SourceError as exc:
        # Short history is this scaler's state and is skipped; a source that cannot be reached or
        # answers garbage means the job did not do its work, so it fails and the CronJob shows it.
        outcome = replace(base, result="failed", reason=f"{type(exc).__name__}: {exc}",
                          serving_version=store.serving_version(target.model_name))
    except ScalerError as exc:
        outcome = replace(base, result="skipped", reason=f"{type(exc).__name__}: {exc}",
                          serving_version=store.serving_version(target.model_name))
    return replace(outcome, seconds=round(time.perf_counter() - t0, 3))


def _fit_challenger(fit_part: Series, spec: ScalerSpec, settings: RetrainSettings,
                    horizons: tuple[timedelta, ...], scored: timedelta, *, kinds: Sequence[str] | None = None,
                    warm: Mapping[str, Mapping[str, Any]] | None = None,
                    scales: Mapping[str, str] | None = None) -> TrainingResult:
    """Select and fit the challenger on ``fit_part``, candidates (``kinds``, default the settings')
    scored on its last ``scored``; ``warm``: forecaster options that warm-start fits."""
    eval_settings = EvaluationSettings(quantile=spec.quantile, horizons=horizons,
                                       min_history=fit_part.span - scored)
    # Past occurrences of the scaler's scheduled events are Prophet's holidays for this fit.
    options: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (warm or {}).items()}
    for kind, extra in event_policy.forecaster_options(spec.events, fit_part.start.timestamp(),
                                                       fit_part.end.timestamp()).items():
        options[kind] = {**options.get(kind, {}), **extra}
    return train_model(fit_part, tuple(kinds or settings.kinds), spec.quantile, max(horizons),
                       min_history=eval_settings.min_history, step_seconds=spec.model.step_seconds,
                       settings=eval_settings, options=options, scales=scales)


def _challenger_from_ledger(store: ModelStorePort, model_name: str, fit_part: Series, spec: ScalerSpec,
                            settings: RetrainSettings, horizons: tuple[timedelta, ...], scored: timedelta,
                            end: datetime, run_id: str, notes: list[str]) -> TrainingResult:
    """:func:`_fit_challenger` after the scaler's earlier weeks (its ledger: losers skipped, fits
    warm-started), and the ledger updated with this week; cold when ``reuse_earlier_weeks`` is off."""
    if not settings.reuse_earlier_weeks:
        return _fit_challenger(fit_part, spec, settings, horizons, scored)
    ledger = _read_ledger(store, model_name, notes)
    skipped = ledger.skipped(settings.kinds, model_name, end)
    if skipped:
        notes.append("candidates skipped: " + "; ".join(f"{k}: {why}" for k, why in skipped.items()))
    result = _fit_challenger(fit_part, spec, settings, horizons, scored,
                             kinds=[k for k in settings.kinds if k not in skipped], warm=ledger.options(),
                             scales=ledger.scales(settings.kinds, model_name, end))
    relative = relative_scores(result.metrics.get("models", {}), settings.kinds)
    _write_ledger(store, model_name, ledger.after(run_id, end, relative, result.candidates, result.scale_margins),
                  notes)
    return result


def _read_ledger(store: ModelStorePort, model_name: str, notes: list[str]) -> Ledger:
    """The scaler's selection ledger; a missing or unreadable one is a cold week (a note), never a failure."""
    try:
        body = store.read_ledger(model_name)
        return Ledger() if body is None else Ledger.from_json(body)
    except (ModelError, StoreError) as exc:
        notes.append(f"selection ledger not used ({exc})")
        return Ledger()


def _write_ledger(store: ModelStorePort, model_name: str, ledger: Ledger, notes: list[str]) -> None:
    try:
        store.write_ledger(model_name, ledger.to_json())
    except StoreError as exc:
        notes.append(f"selection ledger not written ({exc}); next week runs cold")


def history_fingerprint(grid: Series, spec: ScalerSpec, settings: RetrainSettings) -> str:
    """sha256 of the pulled history (start, step, every value, gaps included) and of what training depends
    on besides it (the spec, the candidates, the windows): equal fingerprints train the same challenger."""
    h = hashlib.sha256()
    h.update(f"{grid.start.isoformat()}|{grid.step_seconds}|{len(grid)}|{spec!r}|".encode())
    h.update(repr((settings.kinds, settings.history, settings.holdout, settings.evaluation_window,
                   settings.min_fit)).encode())
    h.update(np.ascontiguousarray(grid.values, dtype=np.float64).tobytes())
    return h.hexdigest()


def _unchanged(store: ModelStorePort, model_name: str, fingerprint: str) -> str | None:
    """The serving version when it was trained on exactly this history (so retraining would repeat it)."""
    if store.serving_version(model_name) is None:
        return None
    try:
        serving = store.load_serving(model_name)
    except (ModelError, ConfigError):
        return None  # refused: retrain, and the comparison below says why
    return serving.version if serving.history_sha256 == fingerprint else None


def _serving(store: ModelStorePort, model_name: str, serving_version: str | None, grid: Series,
             hold_start: int) -> tuple[int, FittedModel | None, str | None]:
    """The serving model (None: there is none, or it was refused, and why), and the first step of
    the holdout it did not see: the two models are compared from there."""
    compare_from = hold_start
    serving_model: FittedModel | None = None
    if serving_version is None:
        return compare_from, serving_model, None
    try:
        loaded = store.load_serving(model_name)
        serving_model = loaded.model
        if loaded.trained_until > grid.start + grid.step * hold_start:
            compare_from = max(hold_start, int(math.ceil((loaded.trained_until - grid.start) / grid.step)))
    except (ModelError, ConfigError) as exc:
        return compare_from, serving_model, f"serving version {serving_version} was refused ({exc})"
    return compare_from, serving_model, None


def _train_and_promote(target: ScalerTarget, history: HistoryPort, store: ModelStorePort,
                       settings: RetrainSettings, now: datetime, run_id: str,
                       base: ScalerOutcome) -> ScalerOutcome:
    if target.spec is None:
        return replace(base, reason=target.problem or "invalid spec")
    spec = target.spec
    model_name = target.model_name
    step = spec.model.step_seconds
    end = datetime.fromtimestamp(math.floor(now.timestamp() / step) * step, UTC)
    start = end - settings.history
    demand = history.demand(target, start, end, step, min_history=settings.min_history,
                            max_missing_fraction=settings.max_missing_fraction)
    grid = model_series(demand, step)
    notes: list[str] = []
    capacity, idle, base = _serving_facts(target, history, grid, end, settings, notes, base)

    hold = int(settings.holdout.total_seconds() // grid.step_seconds)
    fit_part = grid.slice(0, len(grid) - hold)
    scored = min(settings.evaluation_window, fit_part.span - settings.min_fit)
    if scored < MIN_SCORED:
        raise DataError(f"{target.key}: {format_duration(fit_part.span)} before the holdout leaves too little "
                        f"to evaluate candidates; it needs about "
                        f"{format_duration(settings.min_fit + settings.holdout + MIN_SCORED)} of history")
    horizons = horizons_for(spec)
    fingerprint = history_fingerprint(grid, spec, settings)
    if (unchanged := _unchanged(store, model_name, fingerprint)) is not None:
        return replace(base, result="kept", serving_version=unchanged, notes=tuple(notes), capacity=capacity,
                       idle_gpus=idle, reason=(f"history unchanged since serving version {unchanged} was trained "
                                               "on it (same fingerprint): nothing new to learn; keep serving"))
    result = _challenger_from_ledger(store, model_name, fit_part, spec, settings, horizons, scored,
                                     end, run_id, notes)
    challenger = result.model

    serving_version = store.serving_version(model_name)
    hold_start = len(grid) - hold
    compare_from, serving_model, serving_note = _serving(store, model_name, serving_version, grid, hold_start)
    if serving_note is not None:
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
    metrics["retrain"] = {"run_id": run_id, "scaler": target.key, "decision": decision.reason,
                          "history_sha256": fingerprint}
    version = store.publish(model_name, challenger, window=TrainingWindow.of(fit_part), metrics=metrics,
                            capacity=capacity)
    try:
        store.promote(model_name, version)
    except ModelError as exc:
        return replace(outcome, result="failed", version=version,
                       reason=(f"published version {version} was refused when verified ({exc}); still "
                               f"serving {serving_version or 'nothing (the controller stays reactive)'}"))
    return replace(outcome, version=version, serving_version=version)


def _serving_facts(target: ScalerTarget, history: HistoryPort, grid: Series, end: datetime,
                   settings: RetrainSettings, notes: list[str],
                   base: ScalerOutcome) -> tuple[dict[str, Any] | None, dict[str, Any] | None, ScalerOutcome]:
    """The DCGM facts and the capacity learned at the SLO; problems are notes."""
    capacity, idle = _gpu_facts(target, history, grid, end, settings, notes)
    return capacity, idle, replace(base, learned_capacity=_learned_capacity(target, history, end, notes))


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


def _learned_capacity(target: ScalerTarget, history: HistoryPort, end: datetime,
                      notes: list[str]) -> dict[str, Any] | None:
    """Capacity per replica at ``capacity.slo`` from the served rate, latency and running batch the server
    exports; a problem is a note, never a failure. None when no SLO is set or the history port has no
    serving history (the backtest's trace replay)."""
    spec = target.spec
    assert spec is not None
    slo_spec = spec.capacity.slo
    if slo_spec is None or not isinstance(history, ServingPort):
        return None
    start = end - timedelta(hours=slo_spec.history_hours)
    slo = (Slo.latency(slo_spec.latency_p95_ms / 1000, 0.95) if slo_spec.latency_p95_ms is not None
           else Slo.knee())
    try:
        signals = history.serving(target, start, end)
        found = estimate_slo_capacity(
            signals.served, signals.mean_latency, slo=slo, latency_quantile=signals.latency_quantile,
            running=signals.running, gpu_util=signals.gpu_util, window_seconds=signals.window_seconds,
            unit=spec.demand_unit)
    except ScalerError as exc:
        notes.append(f"capacity at the SLO not learned ({exc})")
        return None
    return learned_capacity_record(found.kind, found.value, found.low, found.high, found.unit, slo.describe(),
                                   found.explanation)
