"""Choosing, training and promoting a model for one series.

:func:`train_model` is what the ``train`` command, the retraining job and the
backtest call: every candidate kind is fitted on all but the last
``calibration_window`` of history and calibrated on that window (so the served
model's calibration is out of sample and recent); each is scored cross-fitted
on that window (calibrated on one half, scored on the other, and back) and the
lowest pinball loss at the target quantile serves, or a weighted combination of
the best three (and the ensemble, :data:`DEFAULT_MEMBER`): the mean of the weights that win
on each quarter of the window and of the ensemble alone (one vote), so a choice only some
quarters support is hedged (:func:`combination.stable_combination`).
On short history — a calibration window under :data:`SHORT_CALIBRATION`, e.g. 7
days of history — the choice is a walk-forward one over daily refits instead
(see :data:`SHORT_CALIBRATION` for why).

:func:`promote` is the rule the retraining job and the backtest use before a
new model replaces the serving one: it must not be worse on a window neither
was fitted on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np

from predictive_scaler.errors import ModelError, ScalerError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.calibration import (
    CALIBRATED_QUANTILES,
    DEFAULT_TRACKING_RATE,
    MIN_SCORES,
    TRACKING_RATES,
    CalibratedModel,
    calibrate,
)
from predictive_scaler.forecasting.combination import (
    MAX_MEMBERS,
    MEAN,
    CombinationModel,
    OnlineWeights,
    combine_quantiles,
    recalibration,
    stable_combination,
)
from predictive_scaler.forecasting.evaluation import (
    DEFAULT_HORIZONS,
    DEFAULT_MODEL_STEP,
    EvaluationSettings,
    ModelEvaluation,
    Progress,
    evaluate,
    evaluate_model,
    horizon_steps,
    mean_block_pinball,
    model_series,
    planned_fits,
    select_on_common_blocks,
)
from predictive_scaler.forecasting.logscale import choose_log_offset
from predictive_scaler.forecasting.metrics import (
    METRIC_NAMES,
    all_metrics,
    naive_scale,
    pinball_losses,
)
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    leading_idle_steps,
    max_horizon_steps,
    walk_forward,
)
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series, format_duration

__all__ = [
    "PromotionDecision",
    "TrainingResult",
    "planned_training_fits",
    "promote",
    "train_model",
]

#: A challenger may be this much worse in pinball loss (relative) and still count as "not worse".
PINBALL_TOLERANCE = 0.02
#: ... and its coverage may be this much further from the target (sampling noise).
COVERAGE_SLACK = 0.01


@dataclass(frozen=True)
class TrainingResult:
    model: FittedModel
    kind: str
    #: The evaluation document (`evaluate --json` shape) the choice was made on, plus the
    #: calibration window of the served model.
    metrics: dict[str, Any]
    #: Seconds the final fit took (wall clock).
    fit_seconds: float
    #: Every candidate fitted (by kind), the served one among them.
    candidates: Mapping[str, FittedModel] = field(default_factory=dict)
    #: Where both scales of conformal shifts were tried: the losing one's mean pinball ÷ the kept one's.
    scale_margins: Mapping[str, float] = field(default_factory=dict)


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
    scales: Mapping[str, str] | None = None,
) -> TrainingResult:
    """Fit and calibrate every kind on ``series``, score them cross-fitted, serve the best.

    See :func:`train_candidates`; ``metrics`` has the `evaluate --json` shape, its scores
    from the calibration window.

    ``options`` gives a kind its forecaster options (e.g. ``{"prophet": {"holidays": …}}``);
    ``scales`` the one scale a kind's shifts are calibrated on (:data:`SCALES`) instead of trying both.
    """
    horizons = tuple(sorted({*(h for h in DEFAULT_HORIZONS if h <= horizon), horizon}))
    cfg = settings or EvaluationSettings(quantile=quantile, horizons=horizons, min_history=min_history)
    cfg = replace(cfg, quantile=quantile)
    grid = model_series(series, step_seconds)
    trained = train_candidates(grid, kinds, cfg, horizon, progress=progress, options=options, every=False,
                               scales=scales)
    if trained.selected is None:
        failures = "; ".join(m.error or f"{k}: no score" for k, m in trained.scores.items())
        raise ModelError(f"{series.name}: no model could be evaluated ({failures})")
    kind = trained.selected
    metrics = {
        "quantile": cfg.quantile,
        "selected": kind,
        "models": {k: m.to_dict() for k, m in trained.scores.items()},
        "calibration_window": format_duration(cfg.calibration_days),
        "step_seconds": grid.step_seconds,
        "selection": (ROBUST_SELECTION_METHOD if cfg.selection == "robust"
                      else SHORT_SELECTION_METHOD if short_history(cfg) else SELECTION_METHOD),
    }
    if trained.reason:
        metrics["selection_reason"] = trained.reason
    return TrainingResult(model=trained.models[kind], kind=kind, metrics=metrics,
                          fit_seconds=trained.fit_seconds[kind], candidates=dict(trained.models),
                          scale_margins=dict(trained.scale_margins))


SELECTION_METHOD = (
    "every candidate fitted before the calibration window; scored cross-fitted on it (calibrated "
    "on one half, scored on the other, and back); lowest mean pinball loss at the quantile wins, or "
    "a combination of the best three (and the ensemble) weighted by the mean of the weights that win "
    "on each quarter and of the ensemble alone"
)
ROBUST_SELECTION_METHOD = (
    "every candidate fitted before the calibration window, calibrated on it and scored cross-fitted "
    "there; the lowest mean pinball loss at the quantile serves only when a paired test on 6-hour "
    "blocks tells it from the robust candidate, which serves otherwise"
)
SHORT_SELECTION_METHOD = (
    "short history: every candidate scored walk-forward, refitted daily, on the data after its first "
    "fit and calibration windows; the winner (lowest mean pinball loss at the quantile over the days "
    "every candidate was scored on) fitted before the calibration window and calibrated on it"
)
#: A calibration window shorter than this (the backtest's and the protocol's 7-day trainings
#: have 2 days) is too short to choose on: its cross-fitting halves are single days. On the
#: 7-day trainings, choosing there served combinations with seasonal-naive (5× persistence's
#: pinball on the following week of nab_rds_cpu_e47b3b) and tracked shifts whose step cannot be
#: chosen on so little; the backtest's gap closed fell on three of the four 14-day traces. On
#: such history :func:`train_candidates` chooses walk-forward instead — over the longer window
#: after the first fit and calibration (3 of 7 days), refitted every day (:data:`SHORT_REFIT`),
#: by pinball loss alone
#: (:func:`~predictive_scaler.forecasting.evaluation.select_on_common_blocks`) — and serves
#: one model, its calibration chosen on the same daily blocks (:func:`_short_calibration`).
SHORT_CALIBRATION = timedelta(days=3)
#: On short history the walk-forward choice refits every day (blocks of a day each, every one
#: fitted before its own calibration window), so the choice rests on more than one window.
SHORT_REFIT = timedelta(days=1)
#: Coverage-tracking rates the short-history winner may serve with (0: static shifts).
SHORT_TRACKING_RATES: tuple[float, ...] = TRACKING_RATES
#: ... and the rate and additive shifts are chosen only on at least this many daily blocks: a
#: calibration that wins on one day's forecasts is noise (the backtest's 6-day training of servegen_m_large chose 0.3 for ensemble on its one
#: scored day and lost 0.25 of gap closed to static shifts).
SHORT_TRACKING_BLOCKS = 2


#: The short-history winner's calibration when the history was idle until its last calibration
#: window (:func:`launched_during_calibration`): coverage tracked at the default rate, shifts
#: additive (:data:`calibration.ADDITIVE_SHAPE`). Every daily block the choice would be made on was
#: fitted and calibrated on idle steps, so :func:`_short_calibration` would choose on noise, and the
#: static shifts rest on the hours since the launch. Chosen on the launch runs of the held-out bench
#: (the 14-day traces and the slices with their first 152 hours idle, 13 runs; geometric mean of
#: served ÷ best peer, with :func:`calibration.live_origins` then scoring the latest origins where too
#: few were live, which differs on the three 30-minute taxi runs only): 1.056 choosing on the blocks
#: (log-scale shifts, tracked, on every run), 1.077 log-scale at 0.15, 0.934 / 0.917 / 0.922
#: additive at 0.05 / 0.15 / 0.3 — the default rate (:data:`calibration.DEFAULT_TRACKING_RATE`),
#: not the best of three, is what serves; 0.937 as shipped.
LAUNCH_CALIBRATION: tuple[float, bool] = (DEFAULT_TRACKING_RATE, True)


def launched_during_calibration(grid: Series, cfg: EvaluationSettings, idle: int | None = None) -> bool:
    """Was the history idle (one value, :func:`walkforward.leading_idle_steps`, or ``idle`` steps where
    the caller counted them) until after its last calibration window began — a service launched days
    into the history a training run is given?"""
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    return (leading_idle_steps(grid.values) if idle is None else idle) > len(grid) - cal


def short_history(cfg: EvaluationSettings) -> bool:
    """Is the calibration window too short to choose and calibrate on (:data:`SHORT_CALIBRATION`)?"""
    return cfg.calibration_days < SHORT_CALIBRATION


@dataclass(frozen=True)
class TrainedCandidates:
    """Every candidate as :func:`train_model` builds it, its cross-fitted scores and the choice."""

    models: Mapping[str, FittedModel]
    scores: Mapping[str, ModelEvaluation]
    fit_seconds: Mapping[str, float]
    selected: str | None
    #: When the selected model is a combination: its members (kinds) and weights.
    combination: tuple[tuple[str, ...], tuple[float, ...]] | None = None
    #: Robust selection: each candidate's pinball per cross-fitted origin (mean over the horizons
    #: scored, NaN where an actual is missing), origins in the same order for every candidate.
    losses: Mapping[str, np.ndarray] | None = None
    #: ... the cross-fitted winner and why the served one was served.
    reason: str = ""
    #: Where both scales were calibrated: the losing scale's mean pinball ÷ the kept one's (≥ 1).
    scale_margins: Mapping[str, float] = field(default_factory=dict)


def train_candidates(
    grid: Series, kinds: Sequence[str], cfg: EvaluationSettings,
    horizon: timedelta = timedelta(minutes=30), *, progress: Progress | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None, every: bool = True,
    scales: Mapping[str, str] | None = None,
) -> TrainedCandidates:
    """Fit every kind on ``grid`` (on the model grid) up to its last calibration window C and
    calibrate it on C (:func:`fit_calibrated`: what is served). Each is also scored on C,
    cross-fitted: the same fitted model calibrated on one half of C and scored on the other,
    then the other way round — out of sample for both fit and calibration, and the models
    scored are the ones that would serve (not refits on shorter history). The winner has the
    lowest mean pinball loss at the target quantile over the horizons: the tracked
    calibration holds coverage, and pinball loss already charges a P95 that misses. The best
    three and the ensemble are combined (:func:`_combination`) unless every quarter of C picks
    the ensemble alone.

    On short history (:func:`short_history`) the choice is walk-forward instead (see
    :data:`SHORT_CALIBRATION`); ``every=False`` then fits only the winner.

    Shifts are calibrated on the log scale and additively (:data:`calibration.ADDITIVE_SHAPE`),
    and the better one kept; a kind in
    ``scales`` is calibrated on that scale only (the retraining job's ledger: the scale it kept
    week after week).
    """
    if cfg.selection == "robust":
        return _train_robust(grid, kinds, cfg, horizon, progress=progress, options=options)
    if short_history(cfg):
        return _train_short(grid, kinds, cfg, horizon, progress=progress, options=options, every=every)
    models: dict[str, FittedModel] = {}
    scores: dict[str, ModelEvaluation] = {}
    fits: dict[str, float] = {}
    rows: dict[str, dict[int, np.ndarray]] = {}
    margins: dict[str, float] = {}
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    empty = {format_duration(h): dict.fromkeys(METRIC_NAMES) for h in cfg.horizons}
    for kind in kinds:
        fixed = (scales or {}).get(kind)
        try:
            additive = fixed == ADDITIVE_SCALE and not cfg.adaptive_calibration
            model, fit_s = fit_calibrated(kind, grid, cfg, horizon, options=options, additive=additive)
            horizons, rows[kind] = crossfit_scores(model.base, grid, cal, cfg, model.tracking_rate,
                                                   additive=additive)
            if not cfg.adaptive_calibration and fixed is None:
                # Additive shifts instead of log-scale ones, when that scores better.
                other = calibrated(model.base, grid, cfg, horizon, additive=True)
                got = crossfit_scores(model.base, grid, cal, cfg, other.tracking_rate, additive=True)
                log_loss, additive_loss = _mean_pinball(horizons), _mean_pinball(got[0])
                if additive_loss < log_loss:
                    model, (horizons, rows[kind]) = other, got
                if min(log_loss, additive_loss) > 0:
                    margins[kind] = max(log_loss, additive_loss) / min(log_loss, additive_loss)
        except (ScalerError, ImportError, ValueError, np.linalg.LinAlgError) as exc:
            scores[kind] = ModelEvaluation(kind, empty, None, error=f"{kind}: {exc}")
        else:
            models[kind], fits[kind] = model, fit_s
            scores[kind] = ModelEvaluation(kind, horizons, fit_s, origins=cal)
        if progress is not None:
            progress.update(1)
    pins = {}
    for kind, m in scores.items():
        pinballs = [h["pinball"] for h in m.horizons.values() if h.get("pinball") is not None]
        if kind in models and pinballs:
            pins[kind] = float(np.mean([float(v) for v in pinballs]))  # type: ignore[arg-type]
    selected = min(pins, key=lambda k: pins[k]) if pins else None
    combo = _combination(combination_pool(pins), rows, models, cfg, horizon)
    if combo is not None:
        members, weights, combined, horizons, _ = combo
        models[COMBINATION] = combined
        scores[COMBINATION] = ModelEvaluation(COMBINATION, horizons, None, origins=cal)
        fits[COMBINATION] = sum(fits[k] for k in members)
        return TrainedCandidates(models=models, scores=scores, fit_seconds=fits, selected=COMBINATION,
                                 combination=(members, weights), scale_margins=margins)
    return TrainedCandidates(models=models, scores=scores, fit_seconds=fits, selected=selected,
                             scale_margins=margins)


#: The scales conformal shifts are calibrated on: log(x + c), or additive
#: (:data:`calibration.ADDITIVE_SHAPE`; a ledger's "additive" from before that shape means the same choice).
LOG_SCALE, ADDITIVE_SCALE = "log", "additive"
SCALES: tuple[str, ...] = (LOG_SCALE, ADDITIVE_SCALE)


def scale_of(model: CalibratedModel) -> str:
    """The scale (:data:`SCALES`) ``model``'s shifts were calibrated on."""
    return ADDITIVE_SCALE if model.additive else LOG_SCALE

COMBINATION = CombinationModel.kind
#: The robust default the combination's weights shrink towards (one window's vote,
#: :func:`combination.stable_combination`'s ``prior``), a member even when not among the best
#: three: the ensemble, itself a combination learnt out of sample. Where the calibration window's
#: picks do not carry over to the week served (nab_twitter_aapl: arima×0.8 picked, then 1.4× the
#: ensemble's loss), it was the candidate nearest the best one in hindsight. Measured in the
#: forecast protocol (with :data:`combination.PARTS`, against no prior), served 30-minute
#: normalised pinball: nab_twitter_aapl -0.8 %, nasa_http_1995 +0.7 %, nab_nyc_taxi -1.5 %.
DEFAULT_MEMBER = "ensemble"


def combination_pool(pins: Mapping[str, float]) -> list[str]:
    """The candidates a combination is searched over, best (lowest ``pins``) first: the best
    :data:`~predictive_scaler.forecasting.combination.MAX_MEMBERS`, and :data:`DEFAULT_MEMBER`
    last when it was scored but is not among them."""
    ranked = sorted(pins, key=lambda k: pins[k])[:MAX_MEMBERS]
    if DEFAULT_MEMBER in pins and DEFAULT_MEMBER not in ranked:
        ranked.append(DEFAULT_MEMBER)
    return ranked


def _train_short(
    grid: Series, kinds: Sequence[str], cfg: EvaluationSettings, horizon: timedelta, *,
    progress: Progress | None, options: Mapping[str, Mapping[str, Any]] | None, every: bool,
) -> TrainedCandidates:
    """:func:`train_candidates` on short history: the walk-forward choice over daily blocks
    (:data:`SHORT_REFIT`), by pinball loss on the blocks every candidate was scored in; the
    winner calibrated as scores best on the same blocks (:func:`_short_calibration`)."""
    walk = _walk_settings(cfg)
    report = evaluate(grid, kinds, walk, step_seconds=grid.step_seconds, progress=progress, options=options)
    selected = select_on_common_blocks(report.models)
    reason = ""
    idle = leading_idle_steps(grid.values)
    if selected is None:
        rate, additive = 0.0, False
    elif launched_during_calibration(grid, cfg, idle):
        rate, additive = LAUNCH_CALIBRATION
        since = timedelta(seconds=(len(grid) - idle) * grid.step_seconds)
        reason = (f"the history held one value until {format_duration(since)} before its end, inside its last "
                  f"calibration window (a launch): scored from then on where {MIN_SCORES} or more steps are, "
                  f"additive shifts tracked at {rate:g}, not a choice made on daily blocks fitted on idle days")
    else:
        rate, additive = _short_calibration(grid, selected, walk, report.models[selected], options)
    models: dict[str, FittedModel] = {}
    fits: dict[str, float] = {}
    scores = dict(report.models)
    for kind in kinds:
        # A kind whose walk-forward fits failed (e.g. too little history for its season) cannot
        # be chosen, but is still fitted when ``every`` (the protocol scores every candidate).
        if not (every or kind == selected):
            continue
        try:
            models[kind], fits[kind] = fit_calibrated(kind, grid, cfg, horizon, options=options,
                                                      tracking_rate=rate, additive=additive)
        except (ScalerError, ImportError, ValueError, np.linalg.LinAlgError) as exc:
            if kind == selected:
                raise
            if not scores[kind].error:
                scores[kind] = ModelEvaluation(kind, scores[kind].horizons, None, error=f"{kind}: {exc}")
    return TrainedCandidates(models=models, scores=scores, fit_seconds=fits, selected=selected, reason=reason)


#: Robust selection: the cross-fitted origins are grouped into blocks of this length for the
#: paired test (errors within a few hours move together; 7 days give 28 blocks, 2 days 8).
TEST_BLOCK = timedelta(hours=6)
#: ... and the winner replaces the robust candidate only when its mean loss is lower beyond
#: a one-sided test at this level.
TEST_LEVEL = 0.9


def paired_block_test(winner: np.ndarray, other: np.ndarray, block_steps: int,
                      level: float = TEST_LEVEL) -> tuple[bool, float, float]:
    """Can the calibration window tell ``winner``'s per-origin losses from ``other``'s?

    A paired test on blocks: the loss difference (winner − other) is averaged per block of
    ``block_steps`` consecutive origins (both sides' missing origins dropped), and the winner is
    better beyond doubt when the one-sided Student-t upper bound at ``level`` of the blocks' mean
    difference is below zero. Returns (told apart, relative difference of the means, that upper
    bound relative to ``other``'s mean loss)."""
    from scipy import stats

    ok = np.isfinite(winner) & np.isfinite(other)
    d, base = (winner - other)[ok], other[ok]
    if d.size == 0 or float(np.mean(base)) <= 0:
        return False, math.nan, math.nan
    blocks = max(1, d.size // max(1, block_steps))
    means = np.array([float(np.mean(part)) for part in np.array_split(d, blocks)])
    scale = float(np.mean(base))
    mean = float(np.mean(means))
    if blocks < 3:
        return False, mean / scale, math.inf
    se = float(np.std(means, ddof=1)) / math.sqrt(blocks)
    upper = mean + float(stats.t.ppf(level, blocks - 1)) * se
    return upper < 0, mean / scale, upper / scale


def robust_choice(trained: TrainedCandidates, robust_kind: str, step_seconds: int,
                  kinds: Sequence[str] | None = None) -> tuple[str | None, str]:
    """The robust rule on candidates already trained and cross-fitted (:func:`_train_robust`):
    the lowest mean cross-fitted pinball among ``kinds`` (default: all) serves when
    :func:`paired_block_test` tells it from ``robust_kind``; otherwise ``robust_kind`` serves
    (or the winner when ``robust_kind`` could not be fitted). Returns the kind and the reason."""
    losses = trained.losses or {}
    have = [k for k in (kinds or list(losses)) if k in losses and k in trained.models]
    if not have:
        return None, "no candidate could be scored"
    mean = {k: float(np.nanmean(losses[k])) if np.isfinite(losses[k]).any() else math.inf for k in have}
    winner = min(have, key=lambda k: mean[k])
    if robust_kind not in have:
        return winner, f"{winner}: lowest cross-fitted pinball ({robust_kind} not available)"
    if winner == robust_kind:
        return winner, f"{winner}: lowest cross-fitted pinball, and the robust choice"
    block = max(1, int(TEST_BLOCK.total_seconds() // step_seconds))
    apart, rel, upper = paired_block_test(losses[winner], losses[robust_kind], block)
    if apart:
        return winner, (f"{winner}: {-rel:.1%} less pinball than {robust_kind} on the calibration window, "
                        f"beyond the paired test (upper bound {upper:+.1%})")
    return robust_kind, (f"{robust_kind}: the calibration window cannot tell {winner} from it "
                         f"({-rel:+.1%} less pinball, upper bound {upper:+.1%})")


def _train_robust(
    grid: Series, kinds: Sequence[str], cfg: EvaluationSettings, horizon: timedelta, *,
    progress: Progress | None, options: Mapping[str, Mapping[str, Any]] | None,
) -> TrainedCandidates:
    """:func:`train_candidates` for the robust rule, on any history: every kind fitted once before
    the calibration window C and calibrated on it (log-scale or additive shifts, whichever scores
    better cross-fitted), scored cross-fitted on C; :func:`robust_choice` picks the served one.
    No walk-forward refits and no combination: one fit per candidate, one model served."""
    models: dict[str, FittedModel] = {}
    scores: dict[str, ModelEvaluation] = {}
    fits: dict[str, float] = {}
    losses: dict[str, np.ndarray] = {}
    rows_of: dict[str, dict[int, np.ndarray]] = {}
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    empty = {format_duration(h): dict.fromkeys(METRIC_NAMES) for h in cfg.horizons}
    for kind in kinds:
        try:
            model, fit_s = fit_calibrated(kind, grid, cfg, horizon, options=options)
            horizons, rows = crossfit_scores(model.base, grid, cal, cfg, model.tracking_rate)
            other = calibrated(model.base, grid, cfg, horizon, additive=True)
            got = crossfit_scores(model.base, grid, cal, cfg, other.tracking_rate, additive=True)
            if _mean_pinball(got[0]) < _mean_pinball(horizons):
                model, (horizons, rows) = other, got
        except (ScalerError, ImportError, ValueError, np.linalg.LinAlgError) as exc:
            scores[kind] = ModelEvaluation(kind, empty, None, error=f"{kind}: {exc}")
        else:
            models[kind], fits[kind] = model, fit_s
            scores[kind] = ModelEvaluation(kind, horizons, fit_s, origins=cal)
            rows_of[kind] = rows
            per_h = [pinball_losses(r[:, 0], r[:, 2], cfg.quantile) for r in rows.values()]
            losses[kind] = np.mean(np.column_stack(per_h), axis=1) if per_h else np.empty(0)
        if progress is not None:
            progress.update(1)
    members: tuple[tuple[str, ...], tuple[float, ...]] | None = None
    pins = {k: _mean_pinball(scores[k].horizons) for k in models}
    combo = _combination(combination_pool(pins), rows_of, models, cfg, horizon) if len(pins) > 1 else None
    if combo is not None:
        # One more candidate, scored on the same origins: the classic rule's combination of the
        # best three and the ensemble. Only variants that allow it may choose it.
        kinds_in, weights, combined, horizons, per_origin = combo
        models[COMBINATION], losses[COMBINATION] = combined, per_origin
        scores[COMBINATION] = ModelEvaluation(COMBINATION, horizons, None, origins=cal)
        fits[COMBINATION] = sum(fits[k] for k in kinds_in)
        members = (kinds_in, weights)
    trained = TrainedCandidates(models=models, scores=scores, fit_seconds=fits, selected=None, losses=losses,
                                combination=members)
    allowed = [k for k in losses if cfg.robust_combination or k != COMBINATION]
    selected, reason = robust_choice(trained, cfg.robust_kind, grid.step_seconds, kinds=allowed)
    return replace(trained, selected=selected, reason=reason)


def _walk_settings(cfg: EvaluationSettings) -> EvaluationSettings:
    """The short-history walk-forward choice's settings: daily refits, static shifts."""
    return replace(cfg, tracked_calibration=False, refit_every=SHORT_REFIT)


def planned_training_fits(series: Series, kinds: Sequence[str], cfg: EvaluationSettings,
                          step_seconds: int = DEFAULT_MODEL_STEP) -> int:
    """How many progress updates :func:`train_model` gives (the `train` bar's total): one per
    candidate on long history; on short history one per candidate and daily block of the
    walk-forward choice (the winner's final fit is not counted: it is one of them again)."""
    if short_history(cfg) and cfg.selection != "robust":
        return planned_fits(series, kinds, _walk_settings(cfg), step_seconds)
    return len(kinds)


def _short_calibration(grid: Series, kind: str, walk: EvaluationSettings, static: ModelEvaluation,
                       options: Mapping[str, Mapping[str, Any]] | None) -> tuple[float, bool]:
    """The short-history winner's calibration: coverage-tracking rate and additive
    or log-scale shifts. Each choice is made on the same daily walk-forward blocks (each
    calibrated on its own window, then scored, tracked, over the day it forecasts) the winner
    was chosen on: additive shifts if they lower the blocks' pinball with static calibration,
    then the positive rate of :data:`SHORT_TRACKING_RATES` with the least pinball there — and
    neither is chosen on fewer than :data:`SHORT_TRACKING_BLOCKS` blocks: static log-scale
    shifts then.

    Tracking stays on even where static shifts score better on the blocks: three days cannot
    show the regime changes the tracker is there for (a level jump, volatility doubling) and
    the week served can. Measured on the week after 7 days of the four 14-day traces (protocol,
    30-minute P95; the served kind and persistence on each, eight pairs): the slowest rate
    (0.05) against static shifts lowered pinball on six, the other two 1.3 % worse, and moved
    coverage towards 0.95 on six (nab_rds_cpu_e47b3b's ensemble 0.899 → 0.923), one unchanged,
    one 0.952 → 0.961. Static shifts serve only if every tracked one fails."""
    if sum(v is not None for v in static.block_pinball) < SHORT_TRACKING_BLOCKS:
        return 0.0, False

    def loss(rate: float, additive: bool) -> float | None:
        got = evaluate_model(kind, grid, replace(walk, tracked_calibration=rate > 0, tracking_rate=rate,
                                                 additive_calibration=additive),
                             forecaster_options=(options or {}).get(kind))
        if got.error or len(got.block_pinball) != len(static.block_pinball):
            return None
        # Compared on the blocks the static log-scale calibration was scored in.
        pairs = [(a, b) for a, b in zip(static.block_pinball, got.block_pinball, strict=True) if a is not None]
        if not pairs or any(b is None for _, b in pairs):
            return None
        return mean_block_pinball([b for _, b in pairs])

    other = loss(0.0, True)
    additive = other is not None and other < mean_block_pinball(static.block_pinball)
    best_rate, best_loss = 0.0, float("inf")
    for rate in SHORT_TRACKING_RATES:
        if rate <= 0:
            continue
        mine = loss(rate, additive)
        if mine is not None and mine < best_loss:
            best_rate, best_loss = rate, mine
    return best_rate, additive


def _combination(
    ranked: Sequence[str], rows: Mapping[str, Mapping[int, np.ndarray]], models: Mapping[str, FittedModel],
    cfg: EvaluationSettings, horizon: timedelta,
) -> tuple[tuple[str, ...], tuple[float, ...], CombinationModel, dict[str, dict[str, float | None]],
           np.ndarray] | None:
    """The weighted combination of the best ``ranked`` candidates on the cross-fitted forecasts,
    or None when one candidate alone is best there. The weights are
    :func:`combination.stable_combination`'s: the mean of the weights that win on each
    quarter of the cross-fitted window (``rows`` hold the later half first, then the earlier
    one, equally long) and, when :data:`DEFAULT_MEMBER` is in ``ranked``, of it alone, so a
    choice that only some quarters support is hedged. The combination's
    own shift of its P95 (:func:`combination.recalibration`) is chosen two-fold there too, and
    its scores are the two-fold ones (last: its pinball per origin, mean over the horizon steps)."""
    if len(ranked) < 2:
        return None
    steps = sorted(rows[ranked[0]])
    if not steps:
        return None
    actual = np.column_stack([rows[ranked[0]][h][:, 0] for h in steps])
    uppers = np.stack([np.column_stack([rows[k][h][:, 2] for h in steps]) for k in ranked])
    prior = np.array([k == DEFAULT_MEMBER for k in ranked], dtype=float)
    w = stable_combination(actual, uppers, cfg.quantile, prior=prior if prior.any() else None, mean=MEAN)
    if w.max() > 1.0 - 1e-9:
        return None
    keep = [i for i in range(len(ranked)) if w[i] > 0]
    members = tuple(ranked[i] for i in keep)
    weights = tuple(float(w[i]) for i in keep)
    each = np.stack([np.stack([rows[k][h] for h in steps], axis=2) for k in members])  # (m, n, 3, H)
    combined = combine_quantiles(each[:, :, 1:, :], np.asarray(weights), MEAN)  # (n, 2, H)
    offset = float(getattr(models[members[0]], "log_offset", 0.0)) or choose_log_offset(actual[:, -1])
    # Its own shift, chosen two-fold; ``upper`` holds the two-fold shifted P95s that chose it.
    shift, upper = recalibration(actual, combined[:, 1, :], cfg.quantile, offset, steps)
    step = models[members[0]].step_seconds
    online = OnlineWeights.for_horizon(horizon_steps(horizon, step) or 1, step, cfg.quantile)
    model = CombinationModel(members=tuple(models[k] for k in members), weights=weights, shift=shift,
                             online=online, mean=MEAN)
    out: dict[str, dict[str, float | None]] = {}
    labels = {format_duration(h): horizon_steps(h, step) for h in cfg.horizons}
    for label, h in labels.items():
        if h is None or h not in steps:
            out[label] = dict.fromkeys(METRIC_NAMES)
            continue
        j = steps.index(h)
        out[label] = all_metrics(actual[:, j], combined[:, 0, j], upper[:, j], cfg.quantile, None)
    per_origin = np.mean(pinball_losses(actual, upper, cfg.quantile), axis=1)
    return members, weights, model, out, per_origin


def _mean_pinball(horizons: Mapping[str, Mapping[str, float | None]]) -> float:
    values = [float(h["pinball"]) for h in horizons.values() if h.get("pinball") is not None]  # type: ignore[arg-type]
    return float(np.mean(values)) if values else float("inf")


def crossfit_scores(
    base: FittedModel, grid: Series, cal: int, cfg: EvaluationSettings, rate: float | None = None,
    *, additive: bool = False,
) -> tuple[dict[str, dict[str, float | None]], dict[int, np.ndarray]]:
    """Metrics per horizon of ``base`` calibrated on one half of the last ``cal`` steps of
    ``grid`` and forecasting the other half (both ways, pooled); and the pooled rows
    (actual, P50, quantile) per horizon step."""
    n = len(grid)
    labels = {format_duration(h): horizon_steps(h, grid.step_seconds) for h in cfg.horizons}
    defined = sorted({h for h in labels.values() if h is not None})
    h_max = max(defined) if defined else 1
    qs = tuple(sorted({*CALIBRATED_QUANTILES, cfg.quantile}))
    window = int(getattr(base, "window_steps", DEFAULT_WINDOW_STEPS))
    mid = n - cal // 2
    live = leading_idle_steps(grid.values)
    rows: dict[int, list[np.ndarray]] = {h: [] for h in defined}
    for a0, a1, b0, b1 in ((n - cal, mid, mid, n), (mid, n, n - cal, mid)):
        lo = max(0, a0 - 1 - window)
        model = calibrate(base, grid.slice(lo, a1), a0 - 1 - lo, quantiles=qs, live_from=live - lo,
                          horizon_steps=max(h_max, max_horizon_steps(grid.step_seconds)),
                          adaptive=cfg.adaptive_calibration, tracking_rate=rate, additive=additive,
                          tracking_rates=cfg.tracking_rates, half_life_seconds=cfg.half_life_seconds)
        lo = max(0, b0 - 1 - model.window_steps)
        part = grid.slice(lo, b1)
        origins = np.arange(b0 - 1, b1 - 1) - lo
        fc = walk_forward(model, part, origins, h_max, cfg.quantiles)
        k = cfg.quantiles.index(cfg.quantile)
        for h in defined:
            target = origins + h
            actual = np.where(target < len(part), part.values[np.minimum(target, len(part) - 1)], np.nan)
            rows[h].append(np.column_stack([actual, fc[:, 0, h - 1], fc[:, k, h - 1]]))
    scale = naive_scale(grid.values[: n - cal])
    pooled = {h: np.concatenate(r) for h, r in rows.items()}
    out: dict[str, dict[str, float | None]] = {}
    for label, steps in labels.items():
        if steps is None:
            out[label] = dict.fromkeys(METRIC_NAMES)
            continue
        r = pooled[steps]
        out[label] = all_metrics(r[:, 0], r[:, 1], r[:, 2], cfg.quantile, scale)
    return out, pooled


def fit_calibrated(
    kind: str, grid: Series, cfg: EvaluationSettings, horizon: timedelta = timedelta(minutes=30),
    *, additive: bool = False, options: Mapping[str, Mapping[str, Any]] | None = None,
    tracking_rate: float | None = None,
) -> tuple[CalibratedModel, float]:
    """What :func:`train_model` serves once ``kind`` is chosen: fitted on ``grid`` (already on the
    model grid) up to its last ``calibration_window``, calibrated on that window; and the fit's
    wall seconds."""
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    train = int(cfg.train_window.total_seconds() // grid.step_seconds)
    fit_end = len(grid) - cal
    t0 = time.perf_counter()
    base = registry.forecaster(kind, **dict((options or {}).get(kind) or {})).fit(grid.slice(max(0, fit_end - train), fit_end))
    fit_seconds = time.perf_counter() - t0
    return calibrated(base, grid, cfg, horizon, additive=additive, tracking_rate=tracking_rate), fit_seconds


def calibrated(base: FittedModel, grid: Series, cfg: EvaluationSettings,
               horizon: timedelta = timedelta(minutes=30), *, additive: bool = False,
               tracking_rate: float | None = None) -> CalibratedModel:
    """``base`` (fitted before the last calibration window of ``grid``) calibrated on that window
    (``tracking_rate``: the coverage tracker's rate, 0 for static shifts, None to choose)."""
    cal = int(cfg.calibration_days.total_seconds() // grid.step_seconds)
    fit_end = len(grid) - cal
    window = int(getattr(base, "window_steps", DEFAULT_WINDOW_STEPS))
    lo = max(0, fit_end - 1 - window)
    wanted = horizon_steps(horizon, grid.step_seconds) or 1
    return calibrate(
        base,
        grid.slice(lo, len(grid)),
        fit_end - 1 - lo,
        quantiles=tuple(sorted({*CALIBRATED_QUANTILES, cfg.quantile})),
        horizon_steps=max(wanted, max_horizon_steps(grid.step_seconds)),
        adaptive=cfg.adaptive_calibration,
        additive=additive,
        tracking_rate=tracking_rate,
        tracking_rates=cfg.tracking_rates,
        half_life_seconds=cfg.half_life_seconds,
        live_from=leading_idle_steps(grid.values) - lo,
    )


#: The latest data a training run scores its candidates on (the rest trains them), as the
#: backtest's and the retraining job's trainers do.
SCORED_WINDOW = timedelta(days=7)
#: ... but at least this much history comes before the scored window.
MIN_TRAINING_HISTORY = timedelta(days=4)


def settings_for_history(
    span: timedelta, quantile: float = 0.95, horizons: Sequence[timedelta] = DEFAULT_HORIZONS
) -> EvaluationSettings:
    """The settings a training run on ``span`` of history uses: candidates scored on the last
    :data:`SCORED_WINDOW` (earlier data trains and calibrates them)."""
    return EvaluationSettings(quantile=quantile, horizons=tuple(horizons),
                              min_history=max(MIN_TRAINING_HISTORY, span - SCORED_WINDOW))


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
