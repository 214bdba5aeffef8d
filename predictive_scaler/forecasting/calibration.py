"""Conformal calibration of forecast quantiles per horizon step.

A model's own intervals are rarely honest (DESIGN.md §3 measured 0.97–0.99
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
    walk_forward,
)
from predictive_scaler.series import Series

#: Quantiles calibrated by default; others are interpolated between them.
CALIBRATED_QUANTILES: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.975, 0.99)
#: Fewer scores than this per horizon step cannot pin down a P95.
MIN_SCORES = 50


@dataclass(frozen=True)
class CalibratedModel(FittedModel):
    """``base`` with per-quantile, per-horizon-step shifts on the log scale."""

    base: FittedModel
    quantiles: tuple[float, ...]
    offsets: tuple[tuple[float, ...], ...]  # [quantile][horizon step]
    log_offset: float
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

    def _apply(self, values: np.ndarray, quantiles: Sequence[float], horizon_steps: int) -> np.ndarray:
        shifted = to_log(values, self.log_offset) + self._shift(quantiles, horizon_steps)
        out = from_log(shifted, self.log_offset)
        return np.where(np.isfinite(values), out, np.nan)

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
        raw = self.base.forecast(recent, horizon_steps, qs)
        return Forecast(
            issued_at=raw.issued_at,
            step_seconds=raw.step_seconds,
            quantiles=qs,
            values=self._apply(np.asarray(raw.values), qs, horizon_steps),
            model=f"{self.base.kind}+calibrated",
        )

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        raw = walk_forward(self.base, series, origins, horizon_steps, quantiles)
        return np.stack([self._apply(row, quantiles, horizon_steps) for row in raw]) if len(raw) else raw

    def to_params(self) -> dict[str, Any]:
        return {
            "base_kind": self.base.kind,
            "base_params": self.base.to_params(),
            "quantiles": list(self.quantiles),
            "offsets": [list(r) for r in self.offsets],
            "log_offset": self.log_offset,
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
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"calibrated model parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if base_kind == cls.kind:
            raise ModelError("a calibrated model cannot wrap another calibrated model; retrain")
        if not all(math.isfinite(v) for row in offsets for v in row) or not (math.isfinite(log_offset) and log_offset > 0):
            raise ModelError("calibration parameters contain non-finite numbers; retrain the model")
        return cls(base=model_from_params(base_kind, base_params), quantiles=quantiles,
                   offsets=offsets, log_offset=log_offset)


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
) -> CalibratedModel:
    """Calibrate ``base`` on the forecasts it makes from ``first_origin`` to the end of ``series``.

    Only pairs whose actual lies inside ``series`` count, so calibration never
    looks past the data it is given; ``first_origin`` should be the last step
    of the base model's fit window, so every score is out of sample. ``stride``
    thins the origins for models that forecast one origin at a time.
    """
    qs = check_quantiles(quantiles)
    h_max = horizon_steps or max_horizon_steps(series.step_seconds)
    origins = check_origins(series, np.arange(first_origin, len(series) - 1, max(1, stride)))
    forecasts = walk_forward(base, series, origins, h_max, qs)  # (n, k, h)
    log_offset = float(getattr(base, "log_offset", 0.0)) or choose_log_offset(series.values[: first_origin + 1])
    actual = np.full((origins.size, h_max), np.nan)
    for h in range(1, h_max + 1):
        target = origins + h
        inside = target < len(series)
        actual[inside, h - 1] = series.values[target[inside]]
    actual_log = to_log(actual, log_offset)
    actual_log[~np.isfinite(actual)] = np.nan
    offsets = []
    for k, q in enumerate(qs):
        fc = forecasts[:, k, :]
        scores = actual_log - np.where(np.isfinite(fc), to_log(fc, log_offset), np.nan)
        offsets.append(tuple(conformal_quantile(scores[:, h], q) for h in range(h_max)))
    return CalibratedModel(base=base, quantiles=qs, offsets=tuple(offsets), log_offset=log_offset)
