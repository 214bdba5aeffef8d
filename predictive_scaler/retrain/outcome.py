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
