"""The rolling-origin protocol that puts the project's forecasts beside statsforecast's.

docs/forecast-protocol.md is the one-page description; in short, on the model
grid (5 minutes, coarser traces at their own step):

* the first ``min_history`` (14 days; 7 for traces shorter than 15 days) is the
  initial history; then every ``refit_every`` (a week) is one refit;
* at a refit at step s, everything may use the ``history_window`` (28 days)
  before s, nothing after it. The project does exactly what ``train`` does on
  that history (:func:`selection.train_candidates` with
  :func:`selection.settings_for_history`: every candidate fitted before the
  calibration window and calibrated on it, scored cross-fitted on it, the best
  served): that is the *served* model. Every candidate is scored too, so the
  best candidate in hindsight is known (selection regret). Each peer is fitted on the
  same fit window and calibrated on the same calibration window;
* from s to the next refit, every side forecasts from the same origins (every
  ``origin_every``, 30 minutes), each forecast reading observations up to its
  origin only, and is scored at the same horizons with the same metrics; missing
  actuals are not scored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np

from predictive_scaler.errors import InsufficientHistoryError, ScalerError
from predictive_scaler.forecasting import registry
from predictive_scaler.forecasting import statsforecast_peers as peer_module
from predictive_scaler.forecasting.calibration import CalibratedModel
from predictive_scaler.forecasting.combination import CombinationModel
from predictive_scaler.forecasting.defaults import DEFAULT_VARIANT, Variant, variant
from predictive_scaler.forecasting.evaluation import (
    DEFAULT_HORIZONS,
    DEFAULT_MODEL_STEP,
    Progress,
    horizon_steps,
    initial_history_for,
    model_series,
)
from predictive_scaler.forecasting.metrics import (
    METRIC_NAMES,
    all_metrics,
    grouped_ratio_interval,
    naive_scale,
    pinball_losses,
)
from predictive_scaler.forecasting.selection import (
    COMBINATION,
    TrainedCandidates,
    robust_choice,
    settings_for_history,
    train_candidates,
)
from predictive_scaler.forecasting.walkforward import DEFAULT_WINDOW_STEPS, walk_forward
from predictive_scaler.series import Series, format_duration

#: Single forecasts timed per candidate and refit (forecast with state update).
TIMED_FORECASTS = 20
#: Level of the intervals on the headline figures (ratio, regret, coverage; days resampled).
INTERVAL_LEVEL = 0.9


@dataclass(frozen=True)
class ProtocolSettings:
    quantile: float = 0.95
    horizons: tuple[timedelta, ...] = DEFAULT_HORIZONS
    #: History before the first scored origin; None: 14 days, or 7 for traces under 15 days.
    min_history: timedelta | None = None
    refit_every: timedelta = timedelta(days=7)
    #: The most history a refit sees.
    history_window: timedelta = timedelta(days=28)
    origin_every: timedelta = timedelta(minutes=30)
    peers: tuple[str, ...] = peer_module.PEER_NAMES
    fit_limit_seconds: float = peer_module.FIT_LIMIT_SECONDS
    #: Further forecasting variants (:data:`defaults.VARIANTS` names) scored beside the served
    #: default, each as `train` would serve it under that variant (the held-out bench).
    variants: tuple[str, ...] = ()
    #: Keep every side's per-origin 30-minute record (origin, pinball, covered, actual) in the
    #: report, so figures over any part of the trace can be recomputed (the held-out bench).
    keep_origins: bool = False

    def initial_history(self, span: timedelta) -> timedelta:
        if self.min_history is not None:
            return self.min_history
        return initial_history_for(span)

    def describe(self, span: timedelta) -> dict[str, Any]:
        return {
            "min_history": format_duration(self.initial_history(span)),
            "refit_every": format_duration(self.refit_every),
            "history_window": format_duration(self.history_window),
            "origin_every": format_duration(self.origin_every),
            "horizons": [format_duration(h) for h in self.horizons],
        }


@dataclass(frozen=True)
class Scored:
    """One side's scores in the protocol (a project candidate, the served model, or a peer)."""

    name: str
    horizons: Mapping[str, Mapping[str, float | None]]
    fit_seconds: float | None = None
    #: Median seconds of one forecast with state update.
    forecast_seconds: float | None = None
    origins: int = 0
    error: str | None = None
    skipped: str | None = None
    #: For the served model: the kind chosen at each refit.
    choices: tuple[str, ...] = ()
    #: ... and how its P95 was calibrated at each refit (:func:`describe_calibration`).
    calibrations: tuple[str, ...] = ()

    def metric(self, key: str, horizon: str = "30m") -> float | None:
        if self.error or self.skipped:
            return None
        return self.horizons.get(horizon, {}).get(key)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "horizons": {label: dict(m) for label, m in self.horizons.items()},
            "fit_seconds": self.fit_seconds,
            "forecast_ms": None if self.forecast_seconds is None else 1000 * self.forecast_seconds,
        }
        if self.choices:
            doc["choices"] = list(self.choices)
            doc["origins"] = self.origins
        if self.calibrations:
            doc["calibrations"] = list(self.calibrations)
        if self.error:
            doc["error"] = self.error
        if self.skipped:
            doc["skipped"] = self.skipped
        return doc


@dataclass(frozen=True)
class ProtocolReport:
    series: str
    quantile: float
    step_seconds: int
    settings: Mapping[str, Any]
    blocks: int
    models: Mapping[str, Scored]
    served: Scored
    peers: Mapping[str, Scored]
    notes: tuple[str, ...] = field(default=())
    #: 90 % intervals, whole days of origins resampled, of "ratio_to_best_peer", "regret" and the
    #: served "coverage" at 30 minutes (None where undefined), and "days", how many were resampled.
    intervals: Mapping[str, Any] = field(default_factory=dict)
    #: The further variants' served scores (:attr:`ProtocolSettings.variants`).
    variants: Mapping[str, Scored] = field(default_factory=dict)
    #: With :attr:`ProtocolSettings.keep_origins`: per side ("served", "variant:NAME", a candidate
    #: kind, "peer:NAME"), the 30-minute records as four lists: origin step, pinball, covered, actual.
    origins: Mapping[str, list[list[float]]] = field(default_factory=dict)

    def best_candidate(self, key: str = "normalised_pinball") -> str | None:
        scored = {k: m.metric(key) for k, m in self.models.items()}
        have = {k: v for k, v in scored.items() if v is not None}
        return min(have, key=lambda k: have[k]) if have else None

    def best_peer(self, key: str = "normalised_pinball") -> str | None:
        have = {k: v for k, p in self.peers.items() if (v := p.metric(key)) is not None}
        return min(have, key=lambda k: have[k]) if have else None

    def regret(self) -> float | None:
        best = self.best_candidate()
        s = self.served.metric("normalised_pinball")
        b = self.models[best].metric("normalised_pinball") if best else None
        return s / b if s is not None and b else None

    def ratio(self) -> float | None:
        best = self.best_peer()
        s = self.served.metric("normalised_pinball")
        b = self.peers[best].metric("normalised_pinball") if best else None
        return s / b if s is not None and b else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "quantile": self.quantile,
            "series": self.series,
            "step_seconds": self.step_seconds,
            "protocol": dict(self.settings),
            "blocks": self.blocks,
            "selected": self.served.choices[-1] if self.served.choices else None,
            "served": self.served.to_dict(),
            "models": {k: m.to_dict() for k, m in self.models.items()},
            "peers": {k: p.to_dict() for k, p in self.peers.items()},
            "best_candidate": self.best_candidate(),
            "best_peer": self.best_peer(),
            "regret": self.regret(),
            "ratio_to_best_peer": self.ratio(),
            "intervals": {"level": INTERVAL_LEVEL, **{k: list(v) if isinstance(v, tuple) else v
                                                      for k, v in self.intervals.items()}},
            "notes": list(self.notes),
            **({"variants": {k: v.to_dict() for k, v in self.variants.items()}} if self.variants else {}),
            **({"origins": dict(self.origins)} if self.origins else {}),
        }


@dataclass
class _Collector:
    """Rows of (actual, P50, P95) per horizon step, over refits."""

    steps: Sequence[int]
    rows: dict[int, list[np.ndarray]] = field(default_factory=dict)
    #: The grid step of each added origin, so two sides pair up origin by origin.
    ids: list[np.ndarray] = field(default_factory=list)
    fits: list[float] = field(default_factory=list)
    forecasts: list[float] = field(default_factory=list)
    origins: int = 0
    error: str | None = None

    def add(self, origins: np.ndarray, actual: np.ndarray, point: np.ndarray, upper: np.ndarray) -> None:
        self.origins += actual.shape[0]
        self.ids.append(np.asarray(origins, dtype=np.int64))
        for h in self.steps:
            self.rows.setdefault(h, []).append(
                np.column_stack([actual[:, h - 1], point[:, h - 1], upper[:, h - 1]]))

    def by_origin(self, h: int, q: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Origins scored at step ``h``, their pinball at ``q`` and whether the actual was covered."""
        if not self.rows.get(h):
            return np.empty(0, np.int64), np.empty(0), np.empty(0, bool)
        ids = np.concatenate(self.ids)
        r = np.concatenate(self.rows[h])
        keep = np.isfinite(r[:, 0]) & np.isfinite(r[:, 2])
        return ids[keep], pinball_losses(r[keep, 0], r[keep, 2], q), r[keep, 0] <= r[keep, 2]

    def record(self, h: int, q: float) -> list[list[float]]:
        """Per scored origin at step ``h``: origin step, pinball at ``q``, covered (0/1), actual."""
        if not self.rows.get(h):
            return [[], [], [], []]
        ids = np.concatenate(self.ids)
        r = np.concatenate(self.rows[h])
        keep = np.isfinite(r[:, 0]) & np.isfinite(r[:, 2])
        loss = pinball_losses(r[keep, 0], r[keep, 2], q)
        return [ids[keep].astype(float).tolist(), [float(f"{v:.6g}") for v in loss],
                (r[keep, 0] <= r[keep, 2]).astype(float).tolist(), [float(f"{v:.6g}") for v in r[keep, 0]]]

    def scored(self, name: str, labels: Mapping[str, int | None], q: float, scale: float | None,
               **extra: Any) -> Scored:
        horizons: dict[str, dict[str, float | None]] = {}
        for label, h in labels.items():
            if h is None or not self.rows.get(h):
                horizons[label] = dict.fromkeys(METRIC_NAMES)
                continue
            r = np.concatenate(self.rows[h])
            horizons[label] = all_metrics(r[:, 0], r[:, 1], r[:, 2], q, scale)
        return Scored(
            name=name, horizons=horizons,
            fit_seconds=float(np.mean(self.fits)) if self.fits else None,
            forecast_seconds=float(np.median(self.forecasts)) if self.forecasts else None,
            origins=self.origins, error=self.error if not self.origins else None, **extra)


def describe_calibration(model: Any) -> str:
    """How a served model's P95 is calibrated, in a few words ("additive shifts, tracked at 0.15")."""
    if isinstance(model, CombinationModel):
        own = "no shift of its own" if model.shift is None else f"its own {model.shift.scale} shift"
        return f"members calibrated, {own}" + (", online weights" if model.online is not None else "")
    if isinstance(model, CalibratedModel):
        how = ("square-root shifts" if model.root else "additive shifts") if model.additive else "log-scale shifts"
        return how + (f", tracked at {model.tracking_rate:g}" if model.tracking_window > 0 else ", static")
    return "uncalibrated"


def _day_sums(ids: np.ndarray, values: np.ndarray, steps_per_day: int) -> np.ndarray:
    """``values`` summed per day of their origins (days in ascending order, empty days left out)."""
    days = np.unique(ids // steps_per_day, return_inverse=True)[1]
    return np.bincount(days, weights=values.astype(float))


def headline_intervals(served: _Collector, candidate: _Collector | None, peer: _Collector | None,
                       h: int, q: float, steps_per_day: int) -> dict[str, Any]:
    """Day-resampled intervals of the served ratio to ``peer``, its regret to ``candidate`` (both
    paired on the origins the two sides scored) and its coverage (:data:`INTERVAL_LEVEL`).

    One week of origins is few: these say whether a ratio of 1.01 is a loss or a tie.
    """
    ids, loss, hit = served.by_origin(h, q)
    sums: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
    for key, other in (("ratio_to_best_peer", peer), ("regret", candidate)):
        if other is None:
            sums[key] = None
            continue
        o_ids, o_loss, _ = other.by_origin(h, q)
        _, i, j = np.intersect1d(ids, o_ids, assume_unique=True, return_indices=True)
        sums[key] = (_day_sums(ids[i], loss[i], steps_per_day), _day_sums(ids[i], o_loss[j], steps_per_day))
    sums["coverage"] = (_day_sums(ids, hit, steps_per_day), _day_sums(ids, np.ones(ids.size), steps_per_day))
    out: dict[str, Any] = {"days": int(np.unique(ids // steps_per_day).size)}
    for key, pair in sums.items():
        out[key] = None if pair is None else grouped_ratio_interval(*pair, level=INTERVAL_LEVEL)
    # The per-day sums themselves, so figures over several traces (the geometric mean of the
    # ratio) can be resampled the same way.
    out["day_sums"] = {k: None if pair is None else [pair[0].tolist(), pair[1].tolist()]
                       for k, pair in sums.items()}
    return out


def _actuals(values: np.ndarray, origins: np.ndarray, h: int) -> np.ndarray:
    target = origins[:, None] + np.arange(1, h + 1)[None, :]
    inside = target < values.size
    return np.where(inside, values[np.minimum(target, values.size - 1)], np.nan)


def _time_forecasts(model: Any, grid: Series, origins: np.ndarray, h: int, qs: Sequence[float]) -> list[float]:
    """Wall seconds of single forecasts (what the controller calls) at a few origins."""
    window = int(getattr(model, "window_steps", DEFAULT_WINDOW_STEPS))
    picks = origins[np.linspace(0, origins.size - 1, min(TIMED_FORECASTS, origins.size)).astype(int)]
    out = []
    for t in picks:
        recent = grid.slice(max(0, int(t) + 1 - window), int(t) + 1)
        t0 = time.perf_counter()
        try:
            model.forecast(recent, h, qs)
        except ScalerError:
            continue
        out.append(time.perf_counter() - t0)
    return out


@dataclass
class _Variants:
    """The further variants of one protocol run: per refit, each variant's served model as
    `train` would build it under that variant. Robust variants that differ only in their robust
    candidate share one training (the choice is made on its cross-fitted losses), and a variant
    equal to the served default reuses the served training."""

    names: Sequence[str]
    steps: Sequence[int]
    collectors: dict[str, _Collector] = field(default_factory=dict)
    choices: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.names:
            variant(name)  # unknown names fail before any work
            self.collectors[name] = _Collector(self.steps)
            self.choices[name] = []

    @staticmethod
    def key(v: Variant) -> tuple[Any, ...]:
        return (v.selection, v.candidates, v.tracking_rates, v.half_life_hours,
                None if v.selection == "robust" else v.robust_kind)

    def run_block(self, history: Series, inner: Any, horizon: timedelta, served_key: tuple[Any, ...],
                  served: TrainedCandidates, forecast: Any, origins: np.ndarray, actual: np.ndarray,
                  k_q: int) -> None:
        trainings: dict[tuple[Any, ...], TrainedCandidates] = {served_key: served}
        for name in self.names:
            v = variant(name)
            key = self.key(v)
            if key not in trainings:
                trainings[key] = train_candidates(history, v.candidates, inner.with_variant(v), horizon,
                                                  every=v.selection == "robust")
            trained = trainings[key]
            if v.selection == "robust":
                allowed = [k for k in (trained.losses or {}) if v.robust_combination or k != COMBINATION]
                kind, _ = robust_choice(trained, v.robust_kind, history.step_seconds, kinds=allowed)
            else:
                kind = trained.selected
            if kind is None or kind not in trained.models:
                self.choices[name].append("-")
                continue
            try:
                fc = forecast(trained.models[kind])
            except (ScalerError, ValueError, np.linalg.LinAlgError):
                self.choices[name].append("-")
                continue
            self.choices[name].append(kind if kind != COMBINATION or trained.combination is None else
                                      "combination " +
                                      "+".join(f"{k}×{w:.1f}" for k, w in zip(*trained.combination, strict=True)))
            self.collectors[name].add(origins, actual, fc[:, 0, :], fc[:, k_q, :])


def run_protocol(  # noqa: C901, PLR0915
    series: Series,
    kinds: Sequence[str] = registry.DEFAULT_CANDIDATES,
    settings: ProtocolSettings | None = None,
    *,
    step_seconds: int = DEFAULT_MODEL_STEP,
    progress: Progress | None = None,
) -> ProtocolReport:
    """Run the protocol on ``series``: every kind, the served (train-selected) model, every peer."""
    cfg = settings or ProtocolSettings()
    if cfg.peers:
        peer_module.require_statsforecast()
    grid = model_series(series, step_seconds)
    step = grid.step_seconds
    n = len(grid)
    first = int(cfg.initial_history(series.span).total_seconds() // step)
    if n <= first:
        raise InsufficientHistoryError(
            f"{series.source or series.name}: {format_duration(series.span)} of data is not more than the "
            f"{format_duration(cfg.initial_history(series.span))} initial history; supply a longer trace")
    every = max(1, int(cfg.refit_every.total_seconds() // step))
    window = int(cfg.history_window.total_seconds() // step)
    stride = max(1, int(cfg.origin_every.total_seconds() // step))
    labels = {format_duration(h): horizon_steps(h, step) for h in cfg.horizons}
    defined = sorted({h for h in labels.values() if h is not None})
    h_max = max(defined) if defined else 1
    qs = tuple(sorted({0.5, cfg.quantile}))
    k_q = qs.index(cfg.quantile)
    steps_per_day = max(1, 86400 // step)
    scale = naive_scale(grid.values[:first])
    horizon = max(cfg.horizons)

    cands = {k: _Collector(defined) for k in kinds}
    served = _Collector(defined)
    choices: list[str] = []
    calibrations: list[str] = []
    peer_rows = {f"{p}{v}": _Collector(defined) for p in cfg.peers for v in ("", "+conformal")}
    skipped: dict[str, str] = {}
    capped: dict[str, str] = {}
    extra = _Variants(cfg.variants, defined)
    served_key = _Variants.key(Variant("served", tuple(kinds), selection=DEFAULT_VARIANT.selection,
                                       robust_kind=DEFAULT_VARIANT.robust_kind,
                                       robust_combination=DEFAULT_VARIANT.robust_combination,
                                       tracking_rates=DEFAULT_VARIANT.tracking_rates,
                                       half_life_hours=DEFAULT_VARIANT.half_life_hours))
    blocks = 0
    for s in range(first, n, every):
        end = min(s + every, n)
        hist_start = max(0, s - window)
        history = grid.slice(hist_start, s)
        inner = settings_for_history(history.span, cfg.quantile, cfg.horizons)
        cal = int(inner.calibration_days.total_seconds() // step)
        origins = np.arange(s - 1, end - 1, stride)
        actual = _actuals(grid.values[:end], origins, h_max)
        blocks += 1
        forecasts: dict[str, np.ndarray] = {}
        trained = train_candidates(history, kinds, inner, horizon)
        for kind in kinds:
            c = cands[kind]
            if kind not in trained.models:
                c.error = trained.scores[kind].error
                continue
            model = trained.models[kind]
            try:
                lo = max(0, s - 1 - int(getattr(model, "window_steps", DEFAULT_WINDOW_STEPS)))
                fc = walk_forward(model, grid.slice(lo, end), origins - lo, h_max, qs)
            except (ScalerError, ValueError, np.linalg.LinAlgError) as exc:
                c.error = f"{kind}: {exc}"
                continue
            c.fits.append(trained.fit_seconds[kind])
            c.forecasts.extend(_time_forecasts(model, grid, origins, h_max, qs))
            c.add(origins, actual, fc[:, 0, :], fc[:, k_q, :])
            forecasts[kind] = fc
        choice = trained.selected
        if (choice == COMBINATION and trained.combination is not None
                and all(k in forecasts for k in trained.combination[0])):
            members, weights = trained.combination
            combined = trained.models[COMBINATION]
            # Served as the model itself serves: its shift, and its online weights read the
            # members' pinball at earlier origins, so it is not a mix of the columns above.
            lo = max(0, s - 1 - int(getattr(combined, "window_steps", DEFAULT_WINDOW_STEPS)))
            fc = walk_forward(combined, grid.slice(lo, end), origins - lo, h_max, qs)
            choices.append("+".join(f"{k}×{w:.1f}" for k, w in zip(members, weights, strict=True)))
            calibrations.append(describe_calibration(combined))
            served.add(origins, actual, fc[:, 0, :], fc[:, k_q, :])
            served.fits.append(trained.fit_seconds[COMBINATION])
            served.forecasts.extend(_time_forecasts(trained.models[COMBINATION], grid, origins, h_max, qs))
        elif choice is not None and choice in forecasts:
            choices.append(choice)
            calibrations.append(describe_calibration(trained.models[choice]))
            fc = forecasts[choice]
            served.add(origins, actual, fc[:, 0, :], fc[:, k_q, :])
            served.fits.extend(cands[choice].fits[-1:])
            served.forecasts.extend(cands[choice].forecasts[-TIMED_FORECASTS:])
        else:
            choices.append("-")
            calibrations.append("-")
        if extra.names:
            memo: dict[int, np.ndarray] = {id(m): forecasts[k] for k, m in trained.models.items() if k in forecasts}

            def forecast(model: Any, s: int = s, end: int = end, origins: np.ndarray = origins,
                         memo: dict[int, np.ndarray] = memo) -> np.ndarray:
                if id(model) not in memo:
                    lo = max(0, s - 1 - int(getattr(model, "window_steps", DEFAULT_WINDOW_STEPS)))
                    memo[id(model)] = walk_forward(model, grid.slice(lo, end), origins - lo, h_max, qs)
                return memo[id(model)]

            extra.run_block(history, inner, horizon, served_key, trained, forecast, origins, actual, k_q)
        cal_origins = np.arange(s - cal - 1, s - h_max, stride)
        for name in cfg.peers:
            if name in skipped:
                continue
            got = peer_module.run_peer(name, grid.values[:end], (hist_start, s - cal), cal_origins, origins,
                                       h_max, steps_per_day, fit_limit=cfg.fit_limit_seconds)
            if isinstance(got, peer_module.PeerBlock) and got.capped:
                capped[name] = got.capped
            if isinstance(got, peer_module.PeerSkipped):
                skipped[name] = got.reason
                for variant in ("", "+conformal"):
                    peer_rows[f"{name}{variant}"].fits.append(got.seconds)
                continue
            for variant, upper in (("", got.model_upper), ("+conformal", got.conformal_upper)):
                c = peer_rows[f"{name}{variant}"]
                c.fits.append(got.fit_seconds)
                c.forecasts.append(got.forecast_seconds)
                c.add(origins, actual, got.point, upper)
        if progress is not None:
            progress.update(1)
    models = {k: c.scored(k, labels, cfg.quantile, scale) for k, c in cands.items()}
    peer_scores: dict[str, Scored] = {}
    for key, c in peer_rows.items():
        base = key.removesuffix("+conformal")
        if base in skipped:
            fit = max(c.fits) if c.fits else None
            peer_scores[key] = Scored(key, {label: dict.fromkeys(METRIC_NAMES) for label in labels},
                                      fit_seconds=fit, skipped=skipped[base])
        else:
            peer_scores[key] = c.scored(key, labels, cfg.quantile, scale)
    notes = tuple(f"{label} is not a multiple of the {step}s step: undefined"
                  for label, h in labels.items() if h is None) + tuple(
        f"{name} capped: {why}" for name, why in capped.items())
    variant_scores = {name: extra.collectors[name].scored(f"variant:{name}", labels, cfg.quantile, scale,
                                                          choices=tuple(extra.choices[name]))
                      for name in extra.names}
    report = ProtocolReport(
        series=series.name, quantile=cfg.quantile, step_seconds=step,
        settings=cfg.describe(series.span), blocks=blocks, models=models,
        served=served.scored("served", labels, cfg.quantile, scale, choices=tuple(choices),
                             calibrations=tuple(calibrations)),
        peers=peer_scores, notes=notes, variants=variant_scores,
    )
    headline = labels.get("30m")
    if headline is None:
        return report
    if cfg.keep_origins:
        kept = {"served": served.record(headline, cfg.quantile)}
        kept.update({f"variant:{n}": extra.collectors[n].record(headline, cfg.quantile) for n in extra.names})
        kept.update({k: c.record(headline, cfg.quantile) for k, c in cands.items()})
        kept.update({f"peer:{k}": c.record(headline, cfg.quantile) for k, c in peer_rows.items()
                     if k.removesuffix("+conformal") not in skipped})
        report = replace(report, origins=kept)
    best, peer = report.best_candidate(), report.best_peer()
    return replace(report, intervals=headline_intervals(
        served, cands[best] if best else None, peer_rows[peer] if peer else None,
        headline, cfg.quantile, steps_per_day))


def planned_blocks(series: Series, settings: ProtocolSettings | None = None,
                   step_seconds: int = DEFAULT_MODEL_STEP) -> int:
    cfg = settings or ProtocolSettings()
    grid = model_series(series, step_seconds)
    first = int(cfg.initial_history(series.span).total_seconds() // grid.step_seconds)
    every = max(1, int(cfg.refit_every.total_seconds() // grid.step_seconds))
    return max(0, math.ceil((len(grid) - first) / every))
