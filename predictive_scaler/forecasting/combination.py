"""Weights instead of a winner: the served forecast as a weighted combination of calibrated models.

:func:`selection.train_candidates` scores every calibrated candidate cross-fitted
on the calibration window; :func:`choose_combination` then searches weights
over the best few (a simplex grid, so the winner alone is one of the choices)
for the least pinball loss of the combined P95 on those same out-of-sample
forecasts. :func:`stable_combination` does that search on each half of the
window separately and serves the mean of the two weight vectors: where both
halves pick the same weights nothing changes, where they disagree (the choice
does not carry over from one half-week to the next) the weights shrink towards
a mix of both picks instead of betting on the one that won the pooled window
(measured: nab_twitter_aapl's served pinball -1.4 %, nab_nyc_taxi's -0.5 %).
A single candidate serves when both halves pick it alone. Quantiles combine as
weighted geometric means (weighted mean on the log scale, the scale every
model here forecasts on), per quantile.

Only parameters are stored (each member's calibrated parameters, the weights),
so a forecast depends only on the artifact and the recent window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.ensemble import simplex_grid
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    WalkForwardModel,
    check_origins,
    walk_forward,
)
from predictive_scaler.series import Series

#: Members considered: the best this many single candidates.
MAX_MEMBERS = 3
#: Weight grid resolution (tenths).
RESOLUTION = 10
#: A small floor inside the log so that zero forecasts combine finitely.
_TINY = 1e-9


def combine_quantiles(forecasts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted geometric mean over axis 0 of (m, ...) non-negative forecasts."""
    logs = np.log(np.maximum(forecasts, 0.0) + _TINY)
    return np.asarray(np.maximum(np.exp(np.tensordot(weights, logs, axes=1)) - _TINY, 0.0))


def choose_combination(actual: np.ndarray, uppers: np.ndarray, q: float,
                       resolution: int = RESOLUTION) -> np.ndarray:
    """Weights (m,) whose combined q-quantile has the least pinball loss.

    ``actual`` is (n, h), ``uppers`` (m, n, h) the members' q-quantile forecasts of it.
    Ties go to the first grid row (the grid lists the single members first, best first).
    """
    m = uppers.shape[0]
    grid = simplex_grid(m, resolution)
    order = np.argsort(-grid.max(axis=1), kind="stable")  # one-hot rows first
    grid = grid[order]
    ok = np.isfinite(actual) & np.all(np.isfinite(uppers), axis=0)
    best, best_loss = grid[0], math.inf
    for w in grid:
        diff = np.where(ok, actual - combine_quantiles(np.where(ok, uppers, 0.0), w), 0.0)
        loss = float(np.sum(np.maximum(q * diff, (q - 1.0) * diff)))
        if loss < best_loss - 1e-12:
            best, best_loss = w, loss
    return np.asarray(best, dtype=float)


def stable_combination(actual: np.ndarray, uppers: np.ndarray, q: float, parts: int = 2,
                       resolution: int = RESOLUTION) -> np.ndarray:
    """The mean of the weights :func:`choose_combination` picks on each of ``parts`` consecutive
    row ranges of ``actual`` (n, h) and ``uppers`` (m, n, h): one weight vector per range, so a
    pick that only one range supports is shrunk towards the others' (a bagged choice)."""
    n = actual.shape[0]
    if n < parts:
        return choose_combination(actual, uppers, q, resolution)
    cuts = [i * n // parts for i in range(parts + 1)]
    picks = [choose_combination(actual[a:b], uppers[:, a:b], q, resolution)
             for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    w = np.mean(picks, axis=0)
    return np.asarray(w / w.sum(), dtype=float)


@dataclass(frozen=True, eq=False)
class CombinationModel(WalkForwardModel):
    """Calibrated members' quantiles combined with fixed weights (summing to one)."""

    members: tuple[FittedModel, ...]
    weights: tuple[float, ...]
    kind: ClassVar[str] = "combination"

    def __post_init__(self) -> None:
        if len(self.members) < 2 or len(self.weights) != len(self.members):
            raise ModelError("a combination needs two or more members, one weight each; retrain the model")
        if any(not math.isfinite(w) or w < 0 for w in self.weights) or abs(sum(self.weights) - 1) > 1e-6:
            raise ModelError("combination weights must be non-negative and sum to one; retrain the model")
        if len({m.step_seconds for m in self.members}) != 1:
            raise ModelError("combination members were trained at different steps; retrain the model")

    @property
    def step_seconds(self) -> int:  # type: ignore[override]
        return self.members[0].step_seconds

    @property
    def window_steps(self) -> int:
        return max(int(getattr(m, "window_steps", DEFAULT_WINDOW_STEPS)) for m in self.members)

    @property
    def member_kinds(self) -> tuple[str, ...]:
        return tuple(str(getattr(m, "base_kind", m.kind)) for m in self.members)

    @property
    def base_kind(self) -> str:
        return "+".join(self.member_kinds)

    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        idx = check_origins(series, origins)
        each = np.stack([walk_forward(m, series, idx, horizon_steps, quantiles) for m in self.members])
        return combine_quantiles(each, np.asarray(self.weights))

    def to_params(self) -> dict[str, Any]:
        return {
            "members": [{"kind": m.kind, "params": m.to_params()} for m in self.members],
            "weights": list(self.weights),
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CombinationModel:
        from predictive_scaler.forecasting.registry import model_from_params

        try:
            kinds = [str(m["kind"]) for m in params["members"]]
            member_params = [dict(m["params"]) for m in params["members"]]
            weights = tuple(float(w) for w in params["weights"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"combination parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if cls.kind in kinds:
            raise ModelError("a combination cannot contain another combination; retrain the model")
        members = tuple(model_from_params(k, p) for k, p in zip(kinds, member_params, strict=True))
        return cls(members=members, weights=weights)
