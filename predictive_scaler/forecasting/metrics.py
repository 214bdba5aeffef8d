"""Forecast accuracy metrics. NaN actuals are excluded everywhere; undefined → None.

``point`` is the median (P50) forecast, ``upper`` the forecast of quantile ``q``.
WAPE and MAPE are fractions (0.05 = 5 %), not percentages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _valid(actual: np.ndarray, forecast: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(actual, dtype=float)
    f = np.asarray(forecast, dtype=float)
    if a.shape != f.shape:
        raise ValueError(f"actuals {a.shape} and forecasts {f.shape} differ in shape")
    keep = np.isfinite(a) & np.isfinite(f)
    return a[keep], f[keep]


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def mae(actual: np.ndarray, point: np.ndarray) -> float | None:
    a, f = _valid(actual, point)
    return _finite(np.mean(np.abs(a - f))) if a.size else None


def wape(actual: np.ndarray, point: np.ndarray) -> float | None:
    """Sum of absolute errors over the sum of actuals (robust to zero actuals, unlike MAPE)."""
    a, f = _valid(actual, point)
    total = np.sum(np.abs(a))
    return _finite(np.sum(np.abs(a - f)) / total) if a.size and total > 0 else None


def mape(actual: np.ndarray, point: np.ndarray) -> float | None:
    """Mean absolute percentage error over the non-zero actuals only."""
    a, f = _valid(actual, point)
    nz = a != 0
    return _finite(np.mean(np.abs(a[nz] - f[nz]) / np.abs(a[nz]))) if nz.any() else None


def naive_scale(history: np.ndarray) -> float | None:
    """In-sample MAE of the one-step naive forecast (last value): the MASE denominator."""
    h = np.asarray(history, dtype=float)
    d = np.abs(np.diff(h))
    d = d[np.isfinite(d)]
    return float(np.mean(d)) if d.size and np.mean(d) > 0 else None


def mase(actual: np.ndarray, point: np.ndarray, scale: float | None) -> float | None:
    """MAE divided by :func:`naive_scale` of the training history (< 1 beats naive in-sample)."""
    m = mae(actual, point)
    return _finite(m / scale) if m is not None and scale else None


def pinball_losses(actual: np.ndarray, forecast: np.ndarray, q: float) -> np.ndarray:
    """Pinball (quantile) loss of the ``q``-quantile forecast per pair, elementwise (NaN stays NaN)."""
    diff = np.asarray(actual, dtype=float) - np.asarray(forecast, dtype=float)
    return np.maximum(q * diff, (q - 1.0) * diff)


def pinball(actual: np.ndarray, upper: np.ndarray, q: float) -> float | None:
    """Mean pinball (quantile) loss of the ``q``-quantile forecast; lower is better."""
    a, f = _valid(actual, upper)
    if not a.size:
        return None
    return _finite(np.mean(pinball_losses(a, f, q)))


def normalised_pinball(actual: np.ndarray, upper: np.ndarray, q: float) -> float | None:
    """:func:`pinball` divided by the mean actual over the same pairs: comparable across traces."""
    a, f = _valid(actual, upper)
    p = pinball(a, f, q)
    level = float(np.mean(a)) if a.size else 0.0
    return _finite(p / level) if p is not None and level > 0 else None


def coverage(actual: np.ndarray, upper: np.ndarray) -> float | None:
    """Share of actuals at or below the quantile forecast (≈ q for a calibrated q-quantile)."""
    a, f = _valid(actual, upper)
    return float(np.mean(a <= f)) if a.size else None


METRIC_NAMES: tuple[str, ...] = ("mae", "wape", "mape", "mase", "pinball", "normalised_pinball", "coverage")


def all_metrics(
    actual: np.ndarray, point: np.ndarray, upper: np.ndarray, q: float, scale: float | None
) -> dict[str, float | None]:
    return {
        "mae": mae(actual, point),
        "wape": wape(actual, point),
        "mape": mape(actual, point),
        "mase": mase(actual, point, scale),
        "pinball": pinball(actual, upper, q),
        "normalised_pinball": normalised_pinball(actual, upper, q),
        "coverage": coverage(actual, upper),
    }


def grouped_ratio_draws(
    numerator: np.ndarray, denominator: np.ndarray, *, resamples: int = 2000, seed: int = 0
) -> np.ndarray | None:
    """``resamples`` draws of ``sum(numerator) / sum(denominator)`` with whole groups resampled.

    ``numerator[g]`` and ``denominator[g]`` are one group's sums (a day's pinball of two sides at
    the same origins, or a day's hits and origins for coverage). Errors within a day move together,
    so days, not origins, are drawn with replacement (a paired block bootstrap: both sides keep
    the same days). None for fewer than two groups or a draw whose denominator is not positive.
    """
    num = np.asarray(numerator, dtype=float)
    den = np.asarray(denominator, dtype=float)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"per-group sums {num.shape} and {den.shape} must be one-dimensional and alike")
    if num.size < 2 or not (np.isfinite(num).all() and np.isfinite(den).all()):
        return None
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(num.size, np.full(num.size, 1.0 / num.size), size=resamples)
    bottom = counts @ den
    if np.any(bottom <= 0):
        return None
    return np.asarray((counts @ num) / bottom, dtype=float)


def _percentile_interval(draws: np.ndarray, level: float) -> tuple[float, float]:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level {level} must be inside (0, 1)")
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(draws, [tail, 1.0 - tail])
    return float(lo), float(hi)


def grouped_ratio_interval(
    numerator: np.ndarray, denominator: np.ndarray, *, level: float = 0.9, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile interval of :func:`grouped_ratio_draws` (None where the draws are)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level {level} must be inside (0, 1)")
    draws = grouped_ratio_draws(numerator, denominator, resamples=resamples, seed=seed)
    return None if draws is None else _percentile_interval(draws, level)


def geometric_mean_interval(
    per_series: Sequence[tuple[np.ndarray, np.ndarray]], *, level: float = 0.9, resamples: int = 2000
) -> tuple[float, float] | None:
    """Interval of the geometric mean over series of their ratios, each series' days resampled
    on its own (independent draws, seeded by position); None if any series' draws are undefined."""
    draws = [grouped_ratio_draws(num, den, resamples=resamples, seed=k) for k, (num, den) in enumerate(per_series)]
    if not draws or any(d is None or np.any(d <= 0) for d in draws):
        return None
    logs = np.log(np.vstack([d for d in draws if d is not None]))
    return _percentile_interval(np.exp(logs.mean(axis=0)), level)
