"""Choosing, training and promoting a model for one series.

:func:`train_model` is what the ``train`` command and the retraining job call:
evaluate the candidate kinds walk-forward (:mod:`evaluation`), pick the best
by pinball loss at the target quantile with coverage as a guard, then fit the
winner on all but the last ``calibration_window`` of history and calibrate it
on that window, so the served model's calibration is out of sample and recent.

:func:`promote` is the rule the retraining job and the backtest use before a
new model replaces the serving one: it must not be worse on a window neither
was fitted on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.calibration import (
    CALIBRATED_QUANTILES,
    CalibratedModel,
    calibrate,
)
from predictive_scaler.forecasting.evaluation import (
    DEFAULT_HORIZONS,
    DEFAULT_MODEL_STEP,
    EvaluationReport,
    EvaluationSettings,
    Progress,
    evaluate,
    horizon_steps,
    model_series,
    planned_fits,
    select,
)
from predictive_scaler.forecasting.walkforward import DEFAULT_WINDOW_STEPS, max_horizon_steps
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series, format_duration

__all__ = [
    "DEFAULT_MODEL_STEP",
    "EvaluationReport",
    "EvaluationSettings",
    "PromotionDecision",
    "TrainingResult",
    "evaluate",
    "model_series",
    "planned_fits",
    "promote",
    "select",
    "train_model",
]

#: A challenger may be this much worse in pinball loss (relative) and still count as "not worse".
PINBALL_TOLERANCE = 0.02
#: ... and its coverage may be this much further from the target (sampling noise).
COVERAGE_SLACK = 0.01


@dataclass(frozen=True)
class TrainingResult:
    model: CalibratedModel
    kind: str
    #: The evaluation document (`evaluate --json` shape) the choice was made on, plus the
    #: calibration window of the served model.
    metrics: dict[str, Any]
    #: Seconds the final fit took (wall clock).
    fit_seconds: float


def train_model(
    series: Series,
    kinds: Sequence[str] = registry.FORECASTER_KINDS,
    quantile: float = 0.95,
    horizon: timedelta = timedelta(minutes=30),
    *,
    min_history: timedelta = DEFAULT_MIN_HISTORY,
    step_seconds: int = DEFAULT_MODEL_STEP,
    settings: EvaluationSettings | None = None,
    progress: Progress | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> TrainingResult:
    """Evaluate ``kinds`` on ``series``, then fit and calibrate the selected one on recent history.

    ``options`` gives a kind its forecaster options (e.g. ``{"prophet": {"holidays": …}}``)."""
    horizons = tuple(sorted({*(h for h in DEFAULT_HORIZONS if h <= horizon), horizon}))
    cfg = settings or EvaluationSettings(quantile=quantile, horizons=horizons, min_history=min_history)
    cfg = replace(cfg, quantile=quantile)
    grid = model_series(series, step_seconds)
    report = evaluate(grid, kinds, cfg, step_seconds=step_seconds, progress=progress, options=options)
    if report.selected is None:
        failures = "; ".join(m.error or f"{k}: no score" for k, m in report.models.items())
        raise ModelError(f"{series.name}: no model could be evaluated ({failures})")
    kind = report.selected
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    train = int(cfg.train_window.total_seconds() // grid.step_seconds)
    fit_end = len(grid) - cal
    t0 = time.perf_counter()
    base = registry.forecaster(kind, **dict((options or {}).get(kind) or {})).fit(grid.slice(max(0, fit_end - train), fit_end))
    fit_seconds = time.perf_counter() - t0
    window = int(getattr(base, "window_steps", DEFAULT_WINDOW_STEPS))
    lo = max(0, fit_end - 1 - window)
    wanted = horizon_steps(horizon, grid.step_seconds) or 1
    model = calibrate(
        base,
        grid.slice(lo, len(grid)),
        fit_end - 1 - lo,
        quantiles=tuple(sorted({*CALIBRATED_QUANTILES, quantile})),
        horizon_steps=max(wanted, max_horizon_steps(grid.step_seconds)),
        adaptive=cfg.adaptive_calibration,
    )
    metrics = report.to_dict()
    metrics["calibration_window"] = format_duration(cfg.calibration_days)
    metrics["step_seconds"] = grid.step_seconds
    return TrainingResult(model=model, kind=kind, metrics=metrics, fit_seconds=fit_seconds)


@dataclass(frozen=True)
class PromotionDecision:
    promote: bool
    reason: str


def _score(metrics: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(pinball, coverage) from one horizon's metrics, or the mean over a model's horizons."""
    if not metrics:
        return None
    if "horizons" in metrics:
        rows = [h for h in metrics["horizons"].values()
                if h and h.get("pinball") is not None and h.get("coverage") is not None]
        if not rows:
            return None
        return (sum(float(h["pinball"]) for h in rows) / len(rows),
                sum(float(h["coverage"]) for h in rows) / len(rows))
    if metrics.get("pinball") is None or metrics.get("coverage") is None:
        return None
    return float(metrics["pinball"]), float(metrics["coverage"])


def promote(
    challenger_metrics: Mapping[str, Any] | None,
    serving_metrics: Mapping[str, Any] | None,
    quantile: float,
    *,
    pinball_tolerance: float = PINBALL_TOLERANCE,
    coverage_slack: float = COVERAGE_SLACK,
) -> PromotionDecision:
    """Should the challenger replace the serving model?

    Both metric sets must come from the same window, one neither model was
    fitted or calibrated on. Each is ``{"pinball": …, "coverage": …}`` for one
    horizon, or a model entry ``{"horizons": {...}}`` (averaged over horizons).
    """
    challenger = _score(challenger_metrics)
    serving = _score(serving_metrics)
    if challenger is None:
        return PromotionDecision(False, "challenger has no pinball/coverage scores; keep the serving model")
    if serving is None:
        return PromotionDecision(True, "no scores for the serving model; promote the scored challenger")
    c_pin, c_cov = challenger
    s_pin, s_cov = serving
    c_dev, s_dev = abs(c_cov - quantile), abs(s_cov - quantile)
    if c_pin > s_pin * (1.0 + pinball_tolerance):
        return PromotionDecision(
            False, f"challenger pinball {c_pin:.4g} is worse than serving {s_pin:.4g} beyond "
                   f"{pinball_tolerance:.0%}; keep serving")
    if c_dev > s_dev + coverage_slack:
        return PromotionDecision(
            False, f"challenger coverage {c_cov:.3f} is further from {quantile:g} than serving "
                   f"{s_cov:.3f}; keep serving")
    return PromotionDecision(
        True, f"challenger pinball {c_pin:.4g} vs serving {s_pin:.4g}, coverage {c_cov:.3f} vs "
              f"{s_cov:.3f} (target {quantile:g}): not worse; promote")
