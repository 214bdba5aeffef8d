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
from typing import Any, ClassVar, Protocol

from predictive_scaler.core.values import Forecast
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

    def issue(self, window: Series, quantiles: tuple[float, ...], values: Any) -> Forecast:
        """The :class:`Forecast` this model issues at the last step of ``window``."""
        return Forecast(issued_at=window.last_time, step_seconds=self.step_seconds,
                        quantiles=quantiles, values=values, model=self.kind)


class Forecaster(Protocol):
    """Something that learns a :class:`FittedModel` from history."""

    kind: str

    def fit(self, history: Series) -> FittedModel: ...
