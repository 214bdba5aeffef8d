"""The log scale every forecaster here models demand on, and shared residual quantiles.

Demand is multiplicative (a burst doubles traffic, it does not add a constant),
so models work on ``log(x + c)``. The offset ``c`` keeps zeros finite (one
trace has 59 % zero bins) and is relative to the series' own scale, so the
transform means the same for requests per minute and tweets per 5 minutes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from predictive_scaler.errors import ModelError

#: Probabilities at which empirical residual distributions are stored (interpolated between).
RESIDUAL_GRID: tuple[float, ...] = (
    0.001, 0.005, *(round(0.01 * i, 2) for i in range(1, 100)), 0.995, 0.999,
)


def choose_log_offset(values: np.ndarray) -> float:
    """A tenth of the median positive value: zeros stay finite without flattening small counts."""
    finite = values[np.isfinite(values) & (values > 0)]
    if finite.size == 0:
        return 1.0
    return float(max(0.1 * np.median(finite), 1e-9))


def to_log(values: np.ndarray, offset: float) -> np.ndarray:
    return np.log(np.maximum(np.asarray(values, dtype=float), 0.0) + offset)


def observed_log(values: np.ndarray, offset: float) -> np.ndarray:
    """:func:`to_log` of observations, every non-finite value (a gap) NaN rather than a number."""
    values = np.asarray(values, dtype=float)
    return np.where(np.isfinite(values), to_log(values, offset), np.nan)


def from_log(values: np.ndarray, offset: float) -> np.ndarray:
    # Clip before exp so a wild quantile cannot overflow to inf.
    return np.maximum(np.exp(np.minimum(values, 700.0)) - offset, 0.0)


def residual_quantiles(residuals: np.ndarray) -> list[float]:
    """The empirical quantiles of ``residuals`` on :data:`RESIDUAL_GRID`."""
    r = residuals[np.isfinite(residuals)]
    if r.size < 10:
        raise ModelError(
            f"only {r.size} usable residuals to estimate forecast spread; supply a longer history with "
            "fewer gaps"
        )
    return [float(v) for v in np.quantile(r, RESIDUAL_GRID)]


def interpolate_quantiles(grid_values: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Values at ``quantiles`` from rows stored on :data:`RESIDUAL_GRID`.

    ``grid_values`` has shape (h, len(RESIDUAL_GRID)); the result has shape (k, h).
    """
    grid = np.asarray(RESIDUAL_GRID)
    return np.array([[np.interp(q, grid, row) for row in grid_values] for q in quantiles])
