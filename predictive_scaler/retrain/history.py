"""Where the job's history comes from: its port, and the Prometheus adapter (``sources/demand.py``'s pull)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from predictive_scaler.retrain.settings import ScalerTarget
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series
from predictive_scaler.spec import ScalerSpec

if TYPE_CHECKING:
    from predictive_scaler.sources.demand import ServingSignals


@dataclass(frozen=True)
class GpuUsage:
    """DCGM history of a target's GPUs on the model grid (each None when nothing reported)."""

    busy_gpus: Series | None = None
    mean_utilisation: Series | None = None
    idle_gpus: Series | None = None
    allocated_gpus: Series | None = None


class HistoryPort(Protocol):
    """Where the job's history comes from (Prometheus in production, fakes in tests)."""

    def demand(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int,
               *, min_history: timedelta | None, max_missing_fraction: float | None) -> Series:
        """Demand over [start, end] (InsufficientHistoryError / DataError / SourceError when unusable)."""
        ...

    def gpu_usage(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int) -> GpuUsage:
        ...


@runtime_checkable
class ServingPort(Protocol):
    """A history port that also has the server's own serving history (capacity at the SLO is learned from it);
    the backtest's trace replay has none."""

    def serving(self, target: ScalerTarget, start: datetime, end: datetime) -> ServingSignals:
        """Served rate, latency, running batch and GPU utilisation per replica over [start, end]
        (ConfigError without serving queries, DataError / SourceError when unusable)."""
        ...


def demand_query(spec: ScalerSpec, namespace: str) -> str:
    """The PromQL whose history the model learns — the controller's (``sources/demand.py``)."""
    from predictive_scaler.sources.demand import demand_history

    return demand_history(spec, namespace).query


@dataclass
class PrometheusHistory:
    """:class:`HistoryPort` over a :class:`~predictive_scaler.sources.prometheus.PrometheusSource`.

    Picklable (the source's HTTP session is), so worker processes get their own copy.
    """

    source: Any  # PrometheusSource; Any keeps this module free of the requests import at type level

    def demand(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int,
               *, min_history: timedelta | None, max_missing_fraction: float | None) -> Series:
        from predictive_scaler.sources.demand import demand_history

        assert target.spec is not None
        # The serving path's own definition and pull (one-minute values averaged per step).
        return demand_history(target.spec, target.namespace).pull(
            self.source, start, end, step_seconds, min_history=min_history,
            max_missing_fraction=max_missing_fraction, name=target.model_name)

    def serving(self, target: ScalerTarget, start: datetime, end: datetime) -> ServingSignals:
        from predictive_scaler.sources.demand import pull_serving

        assert target.spec is not None
        # The controller's serving queries (sources/demand.py), on the grid of the SLO's windows.
        return pull_serving(self.source, target.spec, target.namespace, start, end)

    def gpu_usage(self, target: ScalerTarget, start: datetime, end: datetime, step_seconds: int) -> GpuUsage:
        from predictive_scaler.sources import dcgm
        from predictive_scaler.sources.history import pull_history

        assert target.spec is not None
        ns, workload = target.namespace, target.spec.target.name
        queries = {
            "busy_gpus": dcgm.busy_gpus(ns, workload),
            # Saturation is judged on the busiest GPU: one idle GPU must not hide a saturated one.
            "mean_utilisation": target.spec.demand.utilization_query
            or f"max({dcgm.GPU_UTIL}{dcgm.pod_selector(ns, workload)})",
            "idle_gpus": dcgm.idle_allocated_gpus(ns, workload),
            "allocated_gpus": dcgm.allocated_gpus(ns, workload),
        }
        out: dict[str, Series | None] = {}
        for key, query in queries.items():
            series = pull_history(self.source, query, start, end, step_seconds, min_history=None, name=key)
            out[key] = series if np.isfinite(series.values).any() else None
        return GpuUsage(**out)


def history_for_scaler(
    source: Any,
    spec: ScalerSpec,
    end: datetime,
    days: float | timedelta,
    *,
    namespace: str = "default",
    step_seconds: int | None = None,
    min_history: timedelta | None = DEFAULT_MIN_HISTORY,
    max_missing_fraction: float | None = None,
) -> Series:
    """The demand history a scaler's model would learn from: ``days`` ending at ``end``, at the model step.

    The same pull the retraining job does — for ``backtest --prometheus URL --scaler FILE.yaml``.
    ``source`` is a :class:`~predictive_scaler.sources.prometheus.PrometheusSource`.
    """
    span = days if isinstance(days, timedelta) else timedelta(days=float(days))
    step = step_seconds or spec.model.step_seconds
    target = ScalerTarget(namespace, spec.target.name, spec)
    return PrometheusHistory(source).demand(target, end - span, end, step, min_history=min_history,
                                            max_missing_fraction=max_missing_fraction)

