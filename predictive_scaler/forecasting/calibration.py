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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.base import FittedModel, Forecast, check_quantiles
from predictive_scaler.forecasting.logscale import choose_log_offset, from_log, to_log
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    check_origins,
    max_horizon_steps,
    on_model_grid,
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


def _with_median(quantiles: Sequence[float]) -> tuple[float, ...]:
    return tuple(sorted({0.5, *quantiles}))


def recent_volatility(values: np.ndarray, origins: np.ndarray, log_offset: float, window: int) -> np.ndarray:
    """RMS of the one-step log changes in the ``window`` steps up to each origin (NaN if none)."""
    logy = to_log(values, log_offset)
    logy[~np.isfinite(values)] = np.nan
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
    kind: ClassVar[str] = "calibrated"

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.quantiles) or not all(self.offsets):
            raise ModelError("calibration offsets do not match their quantiles; recalibrate the model")

    @property
    def step_seconds(self) -> int:  # type: ignore[override]
        return self.base.step_seconds

    @property
    def window_steps(self) -> int:
        return int(getattr(self.base, "window_steps", DEFAULT_WINDOW_STEPS))

    @property
    def base_kind(self) -> str:
        return self.base.kind

    def _shift(self, quantiles: Sequence[float], horizon_steps: int) -> np.ndarray:
        """(k, h) log shifts: interpolated between calibrated quantiles, last step repeated."""
        table = np.asarray(self.offsets)  # (K, H)
        cols = np.minimum(np.arange(horizon_steps), table.shape[1] - 1)
        table = table[:, cols]
        grid = np.asarray(self.quantiles)
        return np.array([[np.interp(q, grid, table[:, h]) for h in range(horizon_steps)] for q in quantiles])

    @property
    def adaptive(self) -> bool:
        return self.volatility_floor > 0

    def _scale(self, values: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """Per-origin recent volatility, floored; with no recent data, a wide fallback."""
        vol = recent_volatility(values, origins, self.log_offset, self.volatility_window)
        return np.where(np.isfinite(vol), np.maximum(vol, self.volatility_floor),
                        NO_DATA_SCALE * self.volatility_floor)

    def _apply(self, raw: np.ndarray, quantiles: Sequence[float], scale: np.ndarray) -> np.ndarray:
        """Calibrated quantiles (n, k, h) from base quantiles ``raw`` (n, 1 + k, h), median first.

        Adaptive: median + offset × recent volatility; otherwise each base quantile + its offset.
        """
        shift = self._shift(quantiles, raw.shape[2])[None, :, :]
        if self.adaptive:
            centre = to_log(raw[:, :1, :], self.log_offset)
            shifted = centre + scale[:, None, None] * shift
        else:
            shifted = to_log(raw[:, 1:, :], self.log_offset) + shift
        out = from_log(shifted, self.log_offset)
        return np.where(np.isfinite(raw[:, 1:, :]) & np.isfinite(raw[:, :1, :]), out, np.nan)

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
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
        raw = walk_forward(self.base, series, idx, horizon_steps, base_qs)
        stacked = np.concatenate([raw[:, [base_qs.index(0.5)]], raw[:, [base_qs.index(q) for q in qs]]], axis=1)
        return self._apply(stacked, qs, self._scale(series.values, idx))

    def to_params(self) -> dict[str, Any]:
        return {
            "base_kind": self.base.kind,
            "base_params": self.base.to_params(),
            "quantiles": list(self.quantiles),
            "offsets": [list(r) for r in self.offsets],
            "log_offset": self.log_offset,
            "volatility_floor": self.volatility_floor,
            "volatility_window": self.volatility_window,
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
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"calibrated model parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if base_kind == cls.kind:
            raise ModelError("a calibrated model cannot wrap another calibrated model; retrain")
        if not all(math.isfinite(v) for row in offsets for v in row) or not (math.isfinite(log_offset) and log_offset > 0):
            raise ModelError("calibration parameters contain non-finite numbers; retrain the model")
        if not (math.isfinite(floor) and floor >= 0) or vol_window < 1:
            raise ModelError("calibration volatility settings are out of range; retrain the model")
        return cls(base=model_from_params(base_kind, base_params), quantiles=quantiles,
                   offsets=offsets, log_offset=log_offset, volatility_floor=floor,
                   volatility_window=vol_window)


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


def calibrate(
    base: FittedModel,
    series: Series,
    first_origin: int,
    *,
    quantiles: Sequence[float] = CALIBRATED_QUANTILES,
    horizon_steps: int | None = None,
    stride: int = 1,
    adaptive: bool = False,
) -> CalibratedModel:
    """Calibrate ``base`` on the forecasts it makes from ``first_origin`` to the end of ``series``.

    Only pairs whose actual lies inside ``series`` count, so calibration never
    looks past the data it is given; ``first_origin`` should be the last step
    of the base model's fit window, so every score is out of sample. ``stride``
    thins the origins for models that forecast one origin at a time.
    ``adaptive`` scores residuals in units of the recent volatility, so the
    interval widens in bursty hours and narrows in calm ones.
    """
    qs = check_quantiles(quantiles)
    h_max = horizon_steps or max_horizon_steps(series.step_seconds)
    origins = check_origins(series, np.arange(first_origin, len(series) - 1, max(1, stride)))
    base_qs = _with_median(qs)
    forecasts = walk_forward(base, series, origins, h_max, base_qs)  # (n, k, h)
    log_offset = float(getattr(base, "log_offset", 0.0)) or choose_log_offset(series.values[: first_origin + 1])
    actual = np.full((origins.size, h_max), np.nan)
    for h in range(1, h_max + 1):
        target = origins + h
        inside = target < len(series)
        actual[inside, h - 1] = series.values[target[inside]]
    actual_log = to_log(actual, log_offset)
    actual_log[~np.isfinite(actual)] = np.nan

    def log_of(fc: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(fc), to_log(fc, log_offset), np.nan)

    floor = 0.0
    if adaptive:
        vol = recent_volatility(series.values, origins, log_offset, VOLATILITY_WINDOW)
        typical = float(np.nanmedian(vol)) if np.isfinite(vol).any() else 0.0
        floor = VOLATILITY_FLOOR_SHARE * typical
    offsets = []
    for q in qs:
        if floor > 0:
            # Locally adaptive: distance from the median in units of recent volatility.
            scale = np.where(np.isfinite(vol), np.maximum(vol, floor), NO_DATA_SCALE * floor)
            scores = (actual_log - log_of(forecasts[:, base_qs.index(0.5), :])) / scale[:, None]
        else:
            scores = actual_log - log_of(forecasts[:, base_qs.index(q), :])
        offsets.append(tuple(conformal_quantile(scores[:, h], q) for h in range(h_max)))
    return CalibratedModel(base=base, quantiles=qs, offsets=tuple(offsets), log_offset=log_offset,
                           volatility_floor=floor)
