"""The backtest's protocol and records: the trace cut into training and evaluation, what a run keeps.

Shared by the runner, the predictive policy's adapters and the frontier (a small module of
values, so none of them imports another to reach these).

Protocol: the first ``training`` of the trace (14 days; 7 for traces shorter
than 21 days) is history only — it sizes the replicas (``peak_replicas``),
trains the first model and the Holt-Winters peer. The rest is walked forward
tick by tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd

from predictive_scaler.backtest import peer_policies
from predictive_scaler.backtest.scenario import Scenario, build_spec
from predictive_scaler.backtest.simulator import Demand
from predictive_scaler.errors import ConfigError, InsufficientHistoryError
from predictive_scaler.forecasting.walkforward import leading_idle_steps
from predictive_scaler.series import Series, format_duration
from predictive_scaler.spec import DEFAULT_MODEL_STEP, ScalerSpec

__all__ = [
    "ForecastRecord",
    "ModelEvent",
    "PEAK_FACTOR_QUANTILE",
    "Progress",
    "Setup",
    "intra_step_peak_factor",
    "prepare",
]

#: A tick counter (the CLI's progress bar).
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Setup:
    """The trace cut into training and evaluation, on the simulation grid."""

    trace: Series
    scenario: Scenario
    training: timedelta
    eval_start: pd.Timestamp
    tick_s: int
    control_every: int
    model_step: int
    capacity_per_replica: float
    peak_replicas: int
    max_replicas: int
    demand: Demand
    #: Trace values of the training window (its own step).
    training_values: np.ndarray
    #: The PredictiveScaler spec the predictive policy (and the reactive peer's HPA rule) runs with.
    spec: ScalerSpec

    @property
    def bounds(self) -> peer_policies.Bounds:
        return peer_policies.Bounds(self.scenario.min_replicas, self.max_replicas)

    @property
    def n_ticks(self) -> int:
        return len(self.demand)

    def tick_time(self, i: int) -> pd.Timestamp:
        return self.eval_start + pd.Timedelta(seconds=i * self.tick_s)

    def describe(self) -> dict[str, Any]:
        return {
            "trace": self.trace.source or self.trace.name,
            "trace_step": format_duration(self.trace.step),
            "training": format_duration(self.training),
            "evaluation_start": self.eval_start.isoformat(),
            "evaluation": format_duration(timedelta(seconds=self.n_ticks * self.tick_s)),
            "tick": f"{self.tick_s}s",
            "model_step": f"{self.model_step}s",
            "capacity_per_replica": self.capacity_per_replica,
            "peak_replicas": self.peak_replicas,
            "max_replicas": self.max_replicas,
            "measurement": self.measurement(),
        }

    def measurement(self) -> dict[str, Any]:
        """The measurement chain the policies but the oracle saw demand through, as it ran on this trace."""
        chain, step, delay = self.scenario.measurement, self.trace.step_seconds, self.scenario.cluster.metrics_delay_s
        out: dict[str, Any] = {
            **chain.to_dict(),
            "delay": f"{delay:g}s",
            "reconcile_interval": format_duration(self.scenario.control_period),
        }
        if chain.exact:
            out["seen"] = "each trace step's exact value, delay late (no controller sees this)"
            return out
        window = chain.window_for(step)
        out["effective_rate_window"] = format_duration(timedelta(seconds=window))
        out["seen"] = "mean demand over the effective window ending at the last scrape at or before reconcile time − delay"
        if window > chain.rate_window_s:
            out["seen"] += (f"; the window is widened to the {format_duration(self.trace.step)} trace step "
                            "(a trace value is its step's mean: a shorter window would resolve what the trace does not hold)")
        return out


def prepare(trace: Series, scenario: Scenario) -> Setup:
    """Cut ``trace`` per the scenario's protocol and size the replicas from the training window only."""
    span = trace.span
    if scenario.training is not None:
        training = scenario.training
    elif span >= timedelta(days=21):
        training = timedelta(days=14)
    else:
        training = timedelta(days=7)
    if span < training + timedelta(days=1):
        raise InsufficientHistoryError(
            f"trace {trace.name!r} spans {span}; the backtest needs the {format_duration(training)} training "
            f"window plus at least 1 day to evaluate — use a trace of at least {format_duration(training + timedelta(days=1))}"
            + (", or a shorter training window in the scenario" if scenario.training is not None else "")
        )
    if training.total_seconds() % trace.step_seconds:
        raise ConfigError(f"training window {format_duration(training)} is not a multiple of the trace step", field="training")
    train_steps = int(training.total_seconds() // trace.step_seconds)
    training_values = np.asarray(trace.values[:train_steps], dtype=float)
    eval_values = np.asarray(trace.values[train_steps:], dtype=float)
    if scenario.evaluation is not None:
        eval_values = eval_values[: max(1, int(scenario.evaluation.total_seconds() // trace.step_seconds))]
    if not np.isfinite(training_values).any():
        raise InsufficientHistoryError(f"trace {trace.name!r}: the training window has no observations")

    cp = scenario.control_period_s
    tick = math.gcd(cp, trace.step_seconds)
    model_step = max(DEFAULT_MODEL_STEP, trace.step_seconds)
    if model_step % trace.step_seconds:
        model_step = trace.step_seconds

    if scenario.capacity_per_replica is not None:
        capacity = float(scenario.capacity_per_replica)
        p95 = float(np.nanpercentile(training_values, 95))
        peak = max(1, int(math.ceil(p95 / capacity - 1e-9)))
    else:
        assert scenario.peak_replicas is not None
        peak = scenario.peak_replicas
        p95 = float(np.nanpercentile(training_values, 95))
        if not p95 > 0:
            # A service idle most of the window (launched inside it): sized on its traffic since.
            live = training_values[min(leading_idle_steps(training_values), training_values.size - 1):]
            p95 = float(np.nanpercentile(live, 95)) if np.isfinite(live).any() else p95
        if not p95 > 0:
            raise InsufficientHistoryError(
                f"trace {trace.name!r}: the P95 of the training window is {p95:g}; cannot size replicas from it — "
                "give capacity_per_replica instead"
            )
        capacity = p95 / peak
    values = np.repeat(eval_values, trace.step_seconds // tick)
    max_replicas = scenario.resolved_max_replicas(peak)
    return Setup(
        trace=trace,
        scenario=scenario,
        training=training,
        eval_start=trace.start + pd.Timedelta(training),
        tick_s=tick,
        control_every=cp // tick,
        model_step=model_step,
        capacity_per_replica=capacity,
        peak_replicas=peak,
        max_replicas=max_replicas,
        demand=Demand(values, tick, capacity),
        training_values=training_values,
        spec=build_spec(scenario, capacity=capacity, max_replicas=max_replicas, model_step=model_step,
                        peak_factor=intra_step_peak_factor(training_values, trace.step_seconds, model_step),
                        trace_step=trace.step_seconds),
    )


#: Quantile of (demand ÷ its model-step mean) taken as the intra-step peak factor.
PEAK_FACTOR_QUANTILE = 0.8


def intra_step_peak_factor(training_values: np.ndarray, trace_step: int, model_step: int,
                           quantile: float = PEAK_FACTOR_QUANTILE) -> float:
    """How far per-sample demand runs above its model step's mean, from the training window only.

    The forecast is of step means; the simulator serves every sample. The factor is
    the ``quantile`` of sample ÷ step mean over complete steps with a positive mean
    (≥ 1; 1 when the trace is no finer than the model step). Nothing after the
    training window is read.
    """
    per_step = model_step // trace_step
    if per_step <= 1:
        return 1.0
    n = training_values.size // per_step * per_step
    steps = np.asarray(training_values[:n], dtype=float).reshape(-1, per_step)
    # A step wholly inside a gap has no mean (NaN), without nanmean's warning for it.
    counts = np.isfinite(steps).sum(axis=1)
    means = np.where(counts > 0, np.nansum(steps, axis=1) / np.maximum(counts, 1), np.nan)
    ok = np.isfinite(means) & (means > 0)
    ratios = steps[ok] / means[ok, None]
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return 1.0
    return round(max(1.0, float(np.quantile(ratios, quantile))), 3)


@dataclass(frozen=True)
class ModelEvent:
    """One weekly retraining: what was trained and whether it replaced the serving model."""

    at: str
    kind: str
    promoted: bool
    reason: str
    fit_seconds: float


@dataclass(frozen=True)
class ForecastRecord:
    """The forecasts the predictive policy acted on, one per model step."""

    times: pd.DatetimeIndex  # issued_at (start of the last observed step)
    step_seconds: int
    quantiles: tuple[float, ...]
    values: np.ndarray  # [n, k, h]
