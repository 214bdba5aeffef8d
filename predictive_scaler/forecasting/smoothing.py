"""Exponential smoothing candidates fitted by statsmodels: ``ets`` and ``mstl``.

Both are a damped additive trend on the log scale (:mod:`logscale`) whose smoothing
parameters come from statsmodels' ``ETSModel``; ``mstl`` first removes the daily (and,
on two weeks or more, weekly) seasonal components statsmodels' ``MSTL`` finds and adds
them back to the forecast, as statsforecast's MSTL does with its trend model.

They are here because the field's plain smoothers travel well: on 5-minute data
statsforecast's AutoETS fits no seasonal component (its limit is 24 steps a season), and
that non-seasonal damped ETS was the best peer on three of the seven bundled traces.
Their intervals are conformal, like every candidate's: the spread stored here is the
empirical residual quantiles of the fit, and :func:`calibration.calibrate` shifts them on
data after the fit.

As for Holt-Winters, a forecast at step ``t`` re-runs the recursion over a window that
starts on an absolute grid (:func:`baselines._anchored_starts`), so serving one origin and
evaluating many give the same numbers, and the seasonal profiles are indexed by absolute
time (never by where the caller's window starts).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting.baselines import (
    DAY,
    _anchored_starts,
    _future_log_actuals,
    _hw_filter,
    _HWResume,
    _spread_from,
    _SpreadModel,
)
from predictive_scaler.forecasting.logscale import choose_log_offset, observed_log
from predictive_scaler.forecasting.walkforward import max_horizon_steps, memoized_fit
from predictive_scaler.series import Series

#: Steps of recursion a forecast re-runs before its origin (at least; see the module doc).
WINDOW_SECONDS = DAY
#: A weekly component is fitted only on at least this much history (two whole weeks).
WEEKLY_AFTER_SECONDS = 14 * DAY
#: Passes kept for continuation (serving a minute later runs one step, not a window).
SMOOTH_RESUME = _HWResume()


def _absolute(series: Series) -> np.ndarray:
    """Each step's index on the absolute grid of its step (seconds since the epoch ÷ step)."""
    first = int(series.start.timestamp()) // series.step_seconds
    return first + np.arange(len(series))


@dataclass(frozen=True)
class _DampedModel(_SpreadModel):
    """A damped additive trend on log(x + c) minus fixed seasonal profiles."""

    alpha: float = 0.5
    beta: float = 0.0
    phi: float = 0.9
    #: Season lengths in steps and, per season, its profile by absolute phase.
    periods: tuple[int, ...] = ()
    profiles: tuple[tuple[float, ...], ...] = field(default=())
    window: int = 288

    @property
    def window_steps(self) -> int:
        return self.window

    def seasonal(self, absolute: np.ndarray) -> np.ndarray:
        out = np.zeros(absolute.shape, dtype=float)
        for m, prof in zip(self.periods, self.profiles, strict=True):
            out += np.asarray(prof)[absolute % m]
        return out

    def _log_point(self, logy: np.ndarray, idx: np.ndarray, horizon: int, series: Series) -> np.ndarray:
        absolute = _absolute(series)
        level_in = logy - self.seasonal(absolute) if self.periods else logy
        starts = _anchored_starts(series, idx, self.window)
        key = (self.kind, self.step_seconds, self.alpha, self.beta, self.phi, self.periods,
               hash(self.profiles))
        hs = np.arange(1, horizon + 1)
        damp = np.cumsum(self.phi ** hs)
        out = np.empty((idx.size, horizon))
        zeros = np.zeros(level_in.size, dtype=int)
        for start in np.unique(starts):
            rows = np.flatnonzero(starts == start)
            last = int(idx[rows].max()) + 1
            level, trend, _ = SMOOTH_RESUME.filter(
                (*key, int(absolute[0]) + int(start)), level_in[start:last], zeros[start:last], (0.0,),
                self.alpha, self.beta, 0.0, self.phi)
            rel = idx[rows] - start
            out[rows] = level[rel][:, None] + trend[rel][:, None] * damp[None, :]
        if self.periods:
            out += self.seasonal(absolute[idx][:, None] + hs[None, :])
        return out

    def _smoothing_params(self) -> dict[str, Any]:
        return {**self._common_params(), "alpha": self.alpha, "beta": self.beta, "phi": self.phi,
                "window": self.window}

    @classmethod
    def _smoothing_from(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        common = cls._common_from(params)
        try:
            alpha, beta, phi = (float(params[k]) for k in ("alpha", "beta", "phi"))
            window = int(params["window"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{cls.kind} parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if not all(math.isfinite(v) for v in (alpha, beta, phi)) or window < 1:
            raise ModelError(f"{cls.kind} smoothing parameters are out of range; retrain the model")
        return {**common, "alpha": alpha, "beta": beta, "phi": phi, "window": window}


@dataclass(frozen=True)
class EtsModel(_DampedModel):
    """Damped-trend exponential smoothing, no season (statsforecast's AutoETS on 5-minute data)."""

    kind: ClassVar[str] = "ets"

    def to_params(self) -> dict[str, Any]:
        return self._smoothing_params()

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> EtsModel:
        return cls(**cls._smoothing_from(params))


@dataclass(frozen=True)
class MstlModel(_DampedModel):
    """Daily (and weekly) seasonal profiles from MSTL plus a damped trend on what is left."""

    kind: ClassVar[str] = "mstl"

    def to_params(self) -> dict[str, Any]:
        return {**self._smoothing_params(), "periods": list(self.periods),
                "profiles": [list(p) for p in self.profiles]}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> MstlModel:
        base = cls._smoothing_from(params)
        try:
            periods = tuple(int(p) for p in params["periods"])
            profiles = tuple(tuple(float(v) for v in p) for p in params["profiles"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"mstl parameters lack their seasons ({exc!r}); retrain") from exc
        if (not periods or len(periods) != len(profiles) or any(len(p) != m for m, p in zip(periods, profiles,
                                                                                             strict=True))
                or not all(math.isfinite(v) for p in profiles for v in p)):
            raise ModelError("mstl seasonal profiles do not match their periods; retrain the model")
        return cls(**base, periods=periods, profiles=profiles)


def _filled_log(history: Series, need: int, kind: str) -> tuple[float, np.ndarray, np.ndarray]:
    if len(history) < need:
        raise InsufficientHistoryError(
            f"{history.name}: {kind} needs at least {need * history.step_seconds / DAY:.1f} days of "
            "history; supply more")
    c = choose_log_offset(history.values)
    logy = observed_log(history.values, c)
    ok = np.isfinite(logy)
    if ok.sum() < need // 2:
        raise InsufficientHistoryError(f"{history.name}: too many gaps for {kind}; supply more data")
    # statsmodels takes no gaps: interpolated for the parameter fit only.
    filled = np.interp(np.arange(logy.size), np.flatnonzero(ok), logy[ok])
    return c, logy, filled


def _damped_params(y: np.ndarray, name: str) -> tuple[float, float, float]:
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ets = ETSModel(y, error="add", trend="add", damped_trend=True, initialization_method="heuristic")
            params = ets.fit(disp=False, maxiter=100, return_params=True)
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise ModelError(f"{name}: exponential smoothing fit failed ({exc})") from exc
    p = dict(zip(ets.param_names, np.asarray(params, dtype=float), strict=False))
    return float(p["smoothing_level"]), float(p["smoothing_trend"]), float(p["damping_trend"])


def _finish(cls: type[_DampedModel], history: Series, c: float, logy: np.ndarray,
            alpha: float, beta: float, phi: float, window: int, **seasons: Any) -> _DampedModel:
    """The model with its residual spread from one continuous pass over the training data."""
    model = cls(step_seconds=history.step_seconds, log_offset=c, spread=((0.0,),), alpha=alpha, beta=beta,
                phi=phi, window=window, **seasons)
    horizon = max_horizon_steps(history.step_seconds)
    warm = min(len(history) // 4, max(1, DAY // history.step_seconds))
    idx = np.arange(warm, len(history))
    absolute = _absolute(history)
    level_in = logy - model.seasonal(absolute) if model.periods else logy
    zeros = np.zeros(level_in.size, dtype=int)
    level, trend, _ = _hw_filter(level_in, zeros, (0.0,), alpha, beta, 0.0, phi)
    hs = np.arange(1, horizon + 1)
    point = level[idx][:, None] + trend[idx][:, None] * np.cumsum(phi ** hs)[None, :]
    if model.periods:
        point += model.seasonal(absolute[idx][:, None] + hs[None, :])
    spread = _spread_from(point, _future_log_actuals(logy, horizon)[idx])
    return cls(step_seconds=history.step_seconds, log_offset=c, spread=tuple(tuple(r) for r in spread),
               alpha=alpha, beta=beta, phi=phi, window=window, **seasons)


@dataclass
class EtsForecaster:
    """Fits :class:`EtsModel`: statsmodels' damped additive-trend ETS on the log scale."""

    window: float = WINDOW_SECONDS
    kind: ClassVar[str] = "ets"

    def fit(self, history: Series) -> EtsModel:
        return memoized_fit(self, history, self._fit)

    def _fit(self, history: Series) -> EtsModel:
        need = max(20, DAY // history.step_seconds)
        c, logy, filled = _filled_log(history, need, "ets")
        alpha, beta, phi = _damped_params(filled, history.name)
        window = int(max(need, self.window // history.step_seconds))
        model = _finish(EtsModel, history, c, logy, alpha, beta, phi, window)
        assert isinstance(model, EtsModel)
        return model


#: MSTL decomposes the series averaged to this step (when the grid is finer and divides it),
#: and the profiles are interpolated back to the grid: on 21 days at 5 minutes a day-and-week
#: MSTL took 5.4 s CPU, on hourly means 0.08 s, and the within-hour shape of a daily profile is
#: noise at the horizons served.
SEASON_STEP_SECONDS = 3600


def _mstl_profiles(filled: np.ndarray, absolute: np.ndarray, step: int, periods: Sequence[int],
                   name: str) -> tuple[list[int], list[tuple[float, ...]]]:
    """The periods (in grid steps) kept and, per period, the seasonal profile by absolute phase:
    the last whole season of statsmodels' MSTL components (MSTL extends its last season
    forward), centred. A period MSTL cannot fit (two whole seasons or fewer) is dropped."""
    from statsmodels.tsa.seasonal import MSTL

    k = SEASON_STEP_SECONDS // step if step < SEASON_STEP_SECONDS and SEASON_STEP_SECONDS % step == 0 else 1
    lead = int((-absolute[0]) % k)  # coarse bins start on the absolute grid of the coarse step
    usable = (filled.size - lead) // k * k
    coarse = filled[lead: lead + usable].reshape(-1, k).mean(axis=1)
    c_abs = (absolute[lead] // k) + np.arange(coarse.size)
    periods = [m for m in periods if 2 * max(2, m // k) < coarse.size]  # MSTL drops the others
    if not periods:
        raise InsufficientHistoryError(f"{name}: mstl needs more than two whole days of history; supply more")
    c_periods = [max(2, m // k) for m in periods]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = MSTL(coarse, periods=c_periods if len(c_periods) > 1 else c_periods[0]).fit()
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise ModelError(f"{name}: MSTL fit failed ({exc})") from exc
    seasonal = np.asarray(fitted.seasonal, dtype=float).reshape(coarse.size, -1)
    out = []
    for j, (m, mc) in enumerate(zip(periods, c_periods, strict=True)):
        prof_c = np.zeros(mc)
        tail = slice(coarse.size - mc, coarse.size)
        prof_c[c_abs[tail] % mc] = seasonal[tail, j]
        # A coarse value is the mean over its bin: placed at the bin's centre, interpolated
        # periodically onto the grid's phases.
        fine_pos = (np.arange(m) + 0.5) / k - 0.5
        prof = np.interp(fine_pos, np.arange(mc), prof_c, period=mc)
        out.append(tuple(float(v) for v in prof - prof.mean()))
    return list(periods), out


@dataclass
class MstlForecaster:
    """Fits :class:`MstlModel`: statsmodels' MSTL (a day, and a week on two weeks or more),
    then damped ETS on the deseasonalised log series."""

    window: float = WINDOW_SECONDS
    kind: ClassVar[str] = "mstl"

    def fit(self, history: Series) -> MstlModel:
        return memoized_fit(self, history, self._fit)

    def _fit(self, history: Series) -> MstlModel:
        day = max(2, DAY // history.step_seconds)
        need = 2 * day + 10
        c, logy, filled = _filled_log(history, need, "mstl")
        periods = [day]
        if history.span.total_seconds() >= WEEKLY_AFTER_SECONDS and len(history) >= 2 * 7 * day:
            periods.append(7 * day)
        periods, profiles = _mstl_profiles(filled, _absolute(history), history.step_seconds, periods, history.name)
        seasonal = np.column_stack([np.asarray(p)[_absolute(history) % m] for m, p in zip(periods, profiles,
                                                                                          strict=True)])
        deseason = filled - seasonal.sum(axis=1)
        alpha, beta, phi = _damped_params(deseason, history.name)
        window = int(max(day, self.window // history.step_seconds))
        model = _finish(MstlModel, history, c, logy, alpha, beta, phi, window,
                        periods=tuple(periods), profiles=tuple(profiles))
        assert isinstance(model, MstlModel)
        return model

