"""Value types shared by every part: what a forecast and a demand sample are.

The core (this package, with ``errors``, ``clock``, ``series``, ``spec`` and
``yaml_input``) imports nothing above it; forecasting, policy, sources and kube
build on it (the layers are checked by import-linter: ``.importlinter``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from predictive_scaler.errors import ModelError

__all__ = ["DemandSample", "Forecast"]


@dataclass(frozen=True)
class Forecast:
    """Quantiles of demand for each of the ``horizon_steps`` steps after ``issued_at``.

    ``values[k, h]`` is quantile ``quantiles[k]`` of the step starting at
    ``issued_at + (h + 1) * step`` — ``issued_at`` is the start of the last
    observed step. Values are non-negative, finite and non-decreasing in k.
    """

    issued_at: pd.Timestamp
    step_seconds: int
    quantiles: tuple[float, ...]
    values: np.ndarray
    model: str

    def __post_init__(self) -> None:
        vals = np.array(self.values, dtype=float, copy=True)
        if vals.ndim != 2 or vals.shape[0] != len(self.quantiles):
            raise ModelError(
                f"forecast from {self.model}: values shape {vals.shape} does not match "
                f"{len(self.quantiles)} quantiles"
            )
        # Enforce the invariants here, once, so no model can break them:
        # finite, non-negative, and monotone in the quantile (no crossing).
        vals = np.nan_to_num(vals, nan=0.0, posinf=np.finfo(float).max / 4, neginf=0.0)
        vals = np.maximum(vals, 0.0)
        vals = np.maximum.accumulate(vals, axis=0)
        vals.flags.writeable = False
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "quantiles", tuple(float(q) for q in self.quantiles))
        ts = pd.Timestamp(self.issued_at)
        object.__setattr__(self, "issued_at", ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC"))

    @property
    def horizon_steps(self) -> int:
        return int(self.values.shape[1])

    def quantile(self, q: float) -> np.ndarray:
        """The row for probability ``q`` (must be one that was requested)."""
        for k, have in enumerate(self.quantiles):
            if abs(have - q) < 1e-9:
                return self.values[k]
        raise ModelError(f"forecast from {self.model} has quantiles {self.quantiles}, not {q}")

    def times(self) -> pd.DatetimeIndex:
        """Start of each forecast step."""
        step = pd.Timedelta(seconds=self.step_seconds)
        return pd.date_range(self.issued_at + step, periods=self.horizon_steps, freq=step)

    def to_dict(self) -> dict[str, Any]:
        return {
            "issued_at": self.issued_at.isoformat(),
            "step_seconds": self.step_seconds,
            "model": self.model,
            "quantiles": {f"{q:g}": [float(v) for v in self.quantile(q)] for q in self.quantiles},
        }


@dataclass(frozen=True)
class DemandSample:
    """Total demand now (req/s or busy GPUs) and when it was observed.

    ``observed_at`` is when the oldest sample behind ``value`` was taken (None:
    unknown, taken as fresh). ``value`` is NaN when missing — never 0 — and
    ``missing_reason`` then says why; the planner reads NaN as missing and holds.
    """

    value: float
    observed_at: datetime | None = None
    missing_reason: str = ""

    @property
    def missing(self) -> bool:
        return not math.isfinite(self.value)

    @classmethod
    def absent(cls, reason: str, observed_at: datetime | None = None) -> DemandSample:
        return cls(value=math.nan, observed_at=observed_at, missing_reason=reason)
