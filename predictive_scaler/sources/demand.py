"""One demand history per scaler: the PromQL and the pull, for serving and for training alike.

The controller (``controller/ports.py``), the retraining job (``retrain``) and
``backtest --prometheus`` all get a scaler's demand from :func:`demand_history`:

- **the query**: ``spec.demand.query``, or — for ``demand.kind: dcgm-busy-gpus``
  without one — the DCGM busy-GPU sum of the target's pods (with the exporter's
  label names), plus a freshness query so a frozen exporter reads as missing;
- **the pull**: :meth:`DemandHistory.pull` evaluates the query every
  :data:`PULL_STEP_SECONDS` and averages the present values into model steps
  (``pull_history(…, average_from=PULL_STEP_SECONDS)``). A user's query
  has a short range (``rate(…[2m])``) chosen for *now*; evaluated once per
  5-minute step it would sample 2 of every 5 minutes, so a model trained that
  way would be served numbers of another kind. Averaged, each model step is the
  mean demand over the step, in training and in serving;
- **freshness**: ``max_age`` and the freshness query, for the instant reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from predictive_scaler.errors import ConfigError
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.history import PULL_STEP_SECONDS, pull_history
from predictive_scaler.sources.prometheus import Combine, PrometheusSource
from predictive_scaler.spec import ScalerSpec

__all__ = ["DemandHistory", "demand_history"]


@dataclass(frozen=True)
class DemandHistory:
    """A scaler's demand as Prometheus holds it: what to ask, and how to pull it onto the model grid."""

    query: str
    freshness_query: str | None
    max_age: timedelta
    name: str
    combine: Combine = "error"

    def pull(self, source: PrometheusSource, start: datetime, end: datetime, step_seconds: int, *,
             min_history: timedelta | None = DEFAULT_MIN_HISTORY, max_missing_fraction: float | None = None,
             name: str | None = None) -> Series:
        """Demand over [start, end] on the ``step_seconds`` grid, averaged from one-minute evaluations."""
        return pull_history(source, self.query, start, end, step_seconds, min_history=min_history,
                            max_missing_fraction=max_missing_fraction, combine=self.combine,
                            name=name or self.name, average_from=PULL_STEP_SECONDS)


def demand_history(spec: ScalerSpec, namespace: str,
                   labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS) -> DemandHistory:
    """The one definition of a scaler's demand history (query, freshness, pull)."""
    demand = spec.demand
    query, freshness = demand.query, None
    if demand.kind == "dcgm-busy-gpus" and query is None:
        query = dcgm.busy_gpus(namespace, spec.target.name, labels)
        # A frozen exporter keeps answering: the oldest GPU sample's age says so.
        freshness = dcgm.freshness(namespace, spec.target.name, labels)
    if query is None:  # ScalerSpec validation makes this unreachable; say what to do anyway
        raise ConfigError("spec.demand.query is required for demand.kind 'requests'", field="spec.demand.query")
    return DemandHistory(query=query, freshness_query=freshness,
                         max_age=timedelta(seconds=demand.max_age_seconds), name=spec.target.name)
