"""The series a shadow report compares (docs/shadow.md), pulled from Prometheus on one grid.

Each series is named by one or more PromQL queries, tried in order: the first that holds a
present value anywhere in the window is used (kube-state-metrics' series first, the
controller's own after), and which one answered is returned with the values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from predictive_scaler.series import Series
from predictive_scaler.sources.dcgm import escape_label_value
from predictive_scaler.sources.history import pull_history
from predictive_scaler.sources.prometheus import PrometheusSource

#: OpenCost's per-node GPU price (its exporter's name).
OPENCOST_GPU_PRICE = "node_gpu_hourly_cost"


@dataclass(frozen=True)
class Pulled:
    """One series on the grid, and the query that answered (None: none did; all NaN)."""

    series: Series
    query: str | None


def shadow_queries(namespace: str, scaler: str, target_kind: str, target: str,
                   price_query: str | None = None) -> dict[str, tuple[str, ...]]:
    """The queries of each compared series, kube-state-metrics' first where it has the target's kind."""
    ns, sc, tg = (escape_label_value(v) for v in (namespace, scaler, target))
    ours = f'namespace="{ns}",scaler="{sc}"'
    ksm: dict[str, tuple[str, ...]] = {"yours_replicas": (), "yours_ready": ()}
    if target_kind == "Deployment":
        where = f'namespace="{ns}",deployment="{tg}"'
        ksm = {"yours_replicas": (f"max(kube_deployment_spec_replicas{{{where}}})",),
               "yours_ready": (f"max(kube_deployment_status_replicas_ready{{{where}}})",)}
    elif target_kind == "StatefulSet":
        where = f'namespace="{ns}",statefulset="{tg}"'
        ksm = {"yours_replicas": (f"max(kube_statefulset_replicas{{{where}}})",),
               "yours_ready": (f"max(kube_statefulset_status_replicas_ready{{{where}}})",)}
    return {
        "yours_replicas": (*ksm["yours_replicas"], f"max(predictive_scaler_target_replicas{{{ours}}})"),
        "yours_ready": (*ksm["yours_ready"], f"max(predictive_scaler_current_replicas{{{ours}}})"),
        "ours_replicas": (f"max(predictive_scaler_desired_replicas{{{ours}}})",),
        "ours_placeholder_gpus": (f"max(predictive_scaler_planned_placeholder_gpus{{{ours}}})",),
        "price": (price_query or f"avg({OPENCOST_GPU_PRICE})",),
    }


def pull_shadow(source: PrometheusSource, queries: Mapping[str, Sequence[str]], start: datetime, end: datetime,
                step_s: int) -> dict[str, Pulled]:
    """Each named series over [start, end] at ``step_s`` (gaps NaN), from the first query that answered."""
    out: dict[str, Pulled] = {}
    for name, candidates in queries.items():
        found: Pulled | None = None
        for query in candidates:
            series = pull_history(source, query, start, end, step_s, min_history=None, name=name)
            if np.isfinite(series.values).any():
                found = Pulled(series, query)
                break
            found = found or Pulled(series, None)
        assert found is not None, f"no query for {name}"
        out[name] = found
    return out
