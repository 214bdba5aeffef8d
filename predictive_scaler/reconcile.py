"""One reconcile step over ports: the code path the controller and the backtest share.

read demand and recent history (MetricsPort) → forecast (ModelPort, once per
new model step) → observe the cluster (ClusterPort) → plan (pure) → act (unless
``mode: forecast-only``) → return the decision, the new planner state, events
and status conditions to persist.

Nothing about Kubernetes, Prometheus or kopf is imported here. Failures map as
the planner expects: a :class:`SourceError` is missing data, a :class:`ModelError`
is a missing/invalid model (reactive). A :class:`ClusterError` from observe/apply
propagates unchanged: retries belong to the adapter or the controller, never change
the strategy, and re-running the step with the same state is harmless (deciding
twice equals deciding once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from predictive_scaler.clock import Clock
from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.errors import ModelError, SourceError
from predictive_scaler.policy import explain
from predictive_scaler.policy.budget import ClusterShare
from predictive_scaler.policy.explain import Condition, Event
from predictive_scaler.policy.planner import ClusterState, Decision, plan
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.series import Series
from predictive_scaler.spec import DEFAULT_RECENT_WINDOW_SECONDS, ScalerSpec

__all__ = ["ClusterPort", "MetricsPort", "ModelPort", "ReconcileResult", "Reconciler"]


class MetricsPort(Protocol):
    def demand_now(self, now: datetime) -> DemandSample:
        """Total demand now; raise SourceError when the source fails or answers badly."""
        ...

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        """The complete ``step_seconds`` steps in ``(now - window, now]``; gaps are NaN."""
        ...


class ModelPort(Protocol):
    def forecast(self, recent: Series, now: datetime) -> Forecast:
        """Quantiles over the horizon after ``recent``; raise ModelError when missing/invalid."""
        ...

    @property
    def version(self) -> str | None:
        """Version of the model being served (None when there is none)."""
        ...

    @property
    def step_seconds(self) -> int | None:
        """Seconds per step of the model being served (None: no model yet; the spec's step is used)."""
        ...

    @property
    def window_steps(self) -> int | None:
        """Steps of recent history the model reads (None: it does not say; the default window is used)."""
        ...


class ClusterPort(Protocol):
    def observe(self, now: datetime) -> ClusterState: ...

    def apply(self, decision: Decision, now: datetime) -> None:
        """Scale the target and size the placeholders; raise ClusterError on failure."""
        ...


@dataclass(frozen=True)
class ReconcileResult:
    now: datetime
    decision: Decision
    state: PlannerState
    forecast: Forecast | None
    demand: DemandSample | None
    cluster: ClusterState
    events: tuple[Event, ...]
    conditions: tuple[Condition, ...]
    applied: bool
    model_version: str | None


class Reconciler:
    """Runs :meth:`step` once per control period; holds only a re-derivable forecast cache."""

    def __init__(self, spec: ScalerSpec, metrics: MetricsPort, model: ModelPort, cluster: ClusterPort,
                 clock: Clock) -> None:
        self.spec = spec
        self.metrics = metrics
        self.model = model
        self.cluster = cluster
        self.clock = clock
        self._cache_key: tuple[str | None, int, float] | None = None
        self._cached: Forecast | None = None

    @property
    def model_step_seconds(self) -> int:
        step = self.model.step_seconds
        return int(step) if step is not None and step > 0 else self.spec.model.step_seconds

    def step(self, state: PlannerState, *, cluster_share: ClusterShare | None = None,
             cluster: ClusterPort | None = None) -> ReconcileResult:
        """One reconcile. ``cluster_share``: what the cluster-wide budget leaves this scaler now (None: no cap).
        ``cluster``: the port this period observes and acts through (the controller builds one per
        reconcile, since a port remembers what it observed); None: the one given at construction."""
        port = self.cluster if cluster is None else cluster
        now = self.clock.now()
        metrics_problem = None
        demand: DemandSample | None
        try:
            demand = self.metrics.demand_now(now)
        except SourceError as exc:
            demand, metrics_problem = None, f"metrics unavailable: {exc}"
        forecast, forecast_problem = self._forecast(now)
        observed = port.observe(now)
        decision, new_state = plan(self.spec, forecast, demand, observed, state, now,
                                   forecast_problem=forecast_problem, metrics_problem=metrics_problem,
                                   cluster_share=cluster_share)
        applied = False
        if self.spec.mode == "scale":
            port.apply(decision, now)
            applied = True
        return ReconcileResult(
            now=now, decision=decision, state=new_state, forecast=forecast, demand=demand,
            cluster=observed, events=self._events(decision, state, observed),
            conditions=self._conditions(decision, applied), applied=applied,
            model_version=self._version(),
        )

    # -- forecast, once per model step ------------------------------------------------------
    def _version(self) -> str | None:
        try:
            return self.model.version
        except ModelError:
            return None

    @property
    def recent_window(self) -> timedelta:
        """History handed to the model: the spec's window, else what the model reads, else 7 days."""
        if self.spec.model.recent_window_seconds is not None:
            return timedelta(seconds=self.spec.model.recent_window_seconds)
        steps = self.model.window_steps
        if steps is not None and steps > 0:
            return timedelta(seconds=steps * self.model_step_seconds)
        return timedelta(seconds=DEFAULT_RECENT_WINDOW_SECONDS)

    def _forecast(self, now: datetime) -> tuple[Forecast | None, str | None]:
        # Keyed on the last *complete* step of data (the forecast's issued_at), not on the step
        # ``now`` falls in: with a metrics delay the step that just ended is not observable at
        # its first tick, and a cache keyed on the clock would serve a one-step-old forecast for
        # the whole step. History is re-read only while a newer step could have completed.
        step = self.model_step_seconds
        version = self._version()
        cached, key = self._cached, self._cache_key
        # Reused only while ``now`` lies in the step after the cached data; a clock that jumped
        # back before it re-reads (the cached forecast would be from the clock's future).
        if (cached is not None and key is not None and key[:2] == (version, step)
                and key[2] + step <= now.timestamp() < key[2] + 2 * step):
            return cached, None
        try:
            recent = self.metrics.recent(now, self.recent_window, step)
        except SourceError as exc:
            return None, f"no recent history for the model ({exc})"
        key = (version, step, recent.last_time.timestamp() if len(recent) else -math.inf)
        if key == self._cache_key and cached is not None:
            return cached, None  # no new step of data yet: the forecast cannot change
        try:
            forecast = self.model.forecast(recent, now)
        except ModelError as exc:
            return None, f"model invalid: {exc}"
        self._cache_key, self._cached = key, forecast
        return forecast, None

    # -- reporting: the one rendering of a decision, in policy/explain.py --------------------------
    def _events(self, d: Decision, before: PlannerState, cluster: ClusterState) -> tuple[Event, ...]:
        return explain.events(d, before.strategy, cluster, self.spec)

    def _conditions(self, d: Decision, applied: bool) -> tuple[Condition, ...]:
        return explain.conditions(d, applied, self.spec.mode)
