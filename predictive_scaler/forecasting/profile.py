"""Seasonal profile: the quantiles of what the same time of day did on the past days, from today's level.

Every other candidate forecasts a point and takes its spread from residuals that are the same at
every time of day, so traffic that bursts at about the same time every day (a job every two hours
that starts a few minutes early or late) gets either a point forecast that misses the burst's
timing or a band that is wide all day. This model reads the quantile straight from the past days:

- the level at an origin is the mean log value over the last :data:`LEVEL_SECONDS` (gaps skipped);
- for a target ``h`` steps after origin ``t`` and each of the last :data:`DAYS` days ``k``, the
  values within ± :data:`HALF_WIDTH_SECONDS` of ``t + h − k`` days, each less the level at
  ``t − k`` days, are one pool of analogues (how far above its own level that time of day ran);
- the forecast quantile is today's level plus the pool's quantile.

So a burst that came within a quarter of an hour of this time on some of the last week's days
raises the upper quantiles here and nowhere else, and a level shift moves every quantile with the
level. Everything is on the project's log scale (:mod:`logscale`); nothing is fitted but the log
offset, so a fit costs microseconds and the forecast depends only on the recent window. The
conformal calibration (:mod:`calibration`) then shifts the quantiles as for every candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting.baselines import forward_fill
from predictive_scaler.forecasting.logscale import choose_log_offset, from_log, observed_log
from predictive_scaler.forecasting.walkforward import WalkForwardModel, check_origins
from predictive_scaler.series import Series

DAY = 86400
#: Past days pooled: a week, so every weekday is one analogue.
DAYS = 7
#: Analogues within this much of the target's time of day (recurring events start early or late).
HALF_WIDTH_SECONDS = 900
#: The level is the mean log value over this much of the recent past.
LEVEL_SECONDS = 3600
#: Fewer analogues than this give no quantile (the last level is served instead, no spread).
MIN_ANALOGUES = 5
#: A step too coarse to hold this many analogues over :data:`DAYS` days is refused at fit: the pool's
#: 95th percentile should stand on at least two analogues above it, not on the largest of a few.
MIN_POOL = 40


def _steps(seconds: int, step_seconds: int) -> int:
    return max(1, round(seconds / step_seconds))


def _level(logy: np.ndarray, width: int) -> np.ndarray:
    """Mean of the finite values among the last ``width`` steps at each step (NaN where none).

    Summed window by window, not from a running sum, so a step's level is the same number whatever
    history precedes its window (serving one window equals evaluating many origins)."""
    padded = np.concatenate([np.full(width - 1, np.nan), logy])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    ok = np.isfinite(windows)
    n = ok.sum(axis=1)
    total = np.where(ok, windows, 0.0).sum(axis=1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _row_quantiles(pool: np.ndarray, quantiles: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Quantiles along the last axis ignoring NaN (linear interpolation, as numpy's default), vectorised;
    (values with the quantiles first, how many values each row held)."""
    ordered = np.sort(pool, axis=-1)  # NaN sort last
    n = np.sum(np.isfinite(pool), axis=-1)
    out = np.empty((len(quantiles), *pool.shape[:-1]))
    for i, q in enumerate(quantiles):
        pos = q * np.maximum(n - 1, 0)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        frac = pos - lo
        a = np.take_along_axis(ordered, lo[..., None], axis=-1)[..., 0]
        b = np.take_along_axis(ordered, hi[..., None], axis=-1)[..., 0]
        out[i] = a + frac * (b - a)
    return out, n


@dataclass(frozen=True)
class SeasonalProfileModel(WalkForwardModel):
    """Today's level plus the quantiles of the same time of day, relative to its level, on past days."""

    step_seconds: int
    log_offset: float
    day_steps: int
    days: int
    half_width_steps: int
    level_steps: int
    kind: ClassVar[str] = "seasonal-profile"

    @property
    def window_steps(self) -> int:
        return self.days * self.day_steps + self.half_width_steps + self.level_steps + 1

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        idx = check_origins(series, origins)
        logy = observed_log(series.values, self.log_offset)
        level = forward_fill(_level(logy, self.level_steps))
        n = logy.size
        w = self.half_width_steps
        offsets = np.arange(-w, w + 1)
        hs = np.arange(1, horizon_steps + 1)
        pools = []
        for k in range(1, self.days + 1):
            back = k * self.day_steps
            then = idx - back  # the origin's analogue on day k
            base = np.where(then >= 0, level[np.maximum(then, 0)], np.nan)  # (m,)
            pos = idx[:, None, None] + hs[None, :, None] - back + offsets[None, None, :]  # (m, h, 2w+1)
            # Only what was observed by the origin is read.
            known = (pos >= 0) & (pos <= idx[:, None, None]) & (pos < n)
            vals = np.where(known, logy[np.clip(pos, 0, n - 1)], np.nan)
            pools.append(vals - base[:, None, None])
        pool = np.concatenate(pools, axis=-1)  # (m, h, days * (2w + 1))
        rel, count = _row_quantiles(pool, quantiles)  # (k, m, h)
        # Forward-filled, the level is finite at an origin exactly where some value at or before it is.
        now = level[idx]
        last = forward_fill(logy)[idx]
        enough = count >= MIN_ANALOGUES
        out = np.where(enough[None], now[None, :, None] + rel, last[None, :, None])
        return from_log(np.transpose(out, (1, 0, 2)), self.log_offset)

    def to_params(self) -> dict[str, Any]:
        return {"step_seconds": self.step_seconds, "log_offset": self.log_offset, "day_steps": self.day_steps,
                "days": self.days, "half_width_steps": self.half_width_steps, "level_steps": self.level_steps}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SeasonalProfileModel:
        try:
            step = int(params["step_seconds"])
            offset = float(params["log_offset"])
            day, days = int(params["day_steps"]), int(params["days"])
            half, level = int(params["half_width_steps"]), int(params["level_steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"seasonal-profile parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if (step <= 0 or not (math.isfinite(offset) and offset > 0) or day < 1 or not 1 <= days <= 28
                or not 0 <= half < day or level < 1):
            raise ModelError("seasonal-profile parameters are out of range; retrain the model")
        return cls(step_seconds=step, log_offset=offset, day_steps=day, days=days, half_width_steps=half,
                   level_steps=level)


@dataclass
class SeasonalProfileForecaster:
    kind: ClassVar[str] = "seasonal-profile"

    def fit(self, history: Series) -> SeasonalProfileModel:
        step = history.step_seconds
        day = max(1, DAY // step)
        if step > DAY // 4 or len(history) <= day + _steps(LEVEL_SECONDS, step):
            raise InsufficientHistoryError(
                f"{history.name}: a seasonal profile needs more than a day of history at a step of at most "
                "6 hours; supply more"
            )
        half = _half_width_steps(step)
        if _pool_size(step) < MIN_POOL:
            raise ModelError(
                f"{history.name}: at a {step} s step a seasonal profile pools only {_pool_size(step)} "
                f"analogues over {DAYS} days (it needs {MIN_POOL} for its upper quantiles); use a step of at "
                f"most {_max_step()} s or leave seasonal-profile out of the forecasters"
            )
        if not np.any(np.isfinite(history.values)):
            raise InsufficientHistoryError(f"{history.name}: no observations to take a level from; supply data")
        return SeasonalProfileModel(
            step_seconds=step,
            log_offset=choose_log_offset(history.values),
            day_steps=day,
            days=DAYS,
            half_width_steps=half,
            level_steps=_steps(LEVEL_SECONDS, step),
        )


def _half_width_steps(step: int) -> int:
    """Steps either side of the target's time of day the pool takes from each day."""
    return min(max(1, DAY // step) - 1, HALF_WIDTH_SECONDS // step)


def _pool_size(step: int) -> int:
    """Analogues one target's pool holds at ``step``: each of :data:`DAYS` days gives its window."""
    return DAYS * (2 * _half_width_steps(step) + 1)


def _max_step() -> int:
    """The coarsest whole-minute step whose pool holds :data:`MIN_POOL` analogues."""
    return max(m * 60 for m in range(1, HALF_WIDTH_SECONDS // 60 + 1) if _pool_size(m * 60) >= MIN_POOL)
