"""The planner's memory: a small, JSON-able value kept in the resource's status.

Times are epoch seconds (floats round-trip exactly through JSON), so
serialise → restore → decide gives the same decision as deciding directly.
Every sequence is bounded: pruned by time window or by count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from predictive_scaler.errors import ConfigError

#: Bumped when the shape changes; an unknown version is refused, not guessed at.
STATE_VERSION = 1

Strategy = str  # "predictive" | "reactive" | "hold" | "" (nothing decided yet)
STRATEGIES = ("predictive", "reactive", "hold")

#: Drift outcome codes, one per evaluated observation.
OK, ABOVE, FAR_ABOVE, FAR_BELOW = 0, 1, 2, 3


@dataclass(frozen=True)
class PendingForecast:
    """The forecast issued for one model step, awaiting the observations made in it."""

    step_start: float
    p50: float | None
    pq: float


@dataclass(frozen=True)
class StepAccumulator:
    """Observations so far in one model step, with the forecast issued for that step."""

    step_start: float
    p50: float | None
    pq: float
    count: int = 0
    total: float = 0.0
    total_sq: float = 0.0


@dataclass(frozen=True)
class DriftState:
    pending: tuple[PendingForecast, ...] = ()
    #: One outcome per completed model step: its mean against the forecast for it.
    outcomes: tuple[int, ...] = ()
    last_evaluated_at: float | None = None
    drifting: bool = False
    direction: str | None = None  # "under-forecast" | "over-forecast"
    since: float | None = None
    good_since: float | None = None
    #: Why drift began (kept while drifting) — and the last transition's sentence with its time,
    #: so a retried or restored decision explains itself exactly as the first one did.
    reason: str | None = None
    note: str | None = None
    note_at: float | None = None
    #: The model step being observed now (its mean is judged when it completes).
    step: StepAccumulator | None = None
    #: Smoothed squared relative spread of observations around their step's mean (None: not seen yet).
    noise_var: float | None = None
    #: Consecutive observations far off beyond that spread: > 0 above, < 0 below.
    run: int = 0
    #: When that run's first observation was made (drift from a run is judged over time).
    run_since: float | None = None


@dataclass(frozen=True)
class PlannerState:
    strategy: Strategy = ""
    strategy_since: float | None = None
    #: (time, raw reactive recommendation) of the counterfactual within the longest stabilisation window.
    recommendations: tuple[tuple[float, int], ...] = ()
    #: (time, replica change) of the counterfactual within the longest scale policy period.
    scale_events: tuple[tuple[float, int], ...] = ()
    #: The counterfactual: replicas the HPA rule alone would hold, never having seen a forecast. It is
    #: stepped on its own count (not on the replicas speculation raised), so speculation cannot fold
    #: itself into it; the prewarm budget is enforced above it. None until the first valid demand.
    counterfactual: int | None = None
    #: The counterfactual before the decision at ``last_decided_at`` (a retried decision at the same
    #: time steps from it again, so deciding twice equals deciding once).
    counterfactual_prior: int | None = None
    #: When the current run of missing/stale demand began.
    missing_since: float | None = None
    drift: DriftState = field(default_factory=DriftState)
    last_decided_at: float | None = None
    #: (time, demand) observed within the release window (``reactive.scaleDownStabilizationSeconds``):
    #: a release does not drop the one node this recent demand needed (node-boundary hysteresis).
    recent_demand: tuple[tuple[float, float], ...] = ()
    #: Start of the model step where the predicted rise being planned for begins (its onset), until the
    #: forecast shows no rise ahead: a held rise is not held again by the steps of the same rise.
    onset_at: float | None = None
    #: Log of the headroom multiplier the service tracker keeps (:mod:`predictive_scaler.policy.service`).
    headroom_log: float = 0.0
    #: Smoothed demand the tracker measures shortfall against (None until the first valid demand).
    demand_level: float | None = None
    #: Since when fewer replicas have been ready than desired (None: all ready); readiness stuck for
    #: longer than the lead times is no evidence for more headroom.
    unready_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = self.drift
        return {
            "version": STATE_VERSION,
            "strategy": self.strategy,
            "strategySince": self.strategy_since,
            "recommendations": [[t, r] for t, r in self.recommendations],
            "scaleEvents": [[t, n] for t, n in self.scale_events],
            "missingSince": self.missing_since,
            "counterfactualReplicas": self.counterfactual,
            "counterfactualPrior": self.counterfactual_prior,
            "lastDecidedAt": self.last_decided_at,
            "recentDemand": [[t, v] for t, v in self.recent_demand],
            "onsetAt": self.onset_at,
            "headroomLog": self.headroom_log,
            "demandLevel": self.demand_level,
            "unreadySince": self.unready_since,
            "drift": {
                "pending": [[p.step_start, p.p50, p.pq] for p in d.pending],
                "outcomes": list(d.outcomes),
                "lastEvaluatedAt": d.last_evaluated_at,
                "drifting": d.drifting,
                "direction": d.direction,
                "since": d.since,
                "goodSince": d.good_since,
                "reason": d.reason,
                "note": d.note,
                "noteAt": d.note_at,
                "step": None if d.step is None else [d.step.step_start, d.step.p50, d.step.pq, d.step.count,
                                                     d.step.total, d.step.total_sq],
                "noiseVar": d.noise_var,
                "run": d.run,
                "runSince": d.run_since,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PlannerState:
        """Restore; ``None`` or ``{}`` is a fresh state. Anything malformed raises ConfigError."""
        if not data:
            return cls()
        try:
            if data.get("version") != STATE_VERSION:
                raise ConfigError(
                    f"status.plannerState: version {data.get('version')!r} is not {STATE_VERSION}; "
                    "clear status.plannerState to start afresh", field="status.plannerState.version")
            d = data.get("drift") or {}
            strategy = str(data.get("strategy", ""))
            if strategy not in ("", *STRATEGIES):
                raise ValueError(f"unknown strategy {strategy!r}")
            direction = d.get("direction")
            if direction not in (None, "under-forecast", "over-forecast"):
                raise ValueError(f"unknown drift direction {direction!r}")
            return cls(
                strategy=strategy,
                strategy_since=_opt_time(data.get("strategySince")),
                recommendations=tuple((_time(t), int(r)) for t, r in data.get("recommendations", ())),
                scale_events=tuple((_time(t), int(n)) for t, n in data.get("scaleEvents", ())),
                missing_since=_opt_time(data.get("missingSince")),
                counterfactual=_opt_count(data.get("counterfactualReplicas")),
                counterfactual_prior=_opt_count(data.get("counterfactualPrior")),
                last_decided_at=_opt_time(data.get("lastDecidedAt")),
                recent_demand=tuple((_time(t), _demand(v)) for t, v in data.get("recentDemand", ())),
                onset_at=_opt_time(data.get("onsetAt")),
                headroom_log=_non_negative(data.get("headroomLog", 0.0), "headroomLog"),
                demand_level=None if data.get("demandLevel") is None else _non_negative(data.get("demandLevel"),
                                                                                        "demandLevel"),
                unready_since=_opt_time(data.get("unreadySince")),
                drift=DriftState(
                    pending=tuple(
                        PendingForecast(_time(s), None if p50 is None else float(p50), float(pq))
                        for s, p50, pq in d.get("pending", ())
                    ),
                    outcomes=tuple(int(o) for o in d.get("outcomes", ())),
                    last_evaluated_at=_opt_time(d.get("lastEvaluatedAt")),
                    drifting=bool(d.get("drifting", False)),
                    direction=direction,
                    since=_opt_time(d.get("since")),
                    good_since=_opt_time(d.get("goodSince")),
                    reason=_opt_str(d.get("reason")),
                    note=_opt_str(d.get("note")),
                    note_at=_opt_time(d.get("noteAt")),
                    step=_step(d.get("step")),
                    noise_var=None if d.get("noiseVar") is None else _finite(d.get("noiseVar")),
                    run=int(d.get("run", 0)),
                    run_since=_opt_time(d.get("runSince")),
                ),
            )
        except ConfigError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(
                f"status.plannerState is malformed ({exc}); clear status.plannerState to start afresh",
                field="status.plannerState",
            ) from exc


def _time(v: Any) -> float:
    t = float(v)
    if not math.isfinite(t):
        raise ValueError(f"time {v!r} is not finite")
    return t


def _finite(v: Any) -> float:
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"{v!r} is not finite")
    return f


def _demand(v: Any) -> float:
    f = _finite(v)
    if f < 0:
        raise ValueError(f"recentDemand {v!r} is negative")
    return f


def _non_negative(v: Any, name: str) -> float:
    f = float(v)
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{name} {v!r} is not a finite number ≥ 0")
    return f


def _step(v: Any) -> StepAccumulator | None:
    if v is None:
        return None
    start, p50, pq, count, total, total_sq = v
    return StepAccumulator(_time(start), None if p50 is None else float(p50), float(pq), int(count),
                           _finite(total), _finite(total_sq))


def _opt_time(v: Any) -> float | None:
    return None if v is None else _time(v)


def _opt_count(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 0:
        raise ValueError(f"counterfactualReplicas {v!r} is not a whole number ≥ 0")
    return int(v)


def _opt_str(v: Any) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{v!r} is not a string")
    return v
