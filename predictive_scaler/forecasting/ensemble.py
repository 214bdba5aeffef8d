"""A forecast combination: members' medians averaged on the log scale with learned weights.

Combinations routinely beat each member: at 10–30 minutes persistence knows
the current level (it follows a news burst within one step), ARIMA and
Holt-Winters know the daily and weekly shape. :class:`EnsembleForecaster`
learns one non-negative weight vector per horizon step (summing to one) on
data its members were *not* fitted on: it fits the members on all but the
last ``validation`` of history, forecasts that tail walk-forward, picks the
weights there, then refits the members on the whole history (in a training run,
those refits of the arima and holt-winters candidates on the candidates' own window
are the candidates' fits: :func:`~predictive_scaler.forecasting.walkforward.memoized_fit`,
so they are not paid twice). The spread is the
empirical quantiles of those out-of-sample residuals per horizon step, and the
conformal calibration (:mod:`calibration`) adjusts it again on later data, as
for every other kind.

The weights minimise the pinball loss of the *target* quantile once each
weight vector's own residual quantile is added (what the calibrated P95 will
be), not the median's error: a combination that follows bursts sooner can win
the P95 while losing the median (nab_twitter_aapl).

Only parameters are kept (members' parameters nested, weights, spread), so a
forecast depends only on the artifact and the observations: restart-safe.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import InsufficientHistoryError, ModelError, ScalerError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.logscale import (
    RESIDUAL_GRID,
    choose_log_offset,
    from_log,
    interpolate_quantiles,
    observed_log,
    residual_quantiles,
)
from predictive_scaler.forecasting.metrics import pinball_losses
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    WalkForwardModel,
    check_origins,
    max_horizon_steps,
    walk_forward,
)
from predictive_scaler.series import Series

DAY = 86400
WEEK = 7 * DAY

#: Members by default: the seasonal shape (regression + ARIMA; exponential smoothing over a
#: day and over a week) and the current level.
DEFAULT_MEMBERS: tuple[str, ...] = ("arima", "holt-winters", "holt-winters-weekly", "persistence")
#: Member names that are not plain registry kinds: name -> (registry kind, forecaster options).
MEMBER_RECIPES: dict[str, tuple[str, dict[str, Any]]] = {
    "holt-winters-weekly": ("holt-winters", {"season": WEEK}),
}
#: Weights are searched on a simplex grid of this resolution (exhaustive, deterministic).
WEIGHT_RESOLUTION = 10
#: Held-out tail the weights are learned on: a quarter of history, between these bounds.
MIN_VALIDATION = DAY // 2
MAX_VALIDATION = 7 * DAY
#: The pinball the weights are chosen for (the planner's P95).
DEFAULT_TARGET_QUANTILE = 0.95


def simplex_grid(members: int, resolution: int = WEIGHT_RESOLUTION) -> np.ndarray:
    """Every weight vector of ``members`` non-negative multiples of 1/resolution summing to one."""
    rows = [c for c in itertools.product(range(resolution + 1), repeat=members - 1) if sum(c) <= resolution]
    grid = np.array([[*c, resolution - sum(c)] for c in rows], dtype=float) / resolution
    return grid


def combine(member_logs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted mean over members (axis 1) of (n, m, h) log medians with (h, m) weights.

    A member with no forecast at an origin (NaN) is left out and the others' weights are
    renormalised; with none left the result is NaN.
    """
    ok = np.isfinite(member_logs)
    w = np.where(ok, weights.T[None, :, :], 0.0)  # (n, m, h)
    total = w.sum(axis=1)
    summed = np.where(ok, member_logs, 0.0) * w
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, summed.sum(axis=1) / np.where(total > 0, total, 1.0), np.nan)


def choose_weights(
    member_logs: np.ndarray, actual_log: np.ndarray, log_offset: float, quantile: float,
    resolution: int = WEIGHT_RESOLUTION,
) -> np.ndarray:
    """(h, m) weights: per horizon step, the grid vector whose shifted combination has the least
    pinball loss at ``quantile`` in demand units.

    ``member_logs`` is (n, m, h), ``actual_log`` (n, h). Each candidate's combination is
    shifted by its own residual ``quantile`` (a stand-in for the conformal calibration that
    follows), so the search ranks weights by the loss the calibrated quantile would have.
    """
    n, m, h_max = member_logs.shape
    grid = simplex_grid(m, resolution)  # (g, m)
    weights = np.empty((h_max, m))
    for h in range(h_max):
        rows = np.isfinite(actual_log[:, h]) & np.all(np.isfinite(member_logs[:, :, h]), axis=1)
        if rows.sum() < 10:
            weights[h] = 1.0 / m
            continue
        logs = member_logs[rows, :, h] @ grid.T  # (n_ok, g)
        y = actual_log[rows, h][:, None]
        shift = np.quantile(y - logs, quantile, axis=0)  # (g,)
        actual = from_log(y, log_offset)
        loss = pinball_losses(actual, from_log(logs + shift[None, :], log_offset), quantile).mean(axis=0)
        # Ties (e.g. identical members) go to the first grid row: deterministic.
        weights[h] = grid[int(np.argmin(loss))]
    return weights


@dataclass(frozen=True, eq=False)
class EnsembleModel(WalkForwardModel):
    """Members' log medians combined with per-horizon-step weights, plus a residual spread."""

    step_seconds: int
    members: tuple[FittedModel, ...]
    #: weights[h][m]: weight of member m at horizon step h + 1 (rows sum to one).
    weights: tuple[tuple[float, ...], ...]
    log_offset: float
    #: spread[h]: out-of-sample log residual quantiles on RESIDUAL_GRID at horizon step h + 1.
    spread: tuple[tuple[float, ...], ...]
    kind: ClassVar[str] = "ensemble"

    def __post_init__(self) -> None:
        if not self.members:
            raise ModelError("an ensemble needs at least one member; retrain the model")
        if not self.weights or any(len(row) != len(self.members) for row in self.weights):
            raise ModelError("ensemble weights do not match its members; retrain the model")
        if not self.spread or any(len(row) != len(RESIDUAL_GRID) for row in self.spread):
            raise ModelError("ensemble residual spread has the wrong shape; retrain the model")

    @property
    def window_steps(self) -> int:
        return max(int(getattr(m, "window_steps", DEFAULT_WINDOW_STEPS)) for m in self.members)

    @property
    def member_kinds(self) -> tuple[str, ...]:
        return tuple(m.kind for m in self.members)

    def log_median(self, series: Series, origins: np.ndarray, horizon_steps: int) -> np.ndarray:
        """(n, h) combined log medians at ``origins``."""
        member_logs = _member_log_medians(self.members, series, origins, horizon_steps, self.log_offset)
        table = np.asarray(self.weights)
        rows = table[np.minimum(np.arange(horizon_steps), table.shape[0] - 1)]  # beyond: last row
        return combine(member_logs, rows)

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        idx = check_origins(series, origins)
        point = self.log_median(series, idx, horizon_steps)
        rows = np.asarray(self.spread)
        rows = rows[np.minimum(np.arange(horizon_steps), rows.shape[0] - 1)]
        offsets = interpolate_quantiles(rows, quantiles)  # (k, h)
        out = from_log(point[:, None, :] + offsets[None, :, :], self.log_offset)
        return np.where(np.isfinite(point)[:, None, :], out, np.nan)

    def to_params(self) -> dict[str, Any]:
        return {
            "step_seconds": self.step_seconds,
            "members": [{"kind": m.kind, "params": m.to_params()} for m in self.members],
            "weights": [list(row) for row in self.weights],
            "log_offset": self.log_offset,
            "spread": [list(row) for row in self.spread],
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> EnsembleModel:
        from predictive_scaler.forecasting.registry import model_from_params

        try:
            step = int(params["step_seconds"])
            kinds = [str(m["kind"]) for m in params["members"]]
            member_params = [dict(m["params"]) for m in params["members"]]
            weights = tuple(tuple(float(v) for v in row) for row in params["weights"])
            log_offset = float(params["log_offset"])
            spread = tuple(tuple(float(v) for v in row) for row in params["spread"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"ensemble parameters are incomplete or malformed ({exc!r}); retrain") from exc
        for kind in kinds:
            if kind in (cls.kind, "calibrated"):
                raise ModelError(f"an ensemble cannot contain a {kind!r} model; retrain the model")
        numbers = (*(v for row in weights for v in row), *(v for row in spread for v in row), log_offset)
        if not all(math.isfinite(v) for v in numbers):
            raise ModelError("ensemble parameters contain non-finite numbers; retrain the model")
        if step <= 0 or log_offset <= 0 or any(v < 0 for row in weights for v in row):
            raise ModelError("ensemble parameters are out of range; retrain the model")
        if any(abs(sum(row) - 1.0) > 1e-6 for row in weights):
            raise ModelError("ensemble weights must sum to one per horizon step; retrain the model")
        members = tuple(model_from_params(kind, p) for kind, p in zip(kinds, member_params, strict=True))
        if any(m.step_seconds != step for m in members):
            raise ModelError("ensemble members were trained at another step than the ensemble; retrain")
        return cls(step_seconds=step, members=members, weights=weights, log_offset=log_offset, spread=spread)


def _member_log_medians(
    members: Sequence[FittedModel], series: Series, origins: np.ndarray, horizon_steps: int, log_offset: float
) -> np.ndarray:
    """(n, m, h) log medians of each member; NaN where a member cannot forecast."""
    out = np.empty((origins.size, len(members), horizon_steps))
    for j, member in enumerate(members):
        med = walk_forward(member, series, origins, horizon_steps, (0.5,))[:, 0, :]
        out[:, j, :] = observed_log(med, log_offset)
    return out


@dataclass
class EnsembleForecaster:
    """Fits :class:`EnsembleModel` from ``members`` (registry kinds)."""

    members: tuple[str, ...] = DEFAULT_MEMBERS
    #: Quantile whose (shifted) pinball loss the weights minimise.
    quantile: float = DEFAULT_TARGET_QUANTILE
    resolution: int = WEIGHT_RESOLUTION
    #: Options per member name on top of its recipe (e.g. a warm start: ``{"arima": {"start": …}}``).
    member_options: Mapping[str, Mapping[str, Any]] | None = None
    kind: ClassVar[str] = "ensemble"

    def _fit_members(self, history: Series, names: Sequence[str], *, optional: bool) -> dict[str, FittedModel]:
        """Fit each named member; with ``optional`` a member that cannot be fitted here (e.g. a
        weekly season on too short a history) is left out instead of failing the ensemble."""
        from predictive_scaler.forecasting.registry import forecaster

        fitted: dict[str, FittedModel] = {}
        for name in names:
            kind, options = MEMBER_RECIPES.get(name, (name, {}))
            extra = (self.member_options or {}).get(name) or {}
            try:
                fitted[name] = forecaster(kind, **{**options, **extra}).fit(history)
            except ScalerError:
                if not optional:
                    raise
        return fitted

    def fit(self, history: Series) -> EnsembleModel:
        if not self.members or len(set(self.members)) != len(self.members):
            raise ModelError(f"ensemble members {self.members} must be distinct model kinds; list each once")
        if any(MEMBER_RECIPES.get(k, (k,))[0] in ("ensemble", "calibrated") for k in self.members):
            raise ModelError("an ensemble's members must be plain model kinds, e.g. arima,persistence")
        step = history.step_seconds
        span = history.span.total_seconds()
        validation = int(min(MAX_VALIDATION, max(MIN_VALIDATION, span / 4)) // step)
        # Members that need more than the first part (Holt-Winters: 3 days) are left out.
        if len(history) - validation < 2 * DAY // step:
            raise InsufficientHistoryError(
                f"{history.name}: an ensemble needs at least {(2 * DAY + validation * step) / DAY:.1f} days "
                f"of history (members' fit plus a held-out tail for the weights), got {span / DAY:.1f}; "
                "supply more history"
            )
        c = choose_log_offset(history.values)
        horizon = max_horizon_steps(step)
        cut = len(history) - validation
        first = self._fit_members(history.slice(0, cut), self.members, optional=True)
        if not first:
            raise ModelError(f"{history.name}: no ensemble member could be fitted; try other members")
        names = tuple(first)
        held_out = tuple(first.values())
        window = max(int(getattr(m, "window_steps", DEFAULT_WINDOW_STEPS)) for m in held_out)
        lo = max(0, cut - 1 - window)
        tail = history.slice(lo, len(history))
        origins = np.arange(cut - 1 - lo, len(tail) - 1)
        member_logs = _member_log_medians(held_out, tail, origins, horizon, c)
        actual = np.full((origins.size, horizon), np.nan)
        for h in range(1, horizon + 1):
            target = origins + h
            inside = target < len(tail)
            actual[inside, h - 1] = tail.values[target[inside]]
        actual_log = observed_log(actual, c)
        weights = choose_weights(member_logs, actual_log, c, self.quantile, self.resolution)
        residual = actual_log - combine(member_logs, weights)
        spread = tuple(tuple(residual_quantiles(residual[:, h])) for h in range(horizon))
        return EnsembleModel(
            step_seconds=step,
            members=tuple(self._fit_members(history, names, optional=False).values()),
            weights=tuple(tuple(float(v) for v in row) for row in weights),
            log_offset=c,
            spread=spread,
        )
