"""Shared shape of the forecasters in this package: one causal code path for serving and evaluation.

Every model here implements :meth:`WalkForwardModel.walk_forward`: quantiles
for many forecast origins of one series at once, each using only the
observations up to its origin. :meth:`forecast` (what the controller calls)
is the same code with a single origin — the last step of the recent window —
so an evaluation measures exactly what serving does.
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from predictive_scaler.core.values import Forecast
from predictive_scaler.errors import InsufficientHistoryError, ModelError
from predictive_scaler.forecasting.base import FittedModel, check_quantiles
from predictive_scaler.series import Series

#: Longest horizon a forecast may ask for; stored spreads cover this many minutes.
MAX_HORIZON_SECONDS = 3600


def max_horizon_steps(step_seconds: int) -> int:
    return max(1, -(-MAX_HORIZON_SECONDS // step_seconds))


def on_model_grid(recent: Series, step_seconds: int, model: str) -> Series:
    """``recent`` on the model's grid: finer data is merged, coarser data is refused."""
    if recent.step_seconds == step_seconds:
        return recent
    if recent.step_seconds < step_seconds and step_seconds % recent.step_seconds == 0:
        return recent.resample(step_seconds)
    raise ModelError(
        f"{model} model was trained at a {step_seconds}s step but recent data has a "
        f"{recent.step_seconds}s step; query recent data at {step_seconds}s or finer"
    )


class WalkForwardModel(FittedModel):
    """A fitted model whose forecasts come from :meth:`walk_forward`."""

    kind: ClassVar[str]
    step_seconds: int

    @property
    @abstractmethod
    def window_steps(self) -> int:
        """How many recent steps a forecast reads (older observations are ignored)."""

    @abstractmethod
    def walk_forward(
        self, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
    ) -> np.ndarray:
        """Quantiles, shape (len(origins), len(quantiles), horizon_steps), in demand units.

        ``origins`` are indices into ``series`` of the last observed step; the
        forecast for origin ``t`` reads ``series.values[: t + 1]`` only.
        """

    def forecast(self, recent: Series, horizon_steps: int, quantiles: Sequence[float]) -> Forecast:
        qs = check_quantiles(quantiles)
        if horizon_steps < 1:
            raise ModelError(f"horizon of {horizon_steps} steps; ask for at least one step ahead")
        if len(recent) == 0:
            raise ModelError(f"{self.kind} forecast needs recent observations; got an empty series")
        grid = on_model_grid(recent, self.step_seconds, self.kind)
        window = grid.tail(self.window_steps)
        values = self.walk_forward(window, np.array([len(window) - 1]), horizon_steps, qs)[0]
        require_finite(values, self.kind, window)
        return self.issue(window, qs, values)


def require_finite(values: np.ndarray, kind: str, window: Series) -> None:
    """A served forecast is a number at every step and quantile: NaN (a window with too few
    observations) is no forecast, never a forecast of zero demand."""
    if not np.all(np.isfinite(values)):
        raise too_few_observations(kind, window)


def too_few_observations(kind: str, window: Series) -> ModelError:
    """The refusal of a forecast from ``window``: it holds too few observations."""
    return ModelError(f"{kind} cannot forecast after {window.last_time}: the last {len(window)} steps hold too "
                      "few observations; wait for data or use another model")


def check_origins(series: Series, origins: np.ndarray) -> np.ndarray:
    idx = np.asarray(origins, dtype=int)
    if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(series))):
        raise ModelError(f"forecast origins must be indices into the {len(series)}-step series")
    return idx


#: Recent window handed to models that do not say how much they read.
DEFAULT_WINDOW_STEPS = 7 * 288


def walk_forward(
    model: FittedModel, series: Series, origins: np.ndarray, horizon_steps: int, quantiles: Sequence[float]
) -> np.ndarray:
    """Forecast quantiles at many origins, each from observations up to that origin only.

    Models with a batch path (:class:`WalkForwardModel`) use it; any other
    :class:`FittedModel` is called once per origin on its recent window, which
    is slower but exactly what serving does. Undefined forecasts are NaN.
    """
    idx = check_origins(series, origins)
    batch = getattr(model, "walk_forward", None)
    if batch is not None:
        return np.asarray(batch(series, idx, horizon_steps, quantiles), dtype=float)
    window = int(getattr(model, "window_steps", DEFAULT_WINDOW_STEPS))
    out = np.full((idx.size, len(quantiles), horizon_steps), np.nan)
    for i, t in enumerate(idx):
        recent = series.slice(max(0, int(t) + 1 - window), int(t) + 1)
        try:
            out[i] = model.forecast(recent, horizon_steps, quantiles).values
        except ModelError:
            continue  # undefined here (e.g. no observations in the window): stays NaN
    return out


# -- forecasts shared within one combined forecast ---------------------------------------------

#: Inside :func:`shared_forecasts`: work already done, by (model, series, origins, horizon).
_SHARED: contextvars.ContextVar[dict[tuple[Any, ...], tuple[Series, Any]] | None] = contextvars.ContextVar(
    "shared_forecasts", default=None)


@contextmanager
def shared_forecasts() -> Iterator[None]:
    """Within this block an equal model asked for the same series, origins and horizon again
    reuses its first answer (:func:`shared`). A combination holds the ensemble and, often, the
    ensemble's own ARIMA fit as a member too: without this every served forecast ran that ARIMA's
    Kalman filter twice on the same window. Nested blocks share the outermost one's memo; it is
    dropped on leaving, so nothing outlives one call."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared(model: Hashable, series: Series, origins: np.ndarray, horizon_steps: int,
           compute: Callable[[], M]) -> M:
    """``compute()``, or, inside :func:`shared_forecasts`, what it returned for an equal
    ``model`` (frozen dataclasses compare by their parameters) on this very ``series`` object at
    the same ``origins`` and ``horizon_steps``. Models are deterministic, so sharing changes
    nothing but the time; outside the block it always computes."""
    memo = _SHARED.get()
    if memo is None:
        return compute()
    key = (model, id(series), np.asarray(origins).tobytes(), int(horizon_steps))
    if key in memo:
        return memo[key][1]  # type: ignore[no-any-return]
    value = compute()
    memo[key] = (series, value)  # the series is kept, so its id cannot be reused while the memo lives
    return value


# -- fits shared within a training run ----------------------------------------------------------

V = TypeVar("V")


class SharedResults(Generic[V]):
    """Results computed once and handed to every caller asking for the same key: a small thread-safe
    map forgetting the least recently used beyond ``capacity``. A result is computed outside the
    lock (two threads may both compute one; either is the same, the later is kept); failures are
    not kept."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], V], valid: Callable[[V], bool] | None = None) -> V:
        """The kept result for ``key`` (if ``valid`` accepts it), else ``compute()``, kept."""
        with self._lock:
            if key in self._items and (valid is None or valid(self._items[key])):
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


#: Fits kept (the latest first out): enough for one training run's candidates and ensemble members.
FIT_MEMO_SIZE = 16
_FITS: SharedResults[Any] = SharedResults(FIT_MEMO_SIZE)
M = TypeVar("M")


def history_key(history: Series) -> tuple[Any, ...]:
    """What a fit reads of ``history``: its grid and its exact values (a digest of their bytes)."""
    digest = hashlib.blake2b(np.ascontiguousarray(history.values).tobytes(), digest_size=16).hexdigest()
    return (history.start.value, history.step_seconds, len(history), str(history.value_kind), digest)


def refuse_constant(history: Series, kind: str) -> None:
    """A fit window whose every observation is the same value (a service idle until a launch, a
    stuck metric) holds no level, season or dynamics to learn: a model fitted there forecasts that
    value — zero, a week after the launch — where persistence would follow the traffic at once (a
    week's training with six idle days served a P95 near zero for the whole next week). Raised
    as a refusal, so the candidate is left out and the others serve."""
    values = np.asarray(history.values, dtype=float)
    seen = values[np.isfinite(values)]
    if seen.size and seen.min() == seen.max():
        raise InsufficientHistoryError(
            f"{history.name}: {kind} has nothing to fit — every observation of its {seen.size}-step fit "
            f"window is {seen[0]:g} (idle or stuck); it can be fitted once the series has moved")


def leading_idle_steps(values: np.ndarray) -> int:
    """How many steps the series holds its first observed value before it first moves (missing
    steps inside that stretch count with it); the whole length when it never moves. A service
    idle until its launch has this many steps of history that say nothing of its traffic."""
    v = np.asarray(values, dtype=float)
    seen = np.flatnonzero(np.isfinite(v))
    if seen.size == 0:
        return int(v.size)
    moved = seen[v[seen] != v[seen[0]]]
    return int(moved[0]) if moved.size else int(v.size)


def memoized_fit(forecaster: object, history: Series, fit: Callable[[Series], M]) -> M:
    """``fit(history)``, or the model an identical forecaster (same class and settings, by its
    ``repr``) fitted on the same history before: a training run fits each candidate once, and the
    ensemble's members refitted on the candidates' window are those same fits. Fits are
    deterministic and the models frozen, so sharing one changes nothing but the time; failures
    are not kept. A constant window is refused (:func:`refuse_constant`)."""
    refuse_constant(history, str(getattr(forecaster, "kind", type(forecaster).__name__)))
    key = (type(forecaster).__qualname__, repr(forecaster), history_key(history))
    return _FITS.get(key, lambda: fit(history))  # type: ignore[no-any-return]


def clear_fit_memo() -> None:
    """Forget every kept fit (benchmarks timing cold fits)."""
    _FITS.clear()
