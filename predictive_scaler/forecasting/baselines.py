"""Baselines users compare against: persistence, seasonal naive, damped Holt-Winters.

All three forecast on the log scale (:mod:`logscale`) and take their spread
from empirical residuals per horizon step measured on the training history,
stored as quantiles on a fixed probability grid (no distributional guess).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting.ets_likelihood import seasonal_ets
from predictive_scaler.forecasting.logscale import (
    RESIDUAL_GRID,
    choose_log_offset,
    from_log,
    interpolate_quantiles,
    observed_log,
    residual_quantiles,
)
from predictive_scaler.forecasting.walkforward import (
    WalkForwardModel,
    check_origins,
    max_horizon_steps,
    memoized_fit,
    shared,
)
from predictive_scaler.series import Series

DAY = 86400


def forward_fill(values: np.ndarray) -> np.ndarray:
    """Last valid value at or before each step (NaN before the first one)."""
    ok = np.isfinite(values)
    pos = np.where(ok, np.arange(values.size), -1)
    np.maximum.accumulate(pos, out=pos)
    out = np.where(pos >= 0, values[np.maximum(pos, 0)], np.nan)
    return out


def _future_log_actuals(logy: np.ndarray, horizon: int) -> np.ndarray:
    """(n, horizon) array of log values 1..horizon steps after each step (NaN past the end)."""
    n = logy.size
    out = np.full((n, horizon), np.nan)
    for h in range(1, horizon + 1):
        out[: n - h, h - 1] = logy[h:]
    return out


def _spread_from(point_log: np.ndarray, actual_log: np.ndarray) -> list[list[float]]:
    return [residual_quantiles(actual_log[:, h] - point_log[:, h]) for h in range(point_log.shape[1])]


def _check_spread(kind: str, spread: Any, step_seconds: int) -> tuple[tuple[float, ...], ...]:
    rows = tuple(tuple(float(v) for v in row) for row in spread)
    if not rows or any(len(r) != len(RESIDUAL_GRID) for r in rows):
        raise ModelError(f"{kind} residual spread has the wrong shape; retrain the model")
    if not all(math.isfinite(v) for r in rows for v in r):
        raise ModelError(f"{kind} parameters contain non-finite numbers; retrain the model")
    return rows


@dataclass(frozen=True)
class _SpreadModel(WalkForwardModel):
    """Log point forecast + empirical residual quantiles per horizon step."""

    step_seconds: int
    log_offset: float
    spread: tuple[tuple[float, ...], ...]

    def _log_point(self, logy: np.ndarray, idx: np.ndarray, horizon: int, series: Series) -> np.ndarray:
        raise NotImplementedError

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        idx = check_origins(series, origins)
        point = shared(self, series, idx, horizon_steps, lambda: self._log_point(
            observed_log(series.values, self.log_offset), idx, horizon_steps, series))
        rows = np.asarray(self.spread)
        rows = rows[np.minimum(np.arange(horizon_steps), rows.shape[0] - 1)]  # beyond: last row
        offsets = interpolate_quantiles(rows, quantiles)  # (k, h)
        return from_log(point[:, None, :] + offsets[None, :, :], self.log_offset)

    def _common_params(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds,
            "log_offset": self.log_offset,
            "spread": [list(r) for r in self.spread],
        }

    @classmethod
    def _common_from(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        try:
            step = int(params["step_seconds"])
            offset = float(params["log_offset"])
            spread = _check_spread(cls.kind, params["spread"], step)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{cls.kind} parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if step <= 0 or not (math.isfinite(offset) and offset > 0):
            raise ModelError(f"{cls.kind} parameters are out of range; retrain the model")
        return {"step_seconds": step, "log_offset": offset, "spread": spread}


# -- persistence -----------------------------------------------------------------------------

@dataclass(frozen=True)
class PersistenceModel(_SpreadModel):
    """Tomorrow is today: the last observed value, with its historical error spread."""

    window: int = 288
    kind: ClassVar[str] = "persistence"

    @property
    def window_steps(self) -> int:
        return self.window

    def _log_point(self, logy: np.ndarray, idx: np.ndarray, horizon: int, series: Series) -> np.ndarray:
        last = forward_fill(logy)[idx]
        return np.repeat(last[:, None], horizon, axis=1)

    def to_params(self) -> dict[str, Any]:
        return {**self._common_params(), "window": self.window}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> PersistenceModel:
        common = cls._common_from(params)
        return cls(**common, window=int(params.get("window", 288)))


@dataclass
class PersistenceForecaster:
    window: float = DAY
    kind: ClassVar[str] = "persistence"

    def fit(self, history: Series) -> PersistenceModel:
        c = choose_log_offset(history.values)
        logy = observed_log(history.values, c)
        horizon = max_horizon_steps(history.step_seconds)
        point = np.repeat(forward_fill(logy)[:, None], horizon, axis=1)
        spread = _spread_from(point, _future_log_actuals(logy, horizon))
        return PersistenceModel(
            step_seconds=history.step_seconds,
            log_offset=c,
            spread=tuple(tuple(r) for r in spread),
            window=int(max(1, self.window // history.step_seconds)),
        )


# -- seasonal naive --------------------------------------------------------------------------

@dataclass(frozen=True)
class SeasonalNaiveModel(_SpreadModel):
    """The value one season ago (a day, or a week when that fitted better)."""

    season_steps: int = 288
    kind: ClassVar[str] = "seasonal-naive"

    @property
    def window_steps(self) -> int:
        return self.season_steps + 1

    def _log_point(self, logy: np.ndarray, idx: np.ndarray, horizon: int, series: Series) -> np.ndarray:
        return _seasonal_point(logy, idx, horizon, self.season_steps)

    def to_params(self) -> dict[str, Any]:
        return {**self._common_params(), "season_steps": self.season_steps}

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> SeasonalNaiveModel:
        common = cls._common_from(params)
        try:
            season = int(params["season_steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"seasonal-naive parameters lack a season ({exc!r}); retrain") from exc
        if season < 1:
            raise ModelError("seasonal-naive season must be at least one step; retrain the model")
        return cls(**common, season_steps=season)


def _seasonal_point(logy: np.ndarray, idx: np.ndarray, horizon: int, season: int) -> np.ndarray:
    """log value one season before each target step; the last value where that is missing."""
    filled = forward_fill(logy)
    target = idx[:, None] + np.arange(1, horizon + 1)[None, :] - season
    # Only steps at or before the origin are known; a horizon longer than the
    # season would need the future, so it repeats the season's last known step.
    target = np.minimum(target, idx[:, None])
    seasonal = np.where(target >= 0, logy[np.maximum(target, 0)], np.nan)
    fallback = np.repeat(filled[idx][:, None], horizon, axis=1)
    return np.where(np.isfinite(seasonal), seasonal, fallback)


@dataclass
class SeasonalNaiveForecaster:
    kind: ClassVar[str] = "seasonal-naive"

    def fit(self, history: Series) -> SeasonalNaiveModel:
        day = max(1, DAY // history.step_seconds)
        seasons = [day]
        if history.span.total_seconds() >= 14 * DAY:
            seasons.append(7 * day)
        if len(history) <= day:
            raise InsufficientHistoryError(
                f"{history.name}: seasonal naive needs more than one day of history; supply more"
            )
        c = choose_log_offset(history.values)
        logy = observed_log(history.values, c)
        horizon = max_horizon_steps(history.step_seconds)
        actual = _future_log_actuals(logy, horizon)
        best: tuple[float, int, np.ndarray] | None = None
        start = max(seasons)  # score every candidate on the same steps
        idx = np.arange(start, len(history))
        for season in seasons:
            point = _seasonal_point(logy, idx, horizon, season)
            err = float(np.nanmean(np.abs(actual[idx] - point)))
            if best is None or err < best[0]:
                best = (err, season, point)
        assert best is not None
        _, season, point = best
        spread = _spread_from(point, actual[idx])
        return SeasonalNaiveModel(
            step_seconds=history.step_seconds,
            log_offset=c,
            spread=tuple(tuple(r) for r in spread),
            season_steps=season,
        )


# -- damped Holt-Winters ---------------------------------------------------------------------

def _phase(series: Series, season: int) -> np.ndarray:
    """Absolute position in the season of each step, so a profile fits any window."""
    first = int(series.start.timestamp()) // series.step_seconds
    return (first + np.arange(len(series))) % season


@dataclass(frozen=True)
class HoltWintersModel(_SpreadModel):
    """Additive damped-trend Holt-Winters on the log scale with a daily season.

    Parameters come from statsmodels' ETS fit; the recursion (error-correction
    form) is run here so that a forecast re-derives the state from the recent
    window, starting from the stored seasonal profile.

    The window a forecast at step ``t`` reads starts at an *anchor*: the first
    step at or after ``t + 1 - window`` on an absolute grid of
    :data:`HW_ANCHOR_SECONDS` (between ``window - anchor + 1`` and ``window``
    steps). It depends only on absolute time, never on how much history the
    caller handed over, so serving (one origin, the recent window) and
    evaluation (many origins, all history) are the same numbers, and the
    origins sharing an anchor share one pass of the recursion.
    """

    alpha: float = 0.3
    beta: float = 0.0
    gamma: float = 0.1
    phi: float = 0.9
    profile: tuple[float, ...] = field(default=())
    window: int = 864
    kind: ClassVar[str] = "holt-winters"

    @property
    def window_steps(self) -> int:
        return self.window

    def _log_point(self, logy: np.ndarray, idx: np.ndarray, horizon: int, series: Series) -> np.ndarray:
        phase = _phase(series, len(self.profile))
        starts = _anchored_starts(series, idx, self.window)
        # The model's identity for continuing passes: its parameters and the absolute step grid.
        key = (self.step_seconds, self.alpha, self.beta, self.gamma, self.phi, self.profile)
        first = int(series.start.timestamp()) // series.step_seconds
        out = np.empty((idx.size, horizon))
        for start in np.unique(starts):  # one pass of the recursion per anchor
            rows = np.flatnonzero(starts == start)
            last = int(idx[rows].max()) + 1
            level, trend, season_after = HW_RESUME.filter(
                (*key, first + int(start)), logy[start:last], phase[start:last],
                self.profile, self.alpha, self.beta, self.gamma, self.phi,
            )
            out[rows] = _hw_point(level, trend, season_after, idx[rows] - start, horizon, phase[start:],
                                  self.profile, self.phi, last - start)
        return out

    def to_params(self) -> dict[str, Any]:
        return {
            **self._common_params(),
            "alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "phi": self.phi,
            "profile": list(self.profile), "window": self.window,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> HoltWintersModel:
        common = cls._common_from(params)
        try:
            smoothing = [float(params[k]) for k in ("alpha", "beta", "gamma", "phi")]
            profile = tuple(float(v) for v in params["profile"])
            window = int(params["window"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"holt-winters parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if not all(math.isfinite(v) for v in (*smoothing, *profile)) or not profile:
            raise ModelError("holt-winters parameters contain non-finite numbers; retrain the model")
        alpha, beta, gamma, phi = smoothing
        return cls(**common, alpha=alpha, beta=beta, gamma=gamma, phi=phi, profile=profile, window=window)


#: Holt-Winters forecasts re-derive their state from a window starting on this absolute grid.
HW_ANCHOR_SECONDS = 6 * 3600


def _anchored_starts(series: Series, idx: np.ndarray, window: int) -> np.ndarray:
    """Per origin, the index in ``series`` where its recursion starts: the first step at or after
    ``origin + 1 - window`` on the absolute anchor grid (clipped to the series start)."""
    every = max(1, HW_ANCHOR_SECONDS // series.step_seconds)
    first = int(series.start.timestamp()) // series.step_seconds  # absolute index of series[0]
    earliest = first + idx + 1 - window
    anchor = -(-earliest // every) * every  # ceil to the grid
    return np.clip(anchor - first, 0, idx)  # never after the origin itself


@dataclass(frozen=True)
class _HWRun:
    """One finished pass of the recursion: what it read, what it produced, and its final state."""

    observed: np.ndarray
    level: np.ndarray
    trend: np.ndarray
    season_after: np.ndarray
    final_level: float
    final_trend: float
    final_season: tuple[float, ...]


def _hw_filter(
    logy: np.ndarray, phase: np.ndarray, profile: Sequence[float],
    alpha: float, beta: float, gamma: float, phi: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the recursion; returns level, trend and the updated seasonal value after each step."""
    run = _hw_pass(logy, phase, profile, alpha, beta, gamma, phi)
    return run.level, run.trend, run.season_after


def _hw_pass(
    logy: np.ndarray, phase: np.ndarray, profile: Sequence[float],
    alpha: float, beta: float, gamma: float, phi: float,
) -> _HWRun:
    """The recursion from the stored profile over ``logy``; it starts at the first observed step."""
    n = logy.size
    level_out = np.full(n, np.nan)
    trend_out = np.zeros(n)
    season_after = np.full(n, np.nan)
    season = list(profile)
    first = np.flatnonzero(np.isfinite(logy))
    level, trend = math.nan, 0.0  # not started: nothing observed yet
    if first.size:
        start = int(first[0])
        levels, trends, seasons, level, trend = _hw_steps(
            logy[start:].tolist(), phase[start:].tolist(), float(logy[start]) - season[int(phase[start])], 0.0,
            season, alpha, beta, gamma, phi)
        level_out[start:] = levels
        trend_out[start:] = trends
        season_after[start:] = seasons
    return _HWRun(observed=logy.copy(), level=level_out, trend=trend_out, season_after=season_after,
                  final_level=level, final_trend=trend, final_season=tuple(season))


def _hw_steps(
    y: list[float], ph: list[int], level: float, trend: float, season: list[float],
    alpha: float, beta: float, gamma: float, phi: float,
) -> tuple[list[float], list[float], list[float], float, float]:
    """The recursion over ``y`` from a state (``season`` is updated in place): per step level,
    trend and the seasonal value after it, then the final level and trend."""
    levels, trends, seasons = [], [], []  # Python lists: a numpy item store per step costs more than the step
    for p, v in zip(ph, y, strict=True):
        predicted = level + phi * trend
        err = v - predicted - season[p] if v == v else 0.0  # NaN: no update
        level = predicted + alpha * err
        trend = phi * trend + beta * err
        after = season[p] + gamma * err
        season[p] = after
        levels.append(level)
        trends.append(trend)
        seasons.append(after)
    return levels, trends, seasons, level, trend


class _HWResume:
    """Passes of the recursion kept for continuation: a forecast a minute after the last one reads
    the same anchored window plus one new observation, so it runs one step, not a window's worth
    (the recursion is sequential, so the continued pass is the same floating-point sequence as a
    pass from the anchor). A pass is continued only when the values it read are, exactly (NaN
    included), the start of the new ones: a late or corrected sample re-runs the pass from the
    anchor. Least recently used passes are forgotten beyond ``capacity``."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._runs: OrderedDict[tuple[Any, ...], _HWRun] = OrderedDict()
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()

    def filter(
        self, key: tuple[Any, ...], logy: np.ndarray, phase: np.ndarray, profile: Sequence[float],
        alpha: float, beta: float, gamma: float, phi: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As :func:`_hw_filter`; ``key`` names the model and the absolute anchor."""
        with self._lock:
            run = self._runs.get(key)
            if run is not None:
                self._runs.move_to_end(key)
        n, seen = logy.size, 0 if run is None else run.observed.size
        if run is not None and seen >= n and np.array_equal(run.observed[:n], logy, equal_nan=True):
            return run.level[:n], run.trend[:n], run.season_after[:n]
        if run is not None and np.isfinite(run.final_level) and np.array_equal(
                run.observed, logy[:seen], equal_nan=True):
            season = list(run.final_season)
            levels, trends, seasons, level, trend = _hw_steps(
                logy[seen:].tolist(), phase[seen:].tolist(), run.final_level, run.final_trend, season,
                alpha, beta, gamma, phi)
            run = _HWRun(
                observed=logy.copy(),
                level=np.concatenate((run.level, levels)),
                trend=np.concatenate((run.trend, trends)),
                season_after=np.concatenate((run.season_after, seasons)),
                final_level=level, final_trend=trend, final_season=tuple(season),
            )
        else:
            run = _hw_pass(logy, phase, profile, alpha, beta, gamma, phi)
        with self._lock:
            self._runs[key] = run
            self._runs.move_to_end(key)
            while len(self._runs) > self.capacity:
                self._runs.popitem(last=False)
        return run.level, run.trend, run.season_after


#: The passes serving continues (process-wide: models are rebuilt from JSON on every load).
HW_RESUME = _HWResume()


def _hw_point(
    level: np.ndarray, trend: np.ndarray, season_after: np.ndarray, idx: np.ndarray, horizon: int,
    phase: np.ndarray, profile: Sequence[float], phi: float, n: int,
) -> np.ndarray:
    m = len(profile)
    hs = np.arange(1, horizon + 1)
    damp = np.cumsum(phi ** hs)
    # The seasonal value for step t+h was last updated at t+h-m (if inside the window).
    prev = idx[:, None] + ((hs[None, :] - 1) % m) + 1 - m
    first_phase = phase[0] if n else 0
    prof = np.asarray(profile)
    from_profile = prof[(first_phase + prev) % m]
    seasonal = np.where(prev >= 0, season_after[np.maximum(prev, 0)], from_profile)
    seasonal = np.where(np.isfinite(seasonal), seasonal, from_profile)
    return level[idx][:, None] + trend[idx][:, None] * damp[None, :] + seasonal


@dataclass
class HoltWintersForecaster:
    window: float = 3 * DAY
    #: Seasonal period in seconds (a day by default).
    season: float = DAY
    #: Starting values of (alpha, beta, gamma, phi), e.g. last week's fit of this scaler: a warm
    #: start; None, a mismatched length or values outside ETS's bounds start cold.
    start: tuple[float, ...] | None = None
    kind: ClassVar[str] = "holt-winters"

    def fit(self, history: Series) -> HoltWintersModel:
        return memoized_fit(self, history, self._fit)

    def _start(self, count: int) -> np.ndarray | None:
        if self.start is None or len(self.start) != count:
            return None
        alpha, beta, gamma, phi = self.start
        # ETS's own bounds (beta <= alpha, gamma <= 1 - alpha, phi in [0.8, 0.98]); a start outside
        # them is a stored artifact that is not a fit of this model: start cold.
        if not (0 < alpha < 1 and 0 <= beta <= alpha and 0 <= gamma <= 1 - alpha and 0.8 <= phi <= 0.98):
            return None
        return np.asarray(self.start, dtype=float)

    def _fit(self, history: Series) -> HoltWintersModel:
        season = max(2, int(self.season // history.step_seconds))
        # Three daily cycles; a longer season needs two whole cycles to tell them apart.
        need = max(3 * max(2, DAY // history.step_seconds), 2 * season + 10)
        if len(history) < need:
            raise InsufficientHistoryError(
                f"{history.name}: Holt-Winters with a {self.season / DAY:g}-day season needs at least "
                f"{need * history.step_seconds / DAY:.1f} days of history; supply more"
            )
        c = choose_log_offset(history.values)
        logy = observed_log(history.values, c)
        ok = np.isfinite(logy)
        if ok.sum() < 2 * season:
            raise InsufficientHistoryError(f"{history.name}: too many gaps for Holt-Winters; supply more data")
        # ETS cannot take gaps: interpolate for the parameter fit only.
        filled = np.interp(np.arange(logy.size), np.flatnonzero(ok), logy[ok])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ets = seasonal_ets(filled, season)
                # Only the parameters: the results object would also smooth the series and take a
                # numerical Hessian for standard errors (two thirds of the fit's time, unused here).
                params = ets.fit(start_params=self._start(len(ets.param_names)), disp=False, maxiter=200,
                                 return_params=True)
        except (ValueError, np.linalg.LinAlgError) as exc:
            raise ModelError(f"{history.name}: Holt-Winters fit failed ({exc})") from exc
        p = dict(zip(ets.param_names, np.asarray(params, dtype=float), strict=False))
        alpha, beta = p["smoothing_level"], p["smoothing_trend"]
        gamma, phi = p["smoothing_seasonal"], p["damping_trend"]
        phase = _phase(history, season)
        # Initial profile: mean log by absolute phase minus the overall mean.
        sums = np.bincount(phase[ok], weights=logy[ok], minlength=season)
        counts = np.bincount(phase[ok], minlength=season)
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        profile0 = np.nan_to_num(means - np.nanmean(means))
        level, trend, season_after = _hw_filter(logy, phase, profile0, alpha, beta, gamma, phi)
        horizon = max_horizon_steps(history.step_seconds)
        idx = np.arange(season, len(history))  # skip the first day while the state settles
        point = _hw_point(level, trend, season_after, idx, horizon, phase, profile0, phi, len(history))
        spread = _spread_from(point, _future_log_actuals(logy, horizon)[idx])
        # The profile a forecast starts from is the seasonal state at the end of training.
        final = profile0.copy()
        for t in range(len(history)):
            if np.isfinite(season_after[t]):
                final[phase[t]] = season_after[t]
        return HoltWintersModel(
            step_seconds=history.step_seconds,
            log_offset=c,
            spread=tuple(tuple(r) for r in spread),
            alpha=float(alpha), beta=float(beta), gamma=float(gamma), phi=float(phi),
            profile=tuple(float(v) for v in final),
            window=int(max(season, self.window // history.step_seconds)),
        )
