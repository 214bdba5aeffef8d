"""Rolling-origin (walk-forward) evaluation, as the weekly retraining job would live it.

The first ``min_history`` (14 days) is the initial training period. Then,
week by week: the model is fitted on the data up to ``calibration_window``
before the week starts, calibrated on that last window (out of sample), and
scored on the week that follows — data neither the fit nor the calibration
saw. Every forecast at step t reads observations up to t only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Protocol

import numpy as np

from predictive_scaler.errors import ConfigError, InsufficientHistoryError, ModelError, ScalerError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import CALIBRATED_QUANTILES, calibrate
from predictive_scaler.forecasting.defaults import DEFAULT_VARIANT, Variant
from predictive_scaler.forecasting.metrics import METRIC_NAMES, all_metrics, naive_scale, pinball
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    MAX_HORIZON_SECONDS,
    leading_idle_steps,
    walk_forward,
)
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series, days_text, format_duration

#: Models work on a 5-minute grid; a trace with a coarser step is modelled at its own step.
DEFAULT_MODEL_STEP = 300
DEFAULT_HORIZONS: tuple[timedelta, ...] = tuple(timedelta(minutes=m) for m in (10, 20, 30))

#: Traces shorter than this are scored after 7 days of history instead of 14 (the ~14-day
#: bundled traces train on 7 days, as the backtest does).
SHORT_TRACE = timedelta(days=15)
SHORT_MIN_HISTORY = timedelta(days=7)


def initial_history_for(span: timedelta) -> timedelta:
    """History before the first scored origin of a trace spanning ``span``: 14 days, or 7 under 15 days."""
    return SHORT_MIN_HISTORY if span < SHORT_TRACE else DEFAULT_MIN_HISTORY
MIN_HORIZON = timedelta(minutes=5)
MAX_HORIZON = timedelta(seconds=MAX_HORIZON_SECONDS)
#: Selection guard: a model whose coverage is further than this from the target is not chosen.
COVERAGE_TOLERANCE = 0.02


def model_series(series: Series, step_seconds: int = DEFAULT_MODEL_STEP) -> Series:
    """``series`` on the model grid: finer traces are merged to ``step_seconds``, coarser kept."""
    if series.step_seconds >= step_seconds:
        return series
    if step_seconds % series.step_seconds:
        raise ConfigError(
            f"{series.name}: a {series.step_seconds}s step does not divide the {step_seconds}s model step; "
            "resample the trace to 1, 5 or 15 minutes",
            field="step",
        )
    return series.resample(step_seconds)


def horizon_steps(horizon: timedelta, step_seconds: int) -> int | None:
    """Steps in ``horizon`` at the model step, or None when it is not a whole number of steps."""
    secs = int(horizon.total_seconds())
    return secs // step_seconds if secs % step_seconds == 0 and secs >= step_seconds else None


class Progress(Protocol):
    """Anything with tqdm's ``update`` (the CLI passes a tqdm bar)."""

    def update(self, n: int = 1) -> Any: ...


@dataclass(frozen=True)
class EvaluationSettings:
    """How the rolling-origin evaluation runs; defaults mirror the weekly retraining job."""

    #: Target quantile for pinball loss and coverage (the P95 the planner uses).
    quantile: float = 0.95
    #: Horizons scored (5–60 min); one not a multiple of the model step is reported as null.
    horizons: tuple[timedelta, ...] = DEFAULT_HORIZONS
    #: Initial training period before the first scored week.
    min_history: timedelta = DEFAULT_MIN_HISTORY
    #: Refit and recalibrate this often (the retraining job runs weekly).
    refit_every: timedelta = timedelta(days=7)
    #: Out-of-sample data the calibration learns on, just before each scored week;
    #: None means a week (a full weekly cycle of residuals), at most half of ``min_history``.
    calibration_window: timedelta | None = None
    #: Longest history one fit sees (older data is dropped, as a retraining job would).
    train_window: timedelta = timedelta(days=28)
    #: Calibrate in units of recent volatility (wider in bursts, narrower when calm). Off by
    #: default: on the shared traces it widened intervals after every burst and lost pinball.
    adaptive_calibration: bool = False
    #: Models without a batch path are scored on at most this many origins (evenly thinned).
    max_slow_origins: int = 1500
    #: Coverage tracking in the calibration (:mod:`calibration`); off: static conformal shifts.
    tracked_calibration: bool = True
    #: ... at this tracker rate (None: :func:`calibration.calibrate` chooses it).
    tracking_rate: float | None = None
    #: Additive calibration (:data:`~predictive_scaler.forecasting.calibration.ADDITIVE_SHAPE`)
    #: instead of log-scale shifts.
    additive_calibration: bool = False
    #: How the served model is chosen (:class:`defaults.Variant`'s ``selection``) and the robust
    #: candidate it falls back to.
    selection: str = DEFAULT_VARIANT.selection
    robust_kind: str = DEFAULT_VARIANT.robust_kind
    #: Robust selection may serve the weighted combination (when the test tells it apart too).
    robust_combination: bool = DEFAULT_VARIANT.robust_combination
    #: Tracker rates the calibration chooses among, and the recency half-life of its scores.
    tracking_rates: tuple[float, ...] = DEFAULT_VARIANT.tracking_rates
    recency_half_life: timedelta | None = (None if DEFAULT_VARIANT.half_life_hours is None
                                           else timedelta(hours=DEFAULT_VARIANT.half_life_hours))

    def __post_init__(self) -> None:
        if not (0.5 <= self.quantile < 1.0):
            raise ConfigError(f"quantile {self.quantile} must be in [0.5, 1), e.g. 0.95", field="quantile")
        if not self.horizons:
            raise ConfigError("no horizons given; use e.g. 10m,20m,30m", field="horizons")
        for h in self.horizons:
            if not (MIN_HORIZON <= h <= MAX_HORIZON):
                raise ConfigError(
                    f"horizon {format_duration(h)} is outside 5m–60m; choose horizons in that range",
                    field="horizons",
                )
        if self.calibration_window is None:
            object.__setattr__(self, "calibration_window", min(timedelta(days=7), self.min_history / 2))
        assert self.calibration_window is not None
        if self.calibration_window >= self.min_history:
            raise ConfigError(
                f"calibration window {format_duration(self.calibration_window)} must be shorter than the "
                f"minimum history {format_duration(self.min_history)}",
                field="calibration_window",
            )
        if self.refit_every <= timedelta(0) or self.train_window <= timedelta(0):
            raise ConfigError("refit interval and training window must be positive", field="refit_every")

    def with_variant(self, variant: Variant) -> EvaluationSettings:
        """These settings with ``variant``'s selection and calibration."""
        return replace(self, selection=variant.selection, robust_kind=variant.robust_kind,
                       robust_combination=variant.robust_combination,
                       tracking_rates=variant.tracking_rates,
                       recency_half_life=None if variant.half_life_hours is None
                       else timedelta(hours=variant.half_life_hours))

    @property
    def half_life_seconds(self) -> float | None:
        return None if self.recency_half_life is None else self.recency_half_life.total_seconds()

    @property
    def calibration_days(self) -> timedelta:
        """The calibration window in effect (resolved at construction)."""
        assert self.calibration_window is not None
        return self.calibration_window

    @property
    def quantiles(self) -> tuple[float, ...]:
        return tuple(sorted({0.5, self.quantile}))


@dataclass(frozen=True)
class Block:
    """One retraining period, as step indices: fit [fit_start, fit_end), calibrate [fit_end, start), score [start, end)."""

    fit_start: int
    fit_end: int
    start: int
    end: int


def plan_blocks(series: Series, settings: EvaluationSettings) -> list[Block]:
    step = series.step_seconds
    first = int(settings.min_history.total_seconds() // step)
    cal = int(settings.calibration_days.total_seconds() // step)
    every = max(1, int(settings.refit_every.total_seconds() // step))
    train = int(settings.train_window.total_seconds() // step)
    if len(series) <= first:
        need = settings.min_history.total_seconds() / 86400
        have = days_text(series.span, settings.min_history)
        what = (f"{have} < {need:g} days required to train and then evaluate" if series.span < settings.min_history
                else f"{have} leaves nothing to evaluate after the first {need:g} days (--min-history, what the "
                     "models train on)")
        raise InsufficientHistoryError(
            f"{series.source or series.name}: insufficient history: {what}; supply a longer trace ({need + 7:g} "
            "days give a week to evaluate) or lower --min-history"
        )
    return [
        Block(max(0, s - cal - train), s - cal, s, min(s + every, len(series)))
        for s in range(first, len(series), every)
    ]


@dataclass(frozen=True)
class ModelEvaluation:
    kind: str
    #: Horizon label ("30m") → metric name → value (None when undefined).
    horizons: Mapping[str, Mapping[str, float | None]]
    #: Mean seconds per fit (wall clock), None if no fit succeeded.
    fit_seconds: float | None
    origins: int = 0
    error: str | None = None
    #: Mean pinball loss over the horizons in each walk-forward block (None: the block's fit or
    #: forecasts failed), so models can be compared on the blocks they were all scored on.
    block_pinball: tuple[float | None, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "horizons": {label: dict(m) for label, m in self.horizons.items()},
            "fit_seconds": self.fit_seconds,
        }
        if self.error:
            doc["error"] = self.error
        return doc


@dataclass(frozen=True)
class EvaluationReport:
    quantile: float
    selected: str | None
    models: Mapping[str, ModelEvaluation]
    step_seconds: int
    series: str
    blocks: int = 0
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The `evaluate --json` document (values are finite numbers or None)."""
        return {
            "quantile": self.quantile,
            "selected": self.selected,
            "models": {name: m.to_dict() for name, m in self.models.items()},
        }


def _empty_horizons(settings: EvaluationSettings) -> dict[str, dict[str, float | None]]:
    return {format_duration(h): dict.fromkeys(METRIC_NAMES) for h in settings.horizons}


def evaluate_model(  # noqa: PLR0915
    kind: str,
    series: Series,
    settings: EvaluationSettings | None = None,
    *,
    progress: Progress | None = None,
    forecaster_options: Mapping[str, Any] | None = None,
) -> ModelEvaluation:
    """Walk-forward scores of one model kind on ``series`` (already on the model grid).

    A model that cannot be fitted is reported with ``error`` set and null
    metrics rather than aborting the whole evaluation.
    """
    cfg = settings or EvaluationSettings()
    blocks = plan_blocks(series, cfg)
    step = series.step_seconds
    labels = {format_duration(h): horizon_steps(h, step) for h in cfg.horizons}
    defined = sorted({s for s in labels.values() if s is not None})
    h_max = max(defined) if defined else 1
    qs = cfg.quantiles
    k_target = qs.index(cfg.quantile)
    cal_qs = tuple(sorted({*CALIBRATED_QUANTILES, cfg.quantile}))
    scale = naive_scale(series.values[: blocks[0].start])
    collected: dict[int, list[np.ndarray]] = {h: [] for h in defined}
    fit_times: list[float] = []
    origins_scored = 0
    try:
        forecaster = registry.forecaster(kind, **dict(forecaster_options or {}))
    except (ScalerError, ImportError, TypeError) as exc:
        return ModelEvaluation(kind, _empty_horizons(cfg), None, error=_describe(kind, exc))
    stride = 1
    error: str | None = None
    per_block: list[float | None] = []
    live = leading_idle_steps(series.values)
    for block in blocks:
        try:
            t0 = time.perf_counter()
            base = forecaster.fit(series.slice(block.fit_start, block.fit_end))
            fit_times.append(time.perf_counter() - t0)
            batch = hasattr(base, "walk_forward")
            if not batch:
                total = len(series) - blocks[0].start
                stride = max(1, math.ceil(total / cfg.max_slow_origins))
            window = int(getattr(base, "window_steps", DEFAULT_WINDOW_STEPS))
            lo = max(0, block.fit_end - 1 - window)
            model = calibrate(base, series.slice(lo, block.start), block.fit_end - 1 - lo,
                              quantiles=cal_qs, horizon_steps=h_max, stride=stride,
                              adaptive=cfg.adaptive_calibration,
                              tracking_rate=cfg.tracking_rate if cfg.tracked_calibration else 0.0,
                              additive=cfg.additive_calibration, tracking_rates=cfg.tracking_rates,
                              half_life_seconds=cfg.half_life_seconds,
                              live_from=live - lo)
            # A tracked model replays its recent forecasts: give it its whole window.
            lo = max(0, block.start - 1 - int(getattr(model, "window_steps", window)))
            origins = np.arange(block.start - 1, block.end - 1, stride)
            fc = walk_forward(model, series.slice(lo, block.end - 1 + 1), origins - lo, h_max, qs)
        except (ScalerError, ValueError, np.linalg.LinAlgError) as exc:
            error = _describe(kind, exc)
            per_block.append(None)
            if progress is not None:
                progress.update(1)
            continue
        origins_scored += origins.size
        losses = []
        for h in defined:
            target = origins + h
            actual = np.full(origins.size, np.nan)
            inside = target < len(series)
            actual[inside] = series.values[target[inside]]
            collected[h].append(np.column_stack([actual, fc[:, 0, h - 1], fc[:, k_target, h - 1]]))
            loss = pinball(actual, fc[:, k_target, h - 1], cfg.quantile)
            if loss is not None:
                losses.append(loss)
        per_block.append(float(np.mean(losses)) if losses else None)
        if progress is not None:
            progress.update(1)
    horizons = _empty_horizons(cfg)
    for label, steps in labels.items():
        if steps is None or not collected[steps]:
            continue
        rows = np.concatenate(collected[steps])
        horizons[label] = all_metrics(rows[:, 0], rows[:, 1], rows[:, 2], cfg.quantile, scale)
    fit_seconds = float(np.mean(fit_times)) if fit_times else None
    if origins_scored == 0 and error is None:
        error = f"{kind}: no forecast could be scored"
    return ModelEvaluation(kind, horizons, fit_seconds, origins_scored,
                           error=error if origins_scored == 0 else None, block_pinball=tuple(per_block))


def _describe(kind: str, exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"{kind}: model not available ({exc}); choose another model"
    return f"{kind}: {exc}"


def select(
    models: Mapping[str, ModelEvaluation], quantile: float, tolerance: float = COVERAGE_TOLERANCE
) -> str | None:
    """Lowest mean pinball loss among models whose coverage is within ``tolerance`` of ``quantile``
    at every scored horizon; if none is, the model whose coverage strays least."""
    scored: list[tuple[str, float, float]] = []
    for name, m in models.items():
        if m.error:
            continue
        rows = [h for h in m.horizons.values() if h.get("pinball") is not None and h.get("coverage") is not None]
        if not rows:
            continue
        pin = float(np.mean([float(h["pinball"]) for h in rows]))  # type: ignore[arg-type]
        dev = max(abs(float(h["coverage"]) - quantile) for h in rows)  # type: ignore[arg-type]
        scored.append((name, pin, dev))
    if not scored:
        return None
    eligible = [s for s in scored if s[2] <= tolerance + 1e-12]
    if eligible:
        return min(eligible, key=lambda s: s[1])[0]
    return min(scored, key=lambda s: s[2])[0]


def select_on_common_blocks(models: Mapping[str, ModelEvaluation]) -> str | None:
    """Lowest mean pinball loss over the walk-forward blocks that every scored model has a score
    in — no coverage guard: pinball loss at the quantile already charges a quantile that misses
    (a guard on a few days' coverage served seasonal-naive at 4.8× the best candidate's loss on
    the following week of servegen_m_large). A model that failed in every block is not chosen;
    with no block in common, the mean over each model's own blocks decides."""
    scored = {name: m.block_pinball for name, m in models.items()
              if not m.error and any(v is not None for v in m.block_pinball)}
    if not scored:
        return None
    n = max(len(b) for b in scored.values())
    common = [i for i in range(n) if all(i < len(b) and b[i] is not None for b in scored.values())]

    def loss(blocks: tuple[float | None, ...]) -> float:
        return mean_block_pinball([blocks[i] for i in common] if common else blocks)

    return min(scored, key=lambda name: loss(scored[name]))


def mean_block_pinball(blocks: Sequence[float | None]) -> float:
    """Mean of the blocks' pinball losses that were scored (None: not scored); inf when none was."""
    scored = [float(v) for v in blocks if v is not None]
    return float(np.mean(scored)) if scored else math.inf


def evaluate(
    series: Series,
    kinds: Sequence[str] = registry.FORECASTER_KINDS,
    settings: EvaluationSettings | None = None,
    *,
    step_seconds: int = DEFAULT_MODEL_STEP,
    progress: Progress | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> EvaluationReport:
    """Evaluate each model kind walk-forward on ``series`` and select one.

    ``options`` gives a kind its forecaster options (e.g. Prophet's ``holidays``)."""
    cfg = settings or EvaluationSettings()
    grid = model_series(series, step_seconds)
    if not kinds:
        raise ModelError(f"no models to evaluate; choose from {', '.join(registry.FORECASTER_KINDS)}")
    results = {kind: evaluate_model(kind, grid, cfg, progress=progress, forecaster_options=(options or {}).get(kind))
               for kind in kinds}
    notes = tuple(
        f"{format_duration(h)} is not a multiple of the {grid.step_seconds}s step: undefined"
        for h in cfg.horizons if horizon_steps(h, grid.step_seconds) is None
    )
    return EvaluationReport(
        quantile=cfg.quantile,
        selected=select(results, cfg.quantile),
        models=results,
        step_seconds=grid.step_seconds,
        series=series.name,
        blocks=len(plan_blocks(grid, cfg)),
        notes=notes,
    )


def planned_fits(series: Series, kinds: Sequence[str], settings: EvaluationSettings | None = None,
                 step_seconds: int = DEFAULT_MODEL_STEP) -> int:
    """How many fits :func:`evaluate` will run (the progress bar's total)."""
    return len(plan_blocks(model_series(series, step_seconds), settings or EvaluationSettings())) * len(kinds)
