"""The one contract every forecaster follows.

``Forecaster.fit(history) -> FittedModel``; ``FittedModel.forecast(recent,
horizon_steps, quantiles) -> Forecast``. A forecast issued after the last step
of ``recent`` depends only on the fitted model's parameters and on ``recent``:
nothing else is remembered between calls, so the controller can re-derive any
forecast after a restart (filter state may be cached, but only as a cache).

Quantiles are probabilities (0.5 is the median, 0.95 the P95), never central
interval levels.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd

from predictive_scaler.errors import ModelError
from predictive_scaler.series import Series

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.95)


def check_quantiles(quantiles: Sequence[float]) -> tuple[float, ...]:
    qs = tuple(float(q) for q in quantiles)
    if not qs:
        raise ModelError("no quantiles requested; ask for at least one probability, e.g. 0.5,0.95")
    for q in qs:
        if not (0.0 < q < 1.0) or not math.isfinite(q):
            raise ModelError(f"quantile {q!r} is not a probability in (0, 1); write e.g. 0.95 for the P95")
    if list(qs) != sorted(set(qs)):
        raise ModelError(f"quantiles {qs} must be distinct and increasing, e.g. 0.5,0.95")
    return qs


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


class FittedModel(ABC):
    """A trained model: parameters only, serialisable as JSON (never pickle)."""

    #: Registry name of the model kind, e.g. "arima", "prophet", "persistence".
    kind: ClassVar[str]
    #: The grid step, in seconds, the model was trained at.
    step_seconds: int

    @abstractmethod
    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        """Quantiles for the ``horizon_steps`` steps after the last step of ``recent``."""

    @abstractmethod
    def to_params(self) -> dict[str, Any]:
        """JSON-able parameters; ``from_params(to_params())`` rebuilds an equal model."""

    @classmethod
    @abstractmethod
    def from_params(cls, params: Mapping[str, Any]) -> FittedModel:
        """Rebuild from :meth:`to_params`; raise :class:`ModelError` on anything invalid."""


class Forecaster(Protocol):
    """Something that learns a :class:`FittedModel` from history."""

    kind: str

    def fit(self, history: Series) -> FittedModel: ...
