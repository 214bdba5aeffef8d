"""What the weekly job remembers of a scaler between runs: how each candidate scored, and the
parameters it fitted — so that a week can skip candidates that keep losing by a wide margin and
start the slow fits from last week's optimum.

One small JSON document per model in the store (``<name>/selection/ledger.json``), written after
every training and read before the next. It is a hint, never a requirement: an absent, unreadable
or foreign ledger means a cold week (every candidate scored, every fit from its default start),
which is also what the first week of a scaler is.

The rules are fixed in advance, not tuned:

* **Losers skipped.** A candidate is left out when, in each of the last :data:`LOSER_WEEKS` weeks
  it was scored (all within :data:`LEDGER_WEEKS` weeks of now), its cross-fitted mean pinball
  loss at the target quantile was at least :data:`LOSER_MARGIN` times that of the :data:`POOL`-th
  best of the others — the last candidate a combination is searched over, so a skipped one was
  far from joining the served combination. It is
  scored again on its scaler's recheck week, one week in :data:`RECHECK_WEEKS` (staggered by the
  model's name, so the fleet's rechecks spread over the weeks instead of landing on one), and
  stays in from then on if it no longer loses. :data:`PROTECTED` candidates are never skipped.
* **Settled scales.** A candidate whose conformal shifts were kept on the same scale (log or
  additive), by a margin of :data:`SCALE_MARGIN` or more, in each of the last :data:`LOSER_WEEKS`
  weeks both were tried is calibrated on that scale only, both again on the recheck week.
* **Warm starts.** Holt-Winters' ETS fits (daily and weekly season, as a candidate and as ensemble
  members) start from the parameters the scaler's last training fitted; the optimiser then stops
  after fewer iterations at (nearly) the same optimum (0.45 → 0.24 CPU-s for five daily fits a week
  apart, 1.16 → 0.82 for five weekly ones). The ARIMA candidate's residual ARIMA (as a candidate
  and as an ensemble member) starts from its last AR and MA coefficients too: with the MA searched
  inside its limit the search no longer crawls to the boundary, and a start a week old reaches the
  same optimum in about half the likelihoods, with no preliminary fit for statsmodels' start values.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from predictive_scaler.errors import ModelError
from predictive_scaler.forecasting.arima import DEFAULT_ORDER as ARIMA_DEFAULT_ORDER
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.calibration import CalibratedModel
from predictive_scaler.forecasting.combination import MAX_MEMBERS
from predictive_scaler.forecasting.selection import SCALES, scale_of

FORMAT = 1
#: The warm start of the default-order ARIMA candidate's residual model (its AR and MA coefficients).
ARIMA_KEY = "arima/{}-{}-{}".format(*ARIMA_DEFAULT_ORDER)
#: Where the ledger lives in the store: ``<name>/<LEDGER_FOLDER>/<LEDGER_ID>.json``.
LEDGER_FOLDER = "selection"
LEDGER_ID = "ledger"
#: A candidate whose mean pinball is at least this many times the POOL-th best one's lost widely.
LOSER_MARGIN = 1.25
#: ... in each of this many consecutive weeks it was scored: then it is skipped.
LOSER_WEEKS = 3
#: A scale is settled only when it beat the other by this much (mean pinball) each week it was tried.
#: (First settled on agreement alone: on nab_nyc_taxi a scale pinned by three narrow wins was not the
#: one that won the fourth week, and the challenger then promoted differed from the cold week's.)
SCALE_MARGIN = 1.10
#: A skipped candidate is scored again one week in this many.
RECHECK_WEEKS = 4
#: Weeks of scores kept; older weeks say nothing about this week's traffic.
LEDGER_WEEKS = 8
#: The candidates a combination is searched over
#: (:func:`~predictive_scaler.forecasting.selection.combination_pool`): the margin is measured against
#: the last of them. (First measured against the best candidate: on nab_nyc_taxi a candidate that had
#: lost by 1.36-4.4x the best came back into the combination's three the week it was skipped.)
POOL = MAX_MEMBERS
#: Never skipped: the combination's default member (its weights shrink towards it).
PROTECTED: frozenset[str] = frozenset({"ensemble"})
#: Bounds on what a ledger may hold (it is read from the store: a planted file must not cost much).
MAX_LEDGER_BYTES = 1 << 16
_MAX_PARAMS = 16


def week_index(now: datetime) -> int:
    return int(now.timestamp() // (7 * 86400))


def recheck_week(model_name: str, now: datetime) -> bool:
    """Is ``now`` the week ``model_name``'s skipped candidates are scored again?"""
    offset = int.from_bytes(hashlib.sha256(model_name.encode()).digest()[:4], "big")
    return (week_index(now) + offset) % RECHECK_WEEKS == 0


@dataclass(frozen=True)
class WeekScores:
    """One training's candidates: mean pinball ÷ the best candidate's (None: not scored that week)."""

    run_id: str
    trained_until: datetime
    relative: Mapping[str, float | None]
    #: The scale each kind's shifts were calibrated on (``log`` or ``additive``) ...
    scales: Mapping[str, str] = field(default_factory=dict)
    #: ... and, where both were tried, the other scale's mean pinball ÷ the kept one's.
    scale_margins: Mapping[str, float] = field(default_factory=dict)

    def behind_pool(self, kind: str) -> float | None:
        """``kind``'s loss ÷ that of the :data:`POOL`-th best of the other kinds this week: how far behind
        the last candidate a combination could take it was (None: not scored, or too few others)."""
        mine = self.relative.get(kind)
        others = sorted(v for k, v in self.relative.items() if k != kind and v is not None)
        if mine is None or len(others) < POOL or others[POOL - 1] <= 0:
            return None
        return mine / others[POOL - 1]


@dataclass(frozen=True)
class Ledger:
    weeks: tuple[WeekScores, ...] = ()
    #: Fitted parameters by fit (:func:`fit_key`), from the last training.
    warm: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def _recent(self, now: datetime) -> list[WeekScores]:
        return [w for w in self.weeks if timedelta(0) < now - w.trained_until <= timedelta(weeks=LEDGER_WEEKS)]

    def scales(self, kinds: Sequence[str], model_name: str, now: datetime) -> dict[str, str]:
        """The kinds whose shifts were kept on the same scale, by :data:`SCALE_MARGIN` or more, in each of
        the last :data:`LOSER_WEEKS` weeks both scales were tried: calibrated on that scale only this week
        (both again on the recheck week). A week calibrated on one scale is no evidence either way."""
        if recheck_week(model_name, now):
            return {}
        out: dict[str, str] = {}
        for kind in kinds:
            tried = [(w.scales[kind], w.scale_margins[kind]) for w in self._recent(now)
                     if kind in w.scales and kind in w.scale_margins][-LOSER_WEEKS:]
            if (len(tried) == LOSER_WEEKS and len({scale for scale, _ in tried}) == 1
                    and all(margin >= SCALE_MARGIN for _, margin in tried)):
                out[kind] = tried[0][0]
        return out

    def skipped(self, kinds: Sequence[str], model_name: str, now: datetime) -> dict[str, str]:
        """The candidates this week leaves out, each with why."""
        if recheck_week(model_name, now):
            return {}
        recent = self._recent(now)
        out: dict[str, str] = {}
        for kind in kinds:
            if kind in PROTECTED:
                continue
            scored = [w.behind_pool(kind) for w in recent if w.relative.get(kind) is not None]
            last = scored[-LOSER_WEEKS:]
            if len(last) == LOSER_WEEKS and all(v is not None and v >= LOSER_MARGIN for v in last):
                out[kind] = (f"lost by {LOSER_MARGIN:g}x or more to the {_ordinal(POOL)} best in its last "
                             f"{LOSER_WEEKS} scored weeks ({', '.join(f'{v:.2f}x' for v in last if v is not None)}); "
                             f"scored again one week in {RECHECK_WEEKS}")
        if len(kinds) - len(out) < 2:
            return {}  # never down to one candidate: a choice needs two
        return out

    def options(self) -> dict[str, dict[str, Any]]:
        """Forecaster options (:func:`~predictive_scaler.forecasting.registry.forecaster`) that warm-start
        the fits this ledger remembers, for the candidates and the ensemble's members alike."""
        out: dict[str, dict[str, Any]] = {}
        members: dict[str, dict[str, Any]] = {}
        for key, params in self.warm.items():
            target = {"holt-winters/day": ("holt-winters", "holt-winters"),
                      "holt-winters/week": (None, "holt-winters-weekly"),
                      ARIMA_KEY: ("arima", "arima")}.get(key)
            if target is None:
                continue
            candidate, member = target
            if candidate is not None:
                out[candidate] = {"start": params}
            members[member] = {"start": params}
        if members:
            out["ensemble"] = {"member_options": members}
        return out

    def after(self, run_id: str, trained_until: datetime, relative: Mapping[str, float | None],
              candidates: Mapping[str, FittedModel], scale_margins: Mapping[str, float] | None = None) -> Ledger:
        """This ledger with one more week (replacing the same run's, if re-run) and the fits of
        ``candidates`` as the next warm starts (the last ones kept for fits this week did not make)."""
        weeks = [w for w in self.weeks if w.run_id != run_id and w.trained_until < trained_until]
        scales = {kind: scale_of(model) for kind, model in candidates.items() if isinstance(model, CalibratedModel)}
        margins = {k: float(v) for k, v in (scale_margins or {}).items() if k in scales and math.isfinite(v)}
        weeks.append(WeekScores(run_id, trained_until, dict(relative), scales, margins))
        warm = {**self.warm, **fitted_parameters(candidates.values())}
        return Ledger(weeks=tuple(weeks[-LEDGER_WEEKS:]), warm=warm)

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "weeks": [{"run_id": w.run_id, "trained_until": w.trained_until.astimezone(UTC).isoformat(),
                       "relative": {k: (None if v is None else round(v, 6)) for k, v in sorted(w.relative.items())},
                       "scales": dict(sorted(w.scales.items())),
                       "scale_margins": {k: round(v, 6) for k, v in sorted(w.scale_margins.items())}}
                      for w in self.weeks],
            "warm": {k: list(v) for k, v in sorted(self.warm.items())},
        }
        return (json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n").encode()

    @classmethod
    def from_json(cls, body: bytes) -> Ledger:
        """The ledger in ``body``; a :class:`ModelError` naming what is wrong otherwise."""
        if len(body) > MAX_LEDGER_BYTES:
            raise ModelError(f"selection ledger of {len(body)} bytes is larger than {MAX_LEDGER_BYTES}")
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}, not {FORMAT}")
            weeks = tuple(WeekScores(run_id=str(w["run_id"]),
                                     trained_until=_utc(datetime.fromisoformat(str(w["trained_until"]))),
                                     relative={str(k): _ratio(v) for k, v in dict(w["relative"]).items()},
                                     scales={str(k): _scale(v) for k, v in dict(w.get("scales", {})).items()},
                                     scale_margins={str(k): _margin(v)
                                                    for k, v in dict(w.get("scale_margins", {})).items()})
                          for w in list(doc["weeks"])[-LEDGER_WEEKS:])
            warm = {str(k): _params(v) for k, v in dict(doc["warm"]).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ModelError(f"selection ledger is malformed ({exc}); the week runs cold and rewrites it") from exc
        return cls(weeks=weeks, warm=warm)


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _utc(t: datetime) -> datetime:
    if t.tzinfo is None:
        raise ValueError("trained_until has no time zone")
    return t.astimezone(UTC)


def _ratio(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v) or v < 0 or isinstance(value, bool):
        raise ValueError(f"relative score {value!r} is not a finite non-negative number")
    return v


def _margin(value: Any) -> float:
    v = _ratio(value)
    if v is None or v < 1.0:
        raise ValueError(f"scale margin {value!r} is not a number of at least 1")
    return v


def _scale(value: Any) -> str:
    if value not in SCALES:
        raise ValueError(f"scale {value!r} is not one of {', '.join(map(repr, SCALES))}")
    return str(value)


def _params(value: Any) -> tuple[float, ...]:
    items = list(value)
    if not 0 < len(items) <= _MAX_PARAMS or any(isinstance(v, bool) for v in items):
        raise ValueError("warm-start parameters must be 1 to 16 numbers")
    out = tuple(float(v) for v in items)
    if not all(math.isfinite(v) for v in out):
        raise ValueError("warm-start parameters must be finite")
    return out


def relative_scores(models: Mapping[str, Mapping[str, Any]], kinds: Sequence[str]) -> dict[str, float | None]:
    """Each kind's mean pinball (over the horizons scored) ÷ the best kind's, from a training's
    ``metrics["models"]``; None for a kind not scored (skipped, or its fit failed)."""
    pins: dict[str, float] = {}
    for kind in kinds:
        doc = models.get(kind)
        if not isinstance(doc, Mapping) or doc.get("error"):
            continue
        values = [h.get("pinball") for h in (doc.get("horizons") or {}).values() if isinstance(h, Mapping)]
        finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if finite:
            pins[kind] = float(np.mean(finite))
    best = min(pins.values(), default=None)
    if best is None or best <= 0:
        return dict.fromkeys(kinds)
    return {k: (pins[k] / best if k in pins else None) for k in kinds}


def fit_key(model: FittedModel) -> str | None:
    """Which warm start a fitted model's parameters seed (None: a kind fitted without one)."""
    kind = getattr(model, "kind", None)
    if kind == "holt-winters":
        season = len(getattr(model, "profile", ())) * model.step_seconds
        return {86400: "holt-winters/day", 7 * 86400: "holt-winters/week"}.get(season)
    if kind == "arima" and tuple(getattr(model, "order", ())) == ARIMA_DEFAULT_ORDER:
        return ARIMA_KEY
    return None


def _parameters(model: FittedModel) -> tuple[float, ...] | None:
    if model.kind == "holt-winters":
        return (model.alpha, model.beta, model.gamma, model.phi)  # type: ignore[attr-defined]
    if model.kind == "arima":
        return tuple(model.arima_params[:-1])  # type: ignore[attr-defined]  # the searched ones: not the variance
    return None


def fitted_parameters(models: Iterable[FittedModel]) -> dict[str, tuple[float, ...]]:
    """Warm starts from ``models`` and everything inside them (calibrated bases, ensemble and
    combination members): the first fit found for each key."""
    out: dict[str, tuple[float, ...]] = {}
    stack = list(models)
    while stack:
        model = stack.pop(0)
        key = fit_key(model)
        if key is not None and key not in out:
            params = _parameters(model)
            if params is not None and all(math.isfinite(v) for v in params):
                out[key] = params
        base = getattr(model, "base", None)
        if base is not None:
            stack.append(base)
        stack.extend(getattr(model, "members", ()) or ())
    return out
