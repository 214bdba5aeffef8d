"""What the retraining job did for one scaler, and why: the job's output, the store's record, the status."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import pandas as pd

Result = Literal["promoted", "kept", "skipped", "failed", "already-done"]
#: Outcomes that finish a scaler for a run: a re-run with the same run id skips them.
DONE: frozenset[str] = frozenset({"promoted", "kept"})


@dataclass(frozen=True)
class ScalerOutcome:
    """What the job did for one scaler, and why (the job's output, the store's record, the status)."""

    key: str
    model: str
    result: Result
    reason: str
    run_id: str
    version: str | None = None
    serving_version: str | None = None
    kind: str | None = None
    seconds: float = 0.0
    #: Pinball/coverage of challenger and serving model on the held-out window.
    comparison: Mapping[str, Any] = field(default_factory=dict)
    capacity: Mapping[str, Any] | None = None
    idle_gpus: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    #: Capacity per replica learned at ``capacity.slo`` from the serving history (:func:`learned_capacity_record`).
    learned_capacity: Mapping[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.result in DONE

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["notes"] = list(self.notes)
        doc["done"] = self.done
        return finite_json(doc)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ScalerOutcome:
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in doc.items() if k in names}
        kwargs["notes"] = tuple(kwargs.get("notes") or ())
        return cls(**kwargs)

    def status(self, now: datetime) -> dict[str, Any]:
        """The ``status.retrain`` block written to the PredictiveScaler (camelCase, small)."""
        doc: dict[str, Any] = {"runId": self.run_id, "time": iso_time(now), "result": self.result,
                               "reason": self.reason}
        if self.serving_version:
            doc["servingVersion"] = self.serving_version
        if self.capacity:
            doc["capacity"] = {"requestsPerReplica": self.capacity["requests_per_replica"],
                               "low": self.capacity["low"], "high": self.capacity["high"]}
        if self.learned_capacity:
            lc = self.learned_capacity
            doc["learnedCapacity"] = {"kind": lc["kind"], "perReplica": lc["value"], "low": lc["low"],
                                      "high": lc["high"], "unit": lc["unit"], "slo": lc["slo"],
                                      "explanation": lc["explanation"]}
        if self.idle_gpus:
            doc["idleGpus"] = {"mean": self.idle_gpus["mean"],
                               "costPerDay": self.idle_gpus["cost_per_day"],
                               "currency": self.idle_gpus["currency"]}
        return finite_json(doc)


def iso_time(ts: datetime | pd.Timestamp) -> str:
    """``2026-01-05T00:00:00Z``: UTC, second resolution as given, a ``Z`` for the zone."""
    t = pd.Timestamp(ts)
    t = t.tz_localize(UTC) if t.tzinfo is None else t.tz_convert(UTC)
    return t.isoformat().replace("+00:00", "Z")


def finite_json(obj: Any) -> Any:
    """JSON-ready: numpy scalars unwrapped, NaN/inf → None, tuples → lists."""
    if isinstance(obj, Mapping):
        return {str(k): finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


#: The most a served capacity moves per retrain: a learned value twice (or half) the one in use is
#: taken in steps, so one odd week of history cannot halve the fleet at once.
MAX_CAPACITY_STEP = 2.0


def learned_capacity_record(kind: str, value: float, low: float, high: float, unit: str, slo: str,
                            explanation: str) -> dict[str, Any]:
    """The learned capacity as the record, the status and the controller read it."""
    return finite_json({"kind": kind, "value": value, "low": low, "high": high, "unit": unit, "slo": slo,
                        "explanation": explanation})


def serve_learned_capacity(in_use: float, learned: Mapping[str, Any], floor: float) -> tuple[float, str]:
    """The capacity per replica to plan on once ``learned`` is known, and why. Pure.

    A point moves the capacity in use at most ×/÷ :data:`MAX_CAPACITY_STEP`. A lower bound says only
    "at least this": it may raise the capacity, never take it below ``floor`` (the configured
    ``requestsPerReplica``) — a short or quiet history must not shrink what one replica is trusted with.
    """
    value = float(learned["value"])
    if not (math.isfinite(value) and value > 0):
        return in_use, f"learned value {value!r} is not a positive number; keeping {in_use:g}"
    want = value
    why = f"learned {learned.get('kind', 'point')} {value:.4g}"
    if learned.get("kind") == "lower-bound" and value < floor:
        want = floor
        why += f" is a lower bound below the configured {floor:g}; the floor stands"
    lo, hi = in_use / MAX_CAPACITY_STEP, in_use * MAX_CAPACITY_STEP
    served = min(max(want, lo), hi)
    if learned.get("kind") == "lower-bound":
        served = max(served, floor)
    if served != want:
        why += f"; moved to {served:.4g} (at most ×{MAX_CAPACITY_STEP:g} or ÷{MAX_CAPACITY_STEP:g} from {in_use:.4g} per retrain)"
    return served, why
