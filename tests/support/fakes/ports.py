"""Fakes of the reconciler's ports, reusable by any test (controller, backtest, CLI).

They are deliberately simple and deterministic: demand is a function of time,
the model forecasts a known level with a known spread, the cluster becomes
ready immediately (or after a delay) and records what it was told.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.errors import ClusterError, ModelError, SourceError
from predictive_scaler.policy.planner import ClusterState, Decision
from predictive_scaler.series import Series

#: One-sided standard normal quantiles, enough for the fakes (no scipy needed).
Z = {0.5: 0.0, 0.9: 1.2816, 0.95: 1.6449, 0.99: 2.3263}


class FakeMetrics:
    """Demand from ``demand(t)`` (t = datetime); ``down=True`` or a None value raises SourceError."""

    def __init__(self, demand: Callable[[datetime], float | None], *, lag_seconds: float = 0.0) -> None:
        self.demand = demand
        self.down = False
        self.lag_seconds = lag_seconds
        self.calls = 0

    def demand_now(self, now: datetime) -> DemandSample:
        self.calls += 1
        if self.down:
            raise SourceError("connection refused to http://prometheus:9090 (fake outage)")
        value = self.demand(now)
        if value is None:
            raise SourceError("query returned an empty result (fake)")
        return DemandSample(float(value), now - timedelta(seconds=self.lag_seconds))

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        if self.down:
            raise SourceError("connection refused to http://prometheus:9090 (fake outage)")
        end = math.floor(now.timestamp() / step_seconds) * step_seconds  # start of the running step
        n = max(1, int(window.total_seconds() // step_seconds))
        starts = [end - (n - i) * step_seconds for i in range(n)]
        values = [self._mean(s, step_seconds) for s in starts]
        return Series(np.array(values, dtype=float), pd.Timestamp(starts[0], unit="s", tz="UTC"), step_seconds)

    def _mean(self, start: float, step: int) -> float:
        t = pd.Timestamp(start + step / 2, unit="s", tz="UTC").to_pydatetime()
        v = self.demand(t)
        return math.nan if v is None else float(v)


class FakeModel:
    """Forecasts ``level(t)`` as the P50 with a normal spread of ``cv`` × level.

    ``broken`` (a message) makes forecast() raise ModelError; ``forecast_calls`` counts fits.
    """

    #: Steps of history the model reads (None: it does not say); a subclass may set it.
    window_steps: int | None = None

    def __init__(self, level: Callable[[datetime], float], *, cv: float = 0.05, horizon_steps: int = 6,
                 step_seconds: int = 300, quantiles: tuple[float, ...] = (0.5, 0.95), version: str = "v1") -> None:
        self.level = level
        self.cv = cv
        self.horizon_steps = horizon_steps
        self.step_seconds = step_seconds
        self.quantiles = quantiles
        self._version: str | None = version
        self.broken: str | None = None
        self.forecast_calls = 0

    @property
    def version(self) -> str | None:
        return self._version

    def forecast(self, recent: Series, now: datetime) -> Forecast:
        self.forecast_calls += 1
        if self.broken:
            raise ModelError(self.broken)
        issued = recent.last_time
        rows = []
        for q in self.quantiles:
            row = []
            for h in range(self.horizon_steps):
                t = (issued + pd.Timedelta(seconds=self.step_seconds * (h + 1.5))).to_pydatetime()
                lvl = self.level(t)
                row.append(lvl * (1 + Z[q] * self.cv))
            rows.append(row)
        return Forecast(issued, self.step_seconds, self.quantiles, np.array(rows), "fake")


@dataclass
class FakeCluster:
    """A cluster that does what it is told; replicas become ready after ``ready_delay`` seconds."""

    desired: int = 1
    ready: int = 1
    placeholder_gpus: int = 0
    free_gpus: int = 0
    ready_delay: float = 0.0
    fail_apply: ClusterError | None = None
    applied: list[tuple[datetime, Decision]] = field(default_factory=list)
    _pending: list[tuple[float, int]] = field(default_factory=list)

    def observe(self, now: datetime) -> ClusterState:
        t = now.timestamp()
        for due, target in list(self._pending):
            if due <= t:
                self.ready = min(target, self.desired)
                self._pending.remove((due, target))
        self.ready = min(self.ready, self.desired)
        return ClusterState(self.desired, self.ready, max(0, self.desired - self.ready),
                            self.placeholder_gpus, self.free_gpus)

    def apply(self, decision: Decision, now: datetime) -> None:
        if self.fail_apply is not None:
            raise self.fail_apply
        self.applied.append((now, decision))
        self.desired = decision.desired_replicas
        self.placeholder_gpus = decision.placeholder_gpus
        if self.ready_delay <= 0:
            self.ready = self.desired
        else:
            self.ready = min(self.ready, self.desired)
            self._pending.append((now.timestamp() + self.ready_delay, self.desired))
