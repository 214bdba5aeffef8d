"""The additive Holt-Winters likelihood in O(n), for statsmodels' own ETS fit.

statsmodels' ``ETSModel`` smooths ETS(A,Ad,A) one step at a time and copies every
seasonal state at every step: O(n·m) for a season of m steps. A weekly season at
5 minutes has m = 2,016, so one likelihood of three weeks moves 12 million numbers
(about 4 ms, eight times a daily season's), and the fit evaluates it a hundred times.

The recursion is linear, and the season only looks back m steps, so within one
season's block of steps the seasonal values it reads are known from the block before.
What is left inside a block is the level and the damped trend: a two-state linear
filter of the deseasonalised observations, which :func:`scipy.signal.lfilter` runs
in C. The seasonal values the block writes follow in one vector step. The errors
are the same as statsmodels' loop up to rounding (a test compares them), at a cost
of a few array operations per block instead of a pass over every state.

:func:`seasonal_ets` builds the model: statsmodels' ``ETSModel`` (its heuristic
initial states, bounds, start values and optimiser untouched) whose internal
likelihood is computed here when the season is long enough for that to pay.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from scipy.signal import lfilter


def seasonal_ets_errors(
    y: np.ndarray, alpha: float, beta_star: float, gamma_star: float, phi: float,
    level: float, trend: float, season: np.ndarray,
) -> np.ndarray:
    """One-step errors y_t - ŷ_t of ETS(A,Ad,A) in statsmodels' parametrisation.

    ``season`` holds the m seasonal values read by steps 0..m-1 (s_{t-m}, oldest first);
    ``level`` and ``trend`` are the states before step 0. The recursion (statsmodels'):
    ŷ_t = l + φb + s_{t-m}; l' = α(y_t - s_{t-m}) + (1-α)(l + φb); b' = β*(l' - l) + (1-β*)φb;
    s_t = γ*(y_t - l') + (1-γ*)s_{t-m}.
    """
    y = np.asarray(y, dtype=float)
    read = np.asarray(season, dtype=float).copy()
    m, n = read.size, y.size
    # State v = (l, b): v_t = A v_{t-1} + g x_t, x_t = y_t - s_{t-m}. Its two outputs share the
    # denominator det(I - A z^-1) = 1 - tr(A) z^-1 + det(A) z^-2.
    a11, a12 = 1.0 - alpha, (1.0 - alpha) * phi
    a21, a22 = -alpha * beta_star, phi * (1.0 - alpha * beta_star)
    den = np.array([1.0, -(a11 + a22), a11 * a22 - a12 * a21])
    num_level = np.array([alpha, alpha * phi * (beta_star - 1.0)])
    num_trend = np.array([alpha * beta_star, -alpha * beta_star])
    det = den[2]
    errors = np.empty(n)
    for start in range(0, n, m):
        stop = min(n, start + m)
        k = stop - start
        x = y[start:stop] - read[:k]
        # The filters' initial conditions (transposed direct form) that continue from state (l, b).
        lv, _ = lfilter(num_level, den, x, zi=[a11 * level + a12 * trend, -det * level])
        tr, _ = lfilter(num_trend, den, x, zi=[a21 * level + a22 * trend, -det * trend])
        before_l = np.concatenate(([level], lv[:-1]))
        before_b = np.concatenate(([trend], tr[:-1]))
        errors[start:stop] = y[start:stop] - (before_l + phi * before_b + read[:k])
        read[:k] = gamma_star * (y[start:stop] - lv) + (1.0 - gamma_star) * read[:k]
        level, trend = float(lv[-1]), float(tr[-1])
    return errors


#: Seasons of at least this many steps take the block likelihood; shorter ones keep statsmodels'
#: own loop, which costs as much there (one likelihood of three weeks at 5 minutes, measured:
#: 288 steps 0.45 ms in statsmodels' loop, 0.44 ms in blocks; 500 steps 0.93 against 0.26;
#: 2,016 steps 4.1 against 0.12).
BLOCKS_FROM_SEASON = 400


def seasonal_ets(endog: np.ndarray, season: int) -> Any:
    """statsmodels' ETS(A,Ad,A) with heuristic initial states on ``endog`` (no gaps); from
    :data:`BLOCKS_FROM_SEASON` steps a season on, its fit evaluates the likelihood with
    :func:`seasonal_ets_errors`."""
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel

    model = ETSModel if season < BLOCKS_FROM_SEASON else _block_ets()
    return model(endog, error="add", trend="add", damped_trend=True, seasonal="add", seasonal_periods=season,
                 initialization_method="heuristic")


@functools.cache
def _block_ets() -> Any:
    """statsmodels' ``ETSModel`` whose internal likelihood is :func:`seasonal_ets_errors` (built once,
    on first use: statsmodels is imported only when a fit needs it)."""
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel

    class BlockETSModel(ETSModel):  # type: ignore[misc]
        def _loglike_internal(self, params: np.ndarray, yhat: np.ndarray, xhat: np.ndarray,
                              is_fixed: np.ndarray | None = None, fixed_values: np.ndarray | None = None,
                              use_beta_star: bool = False, use_gamma_star: bool = False) -> float:
            if np.iscomplexobj(params) or is_fixed is None or fixed_values is None:
                return float(super()._loglike_internal(params, yhat, xhat, is_fixed, fixed_values,
                                                       use_beta_star, use_gamma_star))
            full = np.array(fixed_values, dtype=float)
            free = ~np.asarray(is_fixed, dtype=bool)
            full[free] = params
            alpha, beta, gamma, phi = full[:4]
            beta_star = beta if use_beta_star else beta / alpha
            gamma_star = gamma if use_gamma_star else gamma / (1.0 - alpha)
            # statsmodels orders the initial season newest first: s[-1], ..., s[-m].
            err = seasonal_ets_errors(self.endog, alpha, beta_star, gamma_star, phi, full[4], full[5],
                                      full[6:][::-1])
            return float(-self.nobs / 2 * (np.log(2 * np.pi * np.mean(err ** 2)) + 1))

    return BlockETSModel
