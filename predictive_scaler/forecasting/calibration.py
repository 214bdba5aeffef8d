"""Conformal calibration of forecast quantiles per horizon step.

A model's own intervals are rarely honest (measured: 0.97–0.99
for a nominal P95). :func:`calibrate` learns, for each requested quantile and
each horizon step, the shift on the log scale that makes the quantile cover
its probability on out-of-sample residuals — data after the base model's fit
window. The shift is the conformal quantile of the scores
``log(actual + c) - log(forecast + c)``, so a P95 moves up where it was too
low and down where it was too wide. Coverage is always measured on later data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.core.values import Forecast
from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.base import FittedModel, check_quantiles
from predictive_scaler.forecasting.logscale import choose_log_offset, from_log, observed_log, to_log
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    SharedResults,
    check_origins,
    history_key,
    max_horizon_steps,
    on_model_grid,
    require_finite,
    walk_forward,
)
from predictive_scaler.series import Series

#: Quantiles calibrated by default; others are interpolated between them.
CALIBRATED_QUANTILES: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.975, 0.99)
#: Fewer scores than this per horizon step cannot pin down a P95.
MIN_SCORES = 50
#: Steps of recent one-step log changes that measure the current volatility.
VOLATILITY_WINDOW = 12
#: The volatility used is at least this share of its typical (median) calibration value,
#: so a quiet hour (or a run of zeros) cannot shrink the interval to nothing.
VOLATILITY_FLOOR_SHARE = 0.5
#: With no observation in the volatility window (an outage), the scale is this many floors.
NO_DATA_SCALE = 3.0
#: Coverage tracking (an online quantile tracker, the P part of conformal PID control): at
#: each origin the shift of a q-quantile is re-derived from the static conformal one by
#: replaying the model's own forecasts of the last TRACKING_SECONDS: each one whose actual
#: was above it raises the shift by step·q, each one below lowers it by step·(1 - q). It holds
#: coverage near q when the traffic's regime moves after calibration (the 14-day traces fell
#: to 0.81-0.89 without it). The replay starts afresh at every origin, so a forecast still
#: depends only on the artifact and the recent window.
TRACKING_SECONDS = 86400
#: Step of the tracker as a share of the calibration scores' interquartile range: chosen per
#: model and series among these (two-fold on the calibration window; 0 = static shifts). 0.15
#: won on the 14-day traces, 0 on nab_twitter_aapl, whose bursts a tracker chases.
TRACKING_RATES: tuple[float, ...] = (0.0, 0.05, 0.15, 0.3)
#: ... when the calibration window holds this much (two folds of 3+ days); on less the choice
#: is noise and the rate is DEFAULT_TRACKING_RATE.
TRACKING_CHOICE_SECONDS = 6 * 86400
DEFAULT_TRACKING_RATE = 0.15
#: The choice scores the tracked forecasts of one origin in this many seconds of the other fold
#: (every origin at steps this long or longer). Each origin replays a day of forecasts, so the
#: choice is most of a calibration's cost, and origins minutes apart replay nearly the same day:
#: at 5-minute steps every second origin is scored, at one minute every tenth. A cost setting,
#: fixed a priori, not tuned on any trace's score.
RATE_CHOICE_SPACING_SECONDS = 600
#: The tracker's step never falls below this share of what a random walk at the recent volatility
#: would give as the scores' interquartile range (1.35 × RMS one-step change × √h, over the last
#: VOLATILITY_WINDOW steps before the origin), times the rate. The step is otherwise in units of the
#: calibration scores' IQR, which is zero when the calibration window was flat (a stream that was
#: idle for a week and then started): the tracker could not move at all and the P95 stayed at the
#: point forecast. A floor, not a second scale: it binds only where the traffic now moves several
#: times more than the calibration window did. Fixed a priori, not tuned.
TRACKING_FLOOR_SHARE = 0.25
_IQR_PER_SD = 1.35
#: The shape of the alternative to log-scale shifts (``additive`` calibration, chosen per model
#: and series): "root" — shifts on the square-root scale, added to the base median; "demand" —
#: shifts in demand units, added to the base median (statsforecast's conformal intervals);
#: "quantile" — demand units added to the base model's own quantile, as artifacts written before
#: this setting still are. The base models' spreads are on the log scale, so "quantile" kept a band
#: proportional to the level, and count-like traffic's errors are not: with each shift at its best
#: value in hindsight, a P95 of median + shift had 0.71-1.06 of log-scale shifts' pinball loss on
#: the 30-minute taxi slices and the NASA slices (a week of history each), where "quantile" had
#: 0.89-1.34. Chosen on the tuning set (docs/forecast-protocol.md: the bundled traces' tuning parts
#: and the short-history slices, 16 runs): geometric mean of served ÷ best peer 1.014 with
#: "quantile", 0.955 with "demand", 0.965 with "root" — but "demand" under-covers where the level
#: rises after calibration (servegen_m_small 0.875, its held-out interval wholly above 1), and the
#: square root, whose band grows with the square root of the level, holds every held-out line.
ADDITIVE_SHAPE = "root"

#: The tracker's replay gathers this many scores at a time (memory, not results).
TRACK_BLOCK_VALUES = 1 << 20
#: ... when one replayed step holds at most this many (a served forecast with online weights:
#: 49 origins); above it, step by step.
TRACK_SMALL_VALUES = 4096


def _fwd(values: np.ndarray, log_offset: float, additive: bool, root: bool = False) -> np.ndarray:
    """The scale shifts live on: log(x + c); for additive calibration demand units, or their
    square root (``root``)."""
    if not additive:
        return to_log(values, log_offset)
    x = np.asarray(values, dtype=float)
    return np.sqrt(np.maximum(x, 0.0)) if root else x


def _inv(values: np.ndarray, log_offset: float, additive: bool, root: bool = False) -> np.ndarray:
    if not additive:
        return from_log(values, log_offset)
    return np.maximum(values, 0.0) ** 2 if root else np.maximum(values, 0.0)


def _with_median(quantiles: Sequence[float]) -> tuple[float, ...]:
    return tuple(sorted({0.5, *quantiles}))


def recent_volatility(values: np.ndarray, origins: np.ndarray, log_offset: float, window: int,
                      additive: bool = False, root: bool = False) -> np.ndarray:
    """RMS of the one-step log changes (``additive``: changes in demand units, or in their square
    root with ``root``) in the ``window`` steps up to each origin (NaN if none)."""
    logy = (np.where(np.isfinite(values), _fwd(values, log_offset, True, root), np.nan) if additive
            else observed_log(values, log_offset))
    d2 = np.diff(logy, prepend=np.nan) ** 2
    ok = np.isfinite(d2)
    csum = np.concatenate([[0.0], np.cumsum(np.where(ok, d2, 0.0))])
    ccount = np.concatenate([[0], np.cumsum(ok)])
    hi = origins + 1
    lo = np.maximum(hi - window, 0)
    count = ccount[hi] - ccount[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.sqrt((csum[hi] - csum[lo]) / np.maximum(count, 1)), np.nan)


@dataclass(frozen=True)
class CalibratedModel(FittedModel):
    """``base`` with per-quantile, per-horizon-step shifts on the log scale."""

    base: FittedModel
    quantiles: tuple[float, ...]
    offsets: tuple[tuple[float, ...], ...]  # [quantile][horizon step]
    log_offset: float
    #: Locally adaptive calibration: offsets are in units of the recent volatility
    #: (``volatility_floor`` > 0), or plain log shifts (0).
    volatility_floor: float = 0.0
    volatility_window: int = VOLATILITY_WINDOW
    #: Coverage tracking: steps replayed before each origin (0: off) and, per calibrated
    #: quantile and horizon step, the tracker's step on the log scale.
    tracking_window: int = 0
    tracking_steps: tuple[tuple[float, ...], ...] = ()
    #: The rate the steps were made with (a record of the choice; forecasts use the steps).
    tracking_rate: float = 0.0
    #: The alternative to log-scale shifts (its shape: :data:`ADDITIVE_SHAPE`; demand units in
    #: artifacts written before it); chosen per model and series by :func:`selection.train_candidates`.
    additive: bool = False
    #: Every quantile is the base median plus its shift (as statsforecast's conformal intervals),
    #: not the base model's own quantile plus a shift; additive only (:data:`ADDITIVE_SHAPE`).
    #: False in artifacts written before it.
    centred: bool = False
    #: Additive shifts on the square-root scale, not in demand units (:data:`ADDITIVE_SHAPE`).
    root: bool = False
    #: The tracker's step floor as a share of the recent volatility's random-walk IQR
    #: (:data:`TRACKING_FLOOR_SHARE`; 0: none, as in artifacts written before it).
    tracking_floor: float = 0.0
    kind: ClassVar[str] = "calibrated"

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.quantiles) or not all(self.offsets):
            raise ModelError("calibration offsets do not match their quantiles; recalibrate the model")
        if (self.centred or self.root) and not (self.additive and self.centred and self.volatility_floor == 0):
            raise ModelError("centred and square-root shifts are an additive calibration's shapes (root ones "
                             "centred too); recalibrate the model")
        if self.tracking_window and (len(self.tracking_steps) != len(self.quantiles)
                                     or any(len(r) != len(self.offsets[0]) for r in self.tracking_steps)):
            raise ModelError("calibration tracking steps do not match their quantiles; recalibrate the model")

    @property
    def step_seconds(self) -> int:  # type: ignore[override]
        return self.base.step_seconds

    @property
    def window_steps(self) -> int:
        base = int(getattr(self.base, "window_steps", DEFAULT_WINDOW_STEPS))
        return base + (self.tracking_window + len(self.offsets[0]) if self.tracking_window else 0)

    @property
    def tracking(self) -> bool:
        return self.tracking_window > 0

    @property
    def base_kind(self) -> str:
        return self.base.kind

    def _shift(self, quantiles: Sequence[float], horizon_steps: int, rows: Any = None) -> np.ndarray:
        """(k, h) log shifts: interpolated between calibrated quantiles, last step repeated."""
        table = np.asarray(self.offsets if rows is None else rows)  # (K, H)
        cols = np.minimum(np.arange(horizon_steps), table.shape[1] - 1)
        table = table[:, cols]
        grid = np.asarray(self.quantiles)
        return np.array([[np.interp(q, grid, table[:, h]) for h in range(horizon_steps)] for q in quantiles])

    def _tracked(self, scores: np.ndarray, first: np.ndarray, quantiles: Sequence[float],
                 volatility: np.ndarray | None = None) -> np.ndarray:
        """(n, k, h) shifts at each origin after replaying the tracker over its window.

        ``scores[j, k, h]`` is log(actual) - log(base quantile k) for the forecast issued at
        step j for step j + h + 1 (NaN where unknown); ``first[i]`` is the index in ``scores``
        of origin i's own step t. The tracker starts at the static shift at step t - W and
        updates with each forecast whose target is observed by t, in issue order.
        """
        h_max = scores.shape[2]
        static = self._shift(quantiles, h_max)  # (k, h)
        eta = self._shift(quantiles, h_max, self.tracking_steps)
        keep = np.abs(np.asarray(quantiles) - 0.5) > 1e-9  # the median is not tracked
        eta = np.where(keep[:, None], eta, 0.0)
        if self.tracking_floor > 0 and volatility is not None:
            # Per origin: at least the floor at the recent volatility (see TRACKING_FLOOR_SHARE).
            walk = _IQR_PER_SD * np.sqrt(np.arange(1, h_max + 1))[None, None, :] * np.nan_to_num(volatility)[:, None, None]
            floor = self.tracking_floor * self.tracking_rate * walk
            eta = np.where(keep[None, :, None], np.maximum(eta[None], floor), 0.0)
        return track_shifts(scores, first, static, eta, np.asarray(quantiles, dtype=float), self.tracking_window)

    @property
    def adaptive(self) -> bool:
        return self.volatility_floor > 0

    def _scale(self, values: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """Per-origin recent volatility, floored; with no recent data, a wide fallback."""
        vol = recent_volatility(values, origins, self.log_offset, self.volatility_window)
        return np.where(np.isfinite(vol), np.maximum(vol, self.volatility_floor),
                        NO_DATA_SCALE * self.volatility_floor)

    def _apply(self, raw: np.ndarray, quantiles: Sequence[float], scale: np.ndarray,
               shift: np.ndarray | None = None) -> np.ndarray:
        """Calibrated quantiles (n, k, h) from base quantiles ``raw`` (n, 1 + k, h), median first.

        Adaptive: median + offset × recent volatility; centred: median + offset; otherwise each
        base quantile + its offset (per origin when ``shift`` (n, k, h) is given: the tracked shifts).
        """
        if shift is None:
            shift = self._shift(quantiles, raw.shape[2])[None, :, :]
        if self.adaptive:
            centre = to_log(raw[:, :1, :], self.log_offset)
            shifted = centre + scale[:, None, None] * shift
        else:
            shifted = _fwd(self._centres(raw), self.log_offset, self.additive, self.root) + shift
        out = _inv(shifted, self.log_offset, self.additive, self.root)
        return np.where(np.isfinite(raw[:, 1:, :]) & np.isfinite(raw[:, :1, :]), out, np.nan)

    def _centres(self, raw: np.ndarray) -> np.ndarray:
        """What each quantile's shift is added to, from ``raw`` (n, 1 + k, h), median first: the
        median for every quantile when centred, else the base model's own quantiles."""
        return np.repeat(raw[:, :1, :], raw.shape[1] - 1, axis=1) if self.centred else raw[:, 1:, :]

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
        if self.tracking:
            grid = on_model_grid(recent, self.step_seconds, self.base.kind).tail(self.window_steps)
            values = self.walk_forward(grid, np.array([len(grid) - 1]), horizon_steps, qs)[0]
            require_finite(values, self.base.kind, grid)
            return Forecast(issued_at=grid.last_time, step_seconds=self.step_seconds, quantiles=qs,
                            values=values, model=f"{self.base.kind}+calibrated")
        raw = self.base.forecast(recent, horizon_steps, _with_median(qs))
        grid = on_model_grid(recent, self.step_seconds, self.base.kind)
        last = np.array([len(grid) - 1])
        values = np.asarray(raw.values)
        stacked = np.concatenate([values[[raw.quantiles.index(0.5)]], values[[raw.quantiles.index(q) for q in qs]]])
        return Forecast(
            issued_at=raw.issued_at,
            step_seconds=raw.step_seconds,
            quantiles=qs,
            values=self._apply(stacked[None], qs, self._scale(grid.values, last))[0],
            model=f"{self.base.kind}+calibrated",
        )

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        qs = tuple(quantiles)
        idx = check_origins(series, origins)
        base_qs = _with_median(qs)
        if not self.tracking or idx.size == 0:
            raw = walk_forward(self.base, series, idx, horizon_steps, base_qs)
            stacked = np.concatenate([raw[:, [base_qs.index(0.5)]], raw[:, [base_qs.index(q) for q in qs]]], axis=1)
            return self._apply(stacked, qs, self._scale(series.values, idx))
        # The base forecasts at every step from the first replayed origin on, once.
        lo = max(0, int(idx.min()) - self.tracking_window)
        steps = np.arange(lo, int(idx.max()) + 1)
        h_track = max(horizon_steps, 1)
        raw_all = walk_forward(self.base, series, steps, h_track, base_qs)
        target = steps[:, None] + np.arange(1, h_track + 1)[None, :]
        actual = np.where(target < len(series), series.values[np.minimum(target, len(series) - 1)], np.nan)
        actual_t = np.where(np.isfinite(actual), _fwd(actual, self.log_offset, self.additive, self.root), np.nan)
        base_q = self._centres(np.concatenate([raw_all[:, [base_qs.index(0.5)]],
                                               raw_all[:, [base_qs.index(q) for q in qs]]], axis=1))
        scores = actual_t[:, None, :] - np.where(np.isfinite(base_q), _fwd(base_q, self.log_offset, self.additive, self.root),
                                                 np.nan)
        vol = (recent_volatility(series.values, idx, self.log_offset, self.volatility_window, self.additive,
                                 self.root)
               if self.tracking_floor > 0 else None)
        shift = self._tracked(scores, idx - lo, qs, vol)
        raw = raw_all[idx - lo, :, :horizon_steps]
        stacked = np.concatenate([raw[:, [base_qs.index(0.5)]], raw[:, [base_qs.index(q) for q in qs]]], axis=1)
        return self._apply(stacked, qs, self._scale(series.values, idx), shift[:, :, :horizon_steps])

    def to_params(self) -> dict[str, Any]:
        return {
            "base_kind": self.base.kind,
            "base_params": self.base.to_params(),
            "quantiles": list(self.quantiles),
            "offsets": [list(r) for r in self.offsets],
            "log_offset": self.log_offset,
            "volatility_floor": self.volatility_floor,
            "volatility_window": self.volatility_window,
            "tracking_window": self.tracking_window,
            "tracking_steps": [list(r) for r in self.tracking_steps],
            "tracking_rate": self.tracking_rate,
            "additive": self.additive,
            **({"centred": True} if self.centred else {}),
            **({"root": True} if self.root else {}),
            **({"tracking_floor": self.tracking_floor} if self.tracking_floor else {}),
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CalibratedModel:
        from predictive_scaler.forecasting.registry import model_from_params

        try:
            base_kind = str(params["base_kind"])
            base_params = dict(params["base_params"])
            quantiles = check_quantiles(params["quantiles"])
            offsets = tuple(tuple(float(v) for v in row) for row in params["offsets"])
            log_offset = float(params["log_offset"])
            floor = float(params.get("volatility_floor", 0.0))
            vol_window = int(params.get("volatility_window", VOLATILITY_WINDOW))
            tracking_window = int(params.get("tracking_window", 0))
            tracking_steps = tuple(tuple(float(v) for v in row) for row in params.get("tracking_steps", ()))
            tracking_rate = float(params.get("tracking_rate", 0.0))
            tracking_floor = float(params.get("tracking_floor", 0.0))
            additive = params.get("additive", False)
            centred = params.get("centred", False)
            root = params.get("root", False)
            if not all(isinstance(v, bool) for v in (additive, centred, root)):
                raise TypeError("additive, centred and root must be true or false")
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"calibrated model parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if base_kind == cls.kind:
            raise ModelError("a calibrated model cannot wrap another calibrated model; retrain")
        if not all(math.isfinite(v) for row in offsets for v in row) or not (math.isfinite(log_offset) and log_offset > 0):
            raise ModelError("calibration parameters contain non-finite numbers; retrain the model")
        if not (math.isfinite(floor) and floor >= 0) or vol_window < 1:
            raise ModelError("calibration volatility settings are out of range; retrain the model")
        if tracking_window < 0 or not (math.isfinite(tracking_rate) and tracking_rate >= 0) or not all(
                math.isfinite(v) and v >= 0 for r in tracking_steps for v in r) or not (
                math.isfinite(tracking_floor) and tracking_floor >= 0):
            raise ModelError("calibration tracking settings are out of range; retrain the model")
        return cls(base=model_from_params(base_kind, base_params), quantiles=quantiles,
                   offsets=offsets, log_offset=log_offset, volatility_floor=floor,
                   volatility_window=vol_window, tracking_window=tracking_window,
                   tracking_steps=tracking_steps, tracking_rate=tracking_rate, additive=additive,
                   tracking_floor=tracking_floor, centred=centred, root=root)


def track_shifts(scores: np.ndarray, first: np.ndarray, static: np.ndarray, eta: np.ndarray,
                 quantiles: np.ndarray, window: int) -> np.ndarray:
    """The tracker of :class:`CalibratedModel`: (n, k, h) shifts at origins ``first``.

    ``scores`` (N, k, h) are log(actual) - log(base quantile) of the forecasts issued at each
    step (NaN where unknown); each origin t replays the ``window`` steps before it, starting at
    ``static`` (k, h), with step ``eta`` (k, h), or (n, k, h) one per origin, counting only
    targets observed by t.
    """
    h_max = scores.shape[2]
    if first.size <= 2:
        return _track_few(scores, first, static, eta, quantiles, window)
    n, k = first.size, static.shape[0]
    steps = np.broadcast_to(eta if eta.ndim == 3 else eta[None], (n, k, h_max))
    alpha = 1.0 - quantiles[:, None]  # (k, 1)
    theta = np.repeat(static[None].astype(float), n, axis=0)
    # Only lanes that move are replayed (the median's step is zero), and each replayed forecast adds
    # its precomputed step: up (a miss of the quantile) or down, zero where not observed by t —
    # the same arithmetic, in the same order, as stepping by eta·(1[s > θ] − α).
    lanes = np.flatnonzero(np.any(steps != 0, axis=(0, 2)))
    if lanes.size == 0 or window <= 0:
        return theta
    sub = scores[:, lanes, :]
    up = steps[:, lanes, :] * (1.0 - alpha[lanes])[None]
    down = steps[:, lanes, :] * (0.0 - alpha[lanes])[None]
    th = theta[:, lanes, :]
    spacing = int(first[1] - first[0])
    if spacing > 0 and np.all(np.diff(first) == spacing):
        theta[:, lanes, :] = _track_spaced(sub, int(first[0]), spacing, th, up, down, window,
                                           per_origin=eta.ndim == 3)
        return theta
    hs = np.arange(1, h_max + 1)
    if n * lanes.size * h_max > TRACK_SMALL_VALUES:
        # Many origins: numpy's per-call overhead is small against the arrays; step by step.
        for u in range(window):
            j = first - window + u
            got1 = sub[np.maximum(j, 0)]
            seen1 = ((j >= 0)[:, None] & ((j[:, None] + hs[None, :]) <= first[:, None]))[:, None, :]
            th = th + np.where(seen1 & np.isfinite(got1), np.where(got1 > th, up, down), 0.0)
        theta[:, lanes, :] = th
        return theta
    chunk = max(1, TRACK_BLOCK_VALUES // max(1, n * lanes.size * h_max))
    for u0 in range(0, window, chunk):
        us = np.arange(u0, min(window, u0 + chunk))
        j = first[None, :] - window + us[:, None]  # (c, n): issue steps of the replayed forecasts
        got = sub[np.maximum(j, 0)]  # (c, n, k', h), one contiguous block per replayed step
        seen = ((j >= 0)[:, :, None] & ((j[:, :, None] + hs[None, None, :]) <= first[None, :, None]))[:, :, None, :]
        seen = seen & np.isfinite(got)
        add_up = np.where(seen, up[None], 0.0)
        add_down = np.where(seen, down[None], 0.0)
        for c in range(us.size):
            th = th + np.where(got[c] > th, add_up[c], add_down[c])
    theta[:, lanes, :] = th
    return theta


def _track_spaced(sub: np.ndarray, t0: int, spacing: int, th: np.ndarray, up: np.ndarray, down: np.ndarray,
                  window: int, *, per_origin: bool) -> np.ndarray:
    """:func:`track_shifts` for the evenly spaced origins ``t0, t0 + d, …, t0 + (n - 1)·d``
    (calibration, scoring, the tracking rate's choice): the u-th replayed issue step of every
    origin is then one slice of every ``spacing``-th row of ``sub``, and whether its target is
    observed by the origin depends on u and the horizon only (u ≤ W - h).
    The same arithmetic in the same order as the general path — each update adds the same up or
    down step, an unobserved or NaN one adds nothing — with no gathers and no per-step masks.
    """
    n, k, h_max = th.shape
    pad = max(0, window - t0)  # issue steps before the first score: never observed
    if pad:
        sub = np.concatenate([np.full((pad, k, h_max), np.nan), sub])
    valid = np.isfinite(sub)
    base = t0 - window + pad  # row of issue step t0 - W
    th = th.copy()

    def rows(values: np.ndarray) -> Callable[[int], np.ndarray]:
        """The u-th replayed issue step of every origin: rows base + u + i·spacing, read from a
        contiguous copy of every spacing-th row (numpy's strided loops are slower than the saving)."""
        phases = [np.ascontiguousarray(values[p::spacing]) for p in range(spacing)]
        return lambda u: phases[(base + u) % spacing][(base + u) // spacing:(base + u) // spacing + n]

    scores_at = rows(sub)
    if per_origin:
        valid_at = rows(valid)
        inc = np.empty_like(th)
        for u in range(window):
            cols = min(h_max, window - u)
            got = scores_at(u)[:, :, :cols]
            t = th[:, :, :cols]
            np.copyto(inc[:, :, :cols], np.where(got > t, up[:, :, :cols], down[:, :, :cols]))
            inc[:, :, :cols] *= valid_at(u)[:, :, :cols]
            t += inc[:, :, :cols]
        return th
    # One step per (lane, horizon) for every origin: the masked up and down steps per issue step.
    up_at = rows(np.where(valid, up[0][None], 0.0))
    down_at = rows(np.where(valid, down[0][None], 0.0))
    for u in range(window):
        cols = min(h_max, window - u)
        t = th[:, :, :cols]
        t += np.where(scores_at(u)[:, :, :cols] > t, up_at(u)[:, :, :cols], down_at(u)[:, :, :cols])
    return th


def _track_few(scores: np.ndarray, first: np.ndarray, static: np.ndarray, eta: np.ndarray,
               quantiles: np.ndarray, window: int) -> np.ndarray:
    """:func:`track_shifts` for one or two origins (serving) in plain Python: the same
    arithmetic in the same order, without numpy's per-call overhead on tiny arrays.

    Each (quantile, step) lane is an independent recursion over the issue steps, so it runs
    lane by lane over one column; a lane whose step is zero (the untracked median) never
    moves and is not replayed."""
    k, h_max = static.shape
    out = np.repeat(static[None].astype(float), first.size, axis=0)
    for i, t in enumerate(int(v) for v in first):
        lo = max(0, t - window)
        lane = eta[i] if eta.ndim == 3 else eta
        for a in range(k):
            al = 1.0 - float(quantiles[a])
            for b in range(h_max):
                step = float(lane[a, b])
                if step == 0.0:
                    continue
                th = float(static[a, b])
                # The forecast issued at step j for j + b + 1 is observed by t when j < t - b.
                for v in scores[lo:max(lo, t - b), a, b].tolist():
                    if v == v:  # not NaN
                        th += step * ((1.0 if v > th else 0.0) - al)
                out[i, a, b] = th
    return out


def choose_tracking_rate(scores: np.ndarray, base_log: np.ndarray, actual_log: np.ndarray, q: float,
                         log_offset: float, window: int, rates: Sequence[float], additive: bool = False,
                         spacing: int = 1, root: bool = False) -> float:
    """The rate whose tracked q-quantile has the least pinball loss, two-fold on the calibration
    scores (static shifts and steps from one half, tracked forecasts scored on the other's every
    ``spacing``-th origin, and back). ``scores``, ``base_log`` and ``actual_log`` are (n, h) over
    consecutive origins."""
    n, h_max = scores.shape
    half = n // 2
    if half < MIN_SCORES:
        return float(rates[0])
    loss = np.zeros(len(rates))
    idx = np.arange(n)
    for fit, test in ((idx[:half], idx[half::spacing]), (idx[half:], idx[:half:spacing])):
        static = np.array([[conformal_quantile(scores[fit, h], q) for h in range(h_max)]])
        iqr = np.maximum(interquartile_ranges(scores[fit]), 0.0)[None, :]
        actual = _inv(actual_log[test], log_offset, additive, root)
        ok = np.isfinite(actual_log[test]) & np.isfinite(base_log[test])
        for i, rate in enumerate(rates):
            theta = (track_shifts(scores[:, None, :], test, static, rate * iqr, np.array([q]), window)[:, 0, :]
                     if rate > 0 else np.repeat(static, test.size, axis=0))
            upper = _inv(base_log[test] + theta, log_offset, additive, root)
            diff = np.where(ok, actual - upper, 0.0)
            loss[i] += float(np.sum(np.maximum(q * diff, (q - 1.0) * diff)))
    return float(rates[int(np.argmin(loss))])


def interquartile_ranges(scores: np.ndarray) -> np.ndarray:
    """Each column's interquartile range, NaN ignored (NaN for a column with no number): the same
    numbers as ``nanpercentile`` column by column — its linear interpolation between the order
    statistics, written out for all columns at once (``nanpercentile`` itself walks the columns
    one by one in Python once any is missing, and almost every calibration has missing targets
    at its window's end)."""
    values = np.asarray(scores, dtype=float)
    ordered = np.sort(values, axis=0)  # NaN last
    count = np.sum(~np.isnan(values), axis=0)
    cols = np.arange(values.shape[1])
    top = np.maximum(count - 1, 0)
    quartiles = []
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, as nanpercentile gives
        for q in (0.75, 0.25):
            virtual = top * q  # numpy's (n - 1)·q, exact for these q
            below = np.floor(virtual).astype(int)
            t = virtual - below
            a = ordered[below, cols]
            b = ordered[np.minimum(below + 1, top), cols]
            diff = b - a
            # numpy's lerp: from the nearer end, so the ends are exact.
            quartiles.append(np.where(t >= 0.5, b - diff * (1 - t), a + diff * t))
        ranges = quartiles[0] - quartiles[1]
    return np.where(count > 0, ranges, np.nan)


def conformal_quantile(scores: np.ndarray, q: float) -> float:
    """The ⌈(n+1)q⌉-th smallest score: covers ``q`` of a new exchangeable score."""
    s = np.sort(scores[np.isfinite(scores)])
    n = s.size
    if n < MIN_SCORES:
        raise ModelError(
            f"only {n} out-of-sample residuals to calibrate on (need {MIN_SCORES}); use a longer "
            "calibration window"
        )
    rank = min(n, math.ceil((n + 1) * q))
    return float(s[rank - 1])


def weighted_conformal_quantile(scores: np.ndarray, q: float, weights: np.ndarray) -> float:
    """The q-quantile of ``scores`` with weights (non-exchangeable conformal prediction, Barber
    et al. 2023): the smallest score whose cumulative weight, with one more unit of weight for the
    new score itself, reaches ``q``; the largest score where it never does. Equal weights give
    :func:`conformal_quantile`."""
    ok = np.isfinite(scores) & np.isfinite(weights)
    s, w = scores[ok], np.maximum(weights[ok], 0.0)
    if s.size < MIN_SCORES:
        raise ModelError(
            f"only {s.size} out-of-sample residuals to calibrate on (need {MIN_SCORES}); use a longer "
            "calibration window"
        )
    order = np.argsort(s, kind="stable")
    w = w[order] / w.max()
    cum = np.cumsum(w) / (w.sum() + 1.0)
    hit = np.flatnonzero(cum >= q - 1e-12)
    return float(s[order][hit[0]] if hit.size else s[order][-1])


def recency_weights(origins: np.ndarray, step_seconds: int, half_life_seconds: float) -> np.ndarray:
    """Weight of each calibration origin: halved every ``half_life_seconds`` before the last one."""
    age = (float(origins.max()) - origins.astype(float)) * step_seconds if origins.size else origins
    return np.asarray(np.exp2(-age / half_life_seconds), dtype=float)


#: Base forecasts kept for the next calibration of the same model on the same data: a training run
#: calibrates each candidate twice on the same window (log-scale and additive shifts),
#: and each cross-fitting half twice too; the forecasts are the same numbers, computed once.
_BASE_FORECASTS: SharedResults[tuple[FittedModel, np.ndarray]] = SharedResults(4)


def _base_forecasts(base: FittedModel, series: Series, first_origin: int, stride: int, origins: np.ndarray,
                    h_max: int, quantiles: tuple[float, ...]) -> np.ndarray:
    """``walk_forward(base, series, origins, h_max, quantiles)``, read-only, shared with the last
    calibrations of the same model object on the same series (start, step, every value)."""
    def compute() -> tuple[FittedModel, np.ndarray]:
        forecasts = np.array(walk_forward(base, series, origins, h_max, quantiles))  # a copy of its own
        forecasts.flags.writeable = False
        return base, forecasts

    key = (id(base), history_key(series), first_origin, stride, h_max, quantiles)
    # The kept model is held, so while it is kept its id cannot have been reused by another.
    return _BASE_FORECASTS.get(key, compute, valid=lambda hit: hit[0] is base)[1]


def live_origins(origins: np.ndarray, live_from: int, horizon_steps: int) -> np.ndarray:
    """Which ``origins`` (ascending) a calibration scores: those at or after ``live_from``, the
    history's first step after its leading idle stretch. A service idle until its launch scores
    zero error on every idle origin (the idle value forecast, the idle value seen); counted, they
    shrink every shift towards nothing (a week with six idle days served a P95 that covered 0.84-0.90
    after the launch). When fewer than :data:`MIN_SCORES` (and a horizon's worth) live origins
    remain, every origin is scored, as before this rule: the few live ones cannot make a quantile,
    and the latest :data:`MIN_SCORES` alone rest the shift on a handful of errors from the first
    minutes of traffic, which the tracker cannot unwind while the idle scores' spread is nil (a P95
    of several times the traffic for days, on a series launched 45 minutes before its training,
    with or without the launch's own jump among the scores)."""
    live = origins >= live_from
    if live.all() or int(live.sum()) >= MIN_SCORES + horizon_steps:
        return live
    return np.ones(origins.size, dtype=bool)


def calibrate(
    base: FittedModel,
    series: Series,
    first_origin: int,
    *,
    quantiles: Sequence[float] = CALIBRATED_QUANTILES,
    horizon_steps: int | None = None,
    stride: int = 1,
    adaptive: bool = False,
    tracking_rate: float | None = None,
    additive: bool = False,
    tracking_rates: Sequence[float] = TRACKING_RATES,
    half_life_seconds: float | None = None,
    live_from: int = 0,
) -> CalibratedModel:
    """Calibrate ``base`` on the forecasts it makes from ``first_origin`` to the end of ``series``.

    Only pairs whose actual lies inside ``series`` count, so calibration never
    looks past the data it is given; ``first_origin`` should be the last step
    of the base model's fit window, so every score is out of sample. ``stride``
    thins the origins for models that forecast one origin at a time.
    ``adaptive`` scores residuals in units of the recent volatility, so the
    interval widens in bursty hours and narrows in calm ones. ``tracking_rates`` are the tracker
    rates the choice is made among (when ``tracking_rate`` is None). ``half_life_seconds`` weights
    the calibration scores by recency (:func:`weighted_conformal_quantile`): a level or volatility
    change inside the window counts more than what came before it. ``live_from`` is the index in
    ``series`` of the history's first step after its leading idle stretch
    (:func:`~predictive_scaler.forecasting.walkforward.leading_idle_steps`): origins before it are
    not scored while :data:`MIN_SCORES` later ones remain (:func:`live_origins`).
    """
    qs = check_quantiles(quantiles)
    h_max = horizon_steps or max_horizon_steps(series.step_seconds)
    origins = check_origins(series, np.arange(first_origin, len(series) - 1, max(1, stride)))
    base_qs = _with_median(qs)
    forecasts = _base_forecasts(base, series, first_origin, max(1, stride), origins, h_max, base_qs)  # (n, k, h)
    keep = live_origins(origins, live_from, h_max)
    origins, forecasts = origins[keep], forecasts[keep]
    log_offset = float(getattr(base, "log_offset", 0.0)) or choose_log_offset(series.values[: first_origin + 1])
    actual = np.full((origins.size, h_max), np.nan)
    for h in range(1, h_max + 1):
        target = origins + h
        inside = target < len(series)
        actual[inside, h - 1] = series.values[target[inside]]
    shape = ADDITIVE_SHAPE if additive and not adaptive else None
    centred, root = shape in ("root", "demand"), shape == "root"
    # "log" names the shifts' scale: log(x + c), or demand units (or their root) when additive.
    actual_log = _fwd(actual, log_offset, additive and not adaptive, root)
    actual_log[~np.isfinite(actual)] = np.nan

    def log_of(fc: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(fc), _fwd(fc, log_offset, additive and not adaptive, root), np.nan)

    def centre(q: float) -> np.ndarray:
        return forecasts[:, base_qs.index(0.5 if centred else q), :]

    floor = 0.0
    if adaptive:
        vol = recent_volatility(series.values, origins, log_offset, VOLATILITY_WINDOW)
        typical = float(np.nanmedian(vol)) if np.isfinite(vol).any() else 0.0
        floor = VOLATILITY_FLOOR_SHARE * typical
    window = max(1, TRACKING_SECONDS // series.step_seconds)
    if tracking_rate is not None:
        rate = tracking_rate
    elif floor > 0 or stride != 1:
        rate = 0.0
    elif origins.size * series.step_seconds < TRACKING_CHOICE_SECONDS:
        rate = DEFAULT_TRACKING_RATE if DEFAULT_TRACKING_RATE in tracking_rates else float(max(tracking_rates))
    else:
        q_star = min(qs, key=lambda v: abs(v - 0.95))
        base_log = log_of(centre(q_star))
        rate = choose_tracking_rate(actual_log - base_log, base_log, actual_log, q_star, log_offset,
                                    window, tuple(tracking_rates), additive,
                                    spacing=max(1, RATE_CHOICE_SPACING_SECONDS // series.step_seconds), root=root)
    weights = (recency_weights(origins, series.step_seconds, half_life_seconds)
               if half_life_seconds else None)
    offsets = []
    steps = []
    for q in qs:
        if floor > 0:
            # Locally adaptive: distance from the median in units of recent volatility.
            scale = np.where(np.isfinite(vol), np.maximum(vol, floor), NO_DATA_SCALE * floor)
            scores = (actual_log - log_of(forecasts[:, base_qs.index(0.5), :])) / scale[:, None]
        else:
            scores = actual_log - log_of(centre(q))
        offsets.append(tuple(conformal_quantile(scores[:, h], q) if weights is None
                             else weighted_conformal_quantile(scores[:, h], q, weights) for h in range(h_max)))
        iqr = interquartile_ranges(scores).tolist()
        steps.append(tuple(rate * max(v, 0.0) for v in iqr))
    track = floor == 0 and rate > 0
    return CalibratedModel(base=base, quantiles=qs, offsets=tuple(offsets), log_offset=log_offset,
                           volatility_floor=floor, tracking_window=window if track else 0,
                           tracking_steps=tuple(steps) if track else (), tracking_rate=rate if track else 0.0,
                           additive=additive and floor == 0, centred=centred and floor == 0,
                           root=root and floor == 0,
                           tracking_floor=TRACKING_FLOOR_SHARE if track else 0.0)
