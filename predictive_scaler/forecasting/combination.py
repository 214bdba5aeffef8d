"""Weights instead of a winner: the served forecast as a weighted combination of calibrated models.

:func:`selection.train_candidates` scores every calibrated candidate cross-fitted
on the calibration window; :func:`choose_combination` then searches weights
over the best few (a simplex grid, so the winner alone is one of the choices)
for the least pinball loss of the combined P95 on those same out-of-sample
forecasts. :func:`stable_combination` does that search on each quarter of the
window (:data:`PARTS`) separately and serves the mean of the weight vectors: where
they all pick the same weights nothing changes, where they disagree (the choice
does not carry over from one part to the next) the weights shrink towards
a mix of the picks instead of betting on the one that won the pooled window; a
prior (the selection's robust default, the ensemble) counts as one more pick.
Measured in the forecast protocol (docs/forecast-protocol.md), served 30-minute
normalised pinball, this and the shift below together: nasa_http_1995 -2.1 %,
nab_nyc_taxi -2.1 %, nab_twitter_aapl -1.5 %.
A single candidate serves when every part (and the prior) picks it alone. Quantiles combine as
weighted arithmetic means, per quantile (:data:`MEAN`; artifacts written before it combine
as weighted geometric means, the mean on the log scale, and keep doing so).

The combined quantile of calibrated members is not itself calibrated: where the
members disagree their mix is tighter than any of them, and the mean of their
P95s over-covers (nab_nyc_taxi's served coverage: 0.958 with the weights above
alone, 0.951 with the shift). :func:`recalibration` therefore
chooses, two-fold on the same cross-fitted forecasts, between no shift and a
conformal shift per horizon step of the combined target quantile on the log
scale or in demand units; the chosen shift moves the quantiles above the median
(in proportion up to the target quantile) and is stored with the weights.

The stored weights are where a forecast starts, not where it ends: with
:class:`OnlineWeights` each forecast re-weights the members by how they did over
the last day (:func:`online_weights`), so a member that the calibration week
favoured but the current regime does not (a holiday, a launch, a quiet weekend)
loses weight within hours instead of at the next weekly retrain (figures at
:data:`ONLINE_RATE`). The stored weights stay the prior: the exponent only moves
weight between members by how much their recent losses differ, and a forecast
with nothing scored yet (a gap, the start of a series) keeps them.

Only parameters are stored (each member's calibrated parameters, the weights, the
online rule), so a forecast depends only on the artifact and the recent window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.calibration import MIN_SCORES, conformal_quantile
from predictive_scaler.forecasting.ensemble import simplex_grid
from predictive_scaler.forecasting.logscale import from_log, to_log
from predictive_scaler.forecasting.metrics import pinball_losses
from predictive_scaler.forecasting.walkforward import (
    DEFAULT_WINDOW_STEPS,
    WalkForwardModel,
    check_origins,
    shared_forecasts,
    walk_forward,
)
from predictive_scaler.series import Series

#: Members considered: the best this many single candidates.
MAX_MEMBERS = 3
#: Weight grid resolution (tenths).
RESOLUTION = 10
#: A small floor inside the log so that zero forecasts combine finitely.
_TINY = 1e-9


def _logs(forecasts: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(forecasts, 0.0) + _TINY)


def _from_logs(mean_log: np.ndarray) -> np.ndarray:
    return np.asarray(np.maximum(np.exp(mean_log) - _TINY, 0.0))


#: How members' quantiles combine: "arithmetic" (weighted mean) or "geometric" (weighted mean
#: on the log scale). New trainings combine arithmetically: where one member's P95 jumps with
#: a burst (persistence's) and the others' do not, the geometric mean pulls the combined P95
#: towards the low ones (nab_twitter_aapl's third week: persistence and the ensemble 0.302,
#: the others 0.39-0.43, the served mix of quantile-regression, arima and the ensemble 0.427
#: geometric, 0.413 arithmetic). Measured in the forecast protocol (served 30-minute
#: normalised pinball, the weights searched and the shift chosen for each mean, online
#: weights on): nasa_http_1995 0.03272 -> 0.03247 (-0.8 %), nab_nyc_taxi 0.005234 -> 0.005219
#: (-0.3 %), nab_twitter_aapl 0.2540 -> 0.2527 (-0.5 %).
MEANS: tuple[str, ...] = ("arithmetic", "geometric")
MEAN = "arithmetic"


def _to_mean_scale(forecasts: np.ndarray, mean: str) -> np.ndarray:
    """The scale a ``mean`` (:data:`MEANS`) averages on: demand units, or the log."""
    return forecasts if mean == "arithmetic" else _logs(forecasts)


def _from_mean_scale(averaged: np.ndarray, mean: str) -> np.ndarray:
    return np.asarray(averaged, dtype=float) if mean == "arithmetic" else _from_logs(averaged)


def combine_quantiles(forecasts: np.ndarray, weights: np.ndarray, mean: str = "geometric") -> np.ndarray:
    """Weighted ``mean`` (:data:`MEANS`) over axis 0 of (m, ...) non-negative forecasts."""
    return _from_mean_scale(np.tensordot(weights, _to_mean_scale(forecasts, mean), axes=1), mean)


def choose_combination(actual: np.ndarray, uppers: np.ndarray, q: float,
                       resolution: int = RESOLUTION, mean: str = "geometric") -> np.ndarray:
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
        combined = combine_quantiles(np.where(ok, uppers, 0.0), w, mean)
        loss = float(np.sum(np.where(ok, pinball_losses(actual, combined, q), 0.0)))
        if loss < best_loss - 1e-12:
            best, best_loss = w, loss
    return np.asarray(best, dtype=float)


#: The calibration window is split into this many consecutive parts, one pick each: four
#: windows of 1.75 days (of a 7-day window) rather than two half-weeks. Measured in the forecast
#: protocol against two parts (served 30-minute normalised pinball): nab_twitter_aapl -0.6 %,
#: nasa_http_1995 -0.3 %, nab_nyc_taxi -1.0 %.
PARTS = 4


def stable_combination(actual: np.ndarray, uppers: np.ndarray, q: float, parts: int = PARTS,
                       resolution: int = RESOLUTION, prior: np.ndarray | None = None,
                       mean: str = "geometric") -> np.ndarray:
    """The mean of the weights :func:`choose_combination` picks on each of ``parts`` consecutive
    row ranges of ``actual`` (n, h) and ``uppers`` (m, n, h): one weight vector per range, so a
    pick that only one range supports is shrunk towards the others' (a bagged choice).
    ``prior`` (m,), when given, counts as one more range's pick: the weights shrink towards it
    by 1 / (parts + 1), and fully only where every range picks it too."""
    n = actual.shape[0]
    if n < parts:
        picks = [choose_combination(actual, uppers, q, resolution, mean)]
    else:
        cuts = [i * n // parts for i in range(parts + 1)]
        picks = [choose_combination(actual[a:b], uppers[:, a:b], q, resolution, mean)
                 for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    if prior is not None:
        picks.append(np.asarray(prior, dtype=float) / float(np.sum(prior)))
    w = np.mean(picks, axis=0)
    return np.asarray(w / w.sum(), dtype=float)


#: Scales a combination's own shift may live on (None: no shift).
SHIFT_SCALES: tuple[str | None, ...] = (None, "log", "additive")


@dataclass(frozen=True)
class Shift:
    """A combination's own calibration: ``steps[h]`` moves its ``quantile`` at horizon step
    h + 1 (last repeated) on ``scale`` ("log": log(x + offset), "additive": demand units)."""

    quantile: float
    scale: str
    steps: tuple[float, ...]
    offset: float = 1.0

    def __post_init__(self) -> None:
        if self.scale not in ("log", "additive") or not self.steps or not (0.5 < self.quantile < 1.0):
            raise ModelError("combination shift is malformed (scale, steps or quantile); retrain the model")
        if not all(math.isfinite(v) for v in self.steps) or not (math.isfinite(self.offset) and self.offset > 0):
            raise ModelError("combination shift contains non-finite numbers; retrain the model")

    def apply(self, values: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
        """``values`` (n, k, h) with each quantile above the median moved by the shift, in
        proportion up to :attr:`quantile` and fully beyond it; order across quantiles kept."""
        h = values.shape[2]
        steps = np.asarray(self.steps)[np.minimum(np.arange(h), len(self.steps) - 1)]
        share = np.clip((np.asarray(quantiles, dtype=float) - 0.5) / (self.quantile - 0.5), 0.0, 1.0)
        move = share[:, None] * steps[None, :]  # (k, h)
        if self.scale == "log":
            out = from_log(to_log(values, self.offset) + move[None], self.offset)
        else:
            out = np.maximum(values + move[None], 0.0)
        out = np.where(np.isfinite(values), out, np.nan)
        return np.asarray(np.fmax.accumulate(out, axis=1))


def _pinball_sum(actual: np.ndarray, upper: np.ndarray, q: float) -> float:
    ok = np.isfinite(actual) & np.isfinite(upper)
    return float(np.sum(pinball_losses(actual[ok], upper[ok], q)))


def _shift_of(actual: np.ndarray, upper: np.ndarray, q: float, scale: str, offset: float) -> float:
    ok = np.isfinite(actual) & np.isfinite(upper)
    if scale == "log":
        scores = to_log(actual[ok], offset) - to_log(upper[ok], offset)
    else:
        scores = actual[ok] - upper[ok]
    return conformal_quantile(scores, q)


def recalibration(actual: np.ndarray, upper: np.ndarray, q: float, offset: float,
                  steps: Sequence[int]) -> tuple[Shift | None, np.ndarray]:
    """The combination's own shift of its q-quantile, chosen two-fold on cross-fitted forecasts.

    ``actual`` and ``upper`` are (n, len(steps)): the combined q-quantile forecasts of horizon
    steps ``steps`` (1-based) at n origins, two halves of n // 2 rows. Each scale of
    :data:`SHIFT_SCALES` learns a shift per horizon step on one half and is scored on the other,
    and back; the least pinball loss wins (ties: no shift). Returns the shift learnt on all rows
    (None for no shift; horizon steps between those given are interpolated) and the two-fold
    shifted forecasts (n, len(steps)) that scored it, the honest scores of the choice.
    """
    n = actual.shape[0]
    half = n // 2
    folds = ((np.arange(half), np.arange(half, n)), (np.arange(half, n), np.arange(half)))
    if half < MIN_SCORES:
        return None, upper
    best: tuple[float, str | None, np.ndarray] = (math.inf, None, upper)
    for scale in SHIFT_SCALES:
        shifted = upper.copy()
        if scale is not None:
            for fit, test in folds:
                for j in range(len(steps)):
                    d = _shift_of(actual[fit, j], upper[fit, j], q, scale, offset)
                    one = Shift(q, scale, (d,), offset)
                    shifted[test, j] = one.apply(upper[test, j][:, None, None], (q,))[:, 0, 0]
        loss = _pinball_sum(actual, shifted, q)
        if loss < best[0] - 1e-12:
            best = (loss, scale, shifted)
    _, scale, shifted = best
    if scale is None:
        return None, upper
    learnt = [_shift_of(actual[:, j], upper[:, j], q, scale, offset) for j in range(len(steps))]
    every = np.interp(np.arange(1, max(steps) + 1), np.asarray(steps, dtype=float), learnt)
    return Shift(q, scale, tuple(float(v) for v in every), offset), shifted


#: Online re-weighting's rate: a member whose P95 pinball over the last day is 10 % above the
#: members' mean has its weight multiplied by exp(-0.4) ≈ 0.67 against one at the mean.
#: Chosen in the forecast protocol against the stored weights alone: it gains most where the
#: regime shifts within days (nab_nyc_taxi) and costs a little where bursts last minutes, so
#: yesterday's best member is no better a guess (nab_twitter_aapl); figures in docs/results.md.
#: Replayed offline
#: on the same members before that, 4 was within 0.5 % of the best of 2, 4 and 8 on all three
#: (8 was 0.3 % better on NASA, worse on the others); a plain mean loss, not divided by the
#: members' mean at each origin, cost AAPL 0.7 %.
ONLINE_RATE = 4.0
#: ... over the origins of this much recent history, one served horizon apart (their targets
#: do not overlap), whose targets are all observed: one day (three days was worse, measured).
ONLINE_WINDOW_SECONDS = 86400


@dataclass(frozen=True)
class OnlineWeights:
    """Each forecast's weights: the stored ones times exp(-``rate`` × each member's mean
    relative ``quantile`` pinball over the ``origins`` past origins ``steps`` apart (horizon
    steps 1..``steps`` of each), renormalised (:func:`online_weights`)."""

    rate: float
    steps: int
    origins: int
    quantile: float = 0.95

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0) or not (0.0 < self.quantile < 1.0):
            raise ModelError("combination online weights: rate must be positive and quantile inside (0, 1); "
                             "retrain the model")
        if self.steps < 1 or self.origins < 1:
            raise ModelError("combination online weights: steps and origins must be at least 1; retrain the model")

    @classmethod
    def for_horizon(cls, horizon_steps: int, step_seconds: int, quantile: float) -> OnlineWeights:
        """The default rule for a combination serving ``horizon_steps`` at ``step_seconds``."""
        steps = max(1, horizon_steps)
        return cls(rate=ONLINE_RATE, steps=steps,
                   origins=max(1, ONLINE_WINDOW_SECONDS // (steps * step_seconds)), quantile=quantile)

    @property
    def reach(self) -> int:
        """How many steps before a forecast's origin the earliest scored origin lies."""
        return self.steps * self.origins


def online_weights(static: np.ndarray, losses: np.ndarray, rate: float) -> np.ndarray:
    """Per-origin weights (n, m) from the static ones (m,) and ``losses`` (n, m, k): each
    member's pinball at k past origins of each of n forecasts (NaN: not scored). A past origin
    counts only where every member was scored; each member's loss there is divided by the
    members' mean (so a calm day and a burst weigh alike); a forecast with no such origin
    keeps the static weights."""
    mean = np.mean(losses, axis=1, keepdims=True)  # (n, 1, k); NaN where any member is missing
    ok = np.isfinite(mean) & (mean > 0)
    rel = np.where(ok, losses / np.where(ok, mean, 1.0), 0.0)
    count = ok.sum(axis=2)  # (n, 1)
    score = np.where(count > 0, rel.sum(axis=2) / np.maximum(count, 1), 0.0)  # (n, m)
    raw = static[None, :] * np.exp(-rate * (score - score.min(axis=1, keepdims=True)))
    return np.asarray(raw / raw.sum(axis=1, keepdims=True), dtype=float)


def combine_per_origin(forecasts: np.ndarray, weights: np.ndarray, mean: str = "geometric") -> np.ndarray:
    """:func:`combine_quantiles` with a weight vector per origin: ``forecasts`` (m, n, ...),
    ``weights`` (n, m)."""
    w = weights.T.reshape(weights.shape[1], weights.shape[0], *([1] * (forecasts.ndim - 2)))
    return _from_mean_scale(np.sum(w * _to_mean_scale(forecasts, mean), axis=0), mean)


@dataclass(frozen=True, eq=False)
class CombinationModel(WalkForwardModel):
    """Calibrated members' quantiles combined with weights summing to one: fixed, or re-weighted
    at each forecast by the members' recent pinball (``online``)."""

    members: tuple[FittedModel, ...]
    weights: tuple[float, ...]
    #: The combination's own calibration of its combined quantiles (None: none).
    shift: Shift | None = None
    #: Re-weighting by recent pinball at each forecast (None: the stored weights always).
    online: OnlineWeights | None = None
    #: How the members' quantiles combine (:data:`MEANS`; artifacts without it: geometric).
    mean: str = "geometric"
    kind: ClassVar[str] = "combination"

    def __post_init__(self) -> None:
        if len(self.members) < 2 or len(self.weights) != len(self.members):
            raise ModelError("a combination needs two or more members, one weight each; retrain the model")
        if any(not math.isfinite(w) or w < 0 for w in self.weights) or abs(sum(self.weights) - 1) > 1e-6:
            raise ModelError("combination weights must be non-negative and sum to one; retrain the model")
        if len({m.step_seconds for m in self.members}) != 1:
            raise ModelError("combination members were trained at different steps; retrain the model")
        if self.mean not in MEANS:
            raise ModelError(f"combination mean {self.mean!r} is not one of {', '.join(MEANS)}; retrain the model")

    @property
    def step_seconds(self) -> int:  # type: ignore[override]
        return self.members[0].step_seconds

    @property
    def window_steps(self) -> int:
        members = max(int(getattr(m, "window_steps", DEFAULT_WINDOW_STEPS)) for m in self.members)
        # Online weights score the members at past origins, each with its full window.
        return members + (0 if self.online is None else self.online.reach)

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
        if self.online is None:
            with shared_forecasts():  # members that hold equal fits (the ensemble's ARIMA) run them once
                each = np.stack([walk_forward(m, series, idx, horizon_steps, quantiles) for m in self.members])
            combined = combine_quantiles(each, np.asarray(self.weights), self.mean)
        else:
            combined = self._online(series, idx, horizon_steps, quantiles)
        return combined if self.shift is None else self.shift.apply(combined, quantiles)

    def _online(self, series: Series, idx: np.ndarray, horizon_steps: int, quantiles: Sequence[float]) -> np.ndarray:
        """The members forecast once at the served origins and the past ones they are scored at
        (most coincide: origins one horizon apart are each other's past), then combine per origin."""
        rule = self.online
        assert rule is not None
        if idx.size == 0:
            return np.empty((0, len(quantiles), horizon_steps))
        k = np.arange(1, rule.origins + 1)
        past = idx[:, None] - rule.steps * k[None, :]  # (n, k)
        # Every target of a past origin is observed by the origin it weighs (p + steps <= t), and
        # each member reads its own window before p, inside the combination's (window_steps).
        usable = past >= 0
        union = np.unique(np.concatenate([idx, past[usable]]))
        qs = tuple(sorted({*quantiles, rule.quantile}))
        h = max(horizon_steps, rule.steps)
        with shared_forecasts():
            each = np.stack([walk_forward(m, series, union, h, qs) for m in self.members])  # (m, u, q, h)
        served = each[:, np.searchsorted(union, idx)][:, :, [qs.index(q) for q in quantiles], :horizon_steps]
        # Each member's mean pinball over horizon steps 1..steps at each past origin.
        upper = each[:, :, qs.index(rule.quantile), : rule.steps]  # (m, u, steps)
        target = union[:, None] + np.arange(1, rule.steps + 1)[None, :]
        actual = np.where(target < len(series), series.values[np.minimum(target, len(series) - 1)], np.nan)
        per_origin = np.mean(pinball_losses(actual[None], upper, rule.quantile), axis=2)  # (m, u); NaN if any
        rows = np.searchsorted(union, np.where(usable, past, union[0]))
        losses = np.where(usable[None], per_origin[:, rows], np.nan).transpose(1, 0, 2)  # (n, m, k)
        weights = online_weights(np.asarray(self.weights), losses, rule.rate)
        return combine_per_origin(served, weights, self.mean)

    def to_params(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "members": [{"kind": m.kind, "params": m.to_params()} for m in self.members],
            "weights": list(self.weights),
            "mean": self.mean,
        }
        if self.shift is not None:
            doc["shift"] = {"quantile": self.shift.quantile, "scale": self.shift.scale,
                            "steps": list(self.shift.steps), "offset": self.shift.offset}
        if self.online is not None:
            doc["online"] = {"rate": self.online.rate, "steps": self.online.steps,
                             "origins": self.online.origins, "quantile": self.online.quantile}
        return doc

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CombinationModel:
        from predictive_scaler.forecasting.registry import model_from_params

        try:
            kinds = [str(m["kind"]) for m in params["members"]]
            member_params = [dict(m["params"]) for m in params["members"]]
            weights = tuple(float(w) for w in params["weights"])
            raw = params.get("shift")
            shift = None if raw is None else Shift(
                quantile=float(raw["quantile"]), scale=str(raw["scale"]),
                steps=tuple(float(v) for v in raw["steps"]), offset=float(raw["offset"]))
            raw = params.get("online")  # absent in artifacts written before online weights: static
            online = None if raw is None else OnlineWeights(
                rate=float(raw["rate"]), steps=_whole(raw["steps"]), origins=_whole(raw["origins"]),
                quantile=float(raw["quantile"]))
            mean = params.get("mean", "geometric")  # absent in artifacts written before the choice
            if not isinstance(mean, str):
                raise TypeError(f"mean must be a string, got {mean!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"combination parameters are incomplete or malformed ({exc!r}); retrain") from exc
        if cls.kind in kinds:
            raise ModelError("a combination cannot contain another combination; retrain the model")
        members = tuple(model_from_params(k, p) for k, p in zip(kinds, member_params, strict=True))
        return cls(members=members, weights=weights, shift=shift, online=online, mean=mean)


def _whole(value: Any) -> int:
    """An integer parameter, refusing 2.5 or "6" rather than truncating it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value
