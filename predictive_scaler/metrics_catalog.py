"""The Prometheus metrics the controller exports: one catalogue.

The controller registers exactly these; the alerts (deploy/…/prometheusrule)
and the Grafana dashboard may only reference names listed here — a test
compares them, so a renamed metric cannot silently break a page or an alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter", "histogram"]

#: Labels every per-scaler metric carries.
SCALER_LABELS: tuple[str, ...] = ("namespace", "scaler")


@dataclass(frozen=True)
class MetricDef:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = SCALER_LABELS


CATALOG: tuple[MetricDef, ...] = (
    MetricDef("predictive_scaler_forecast_demand", "gauge",
              "Forecast demand (the scaler's demand unit) at the end of the horizon, by quantile.",
              SCALER_LABELS + ("quantile",)),
    MetricDef("predictive_scaler_forecast_horizon_seconds", "gauge",
              "How far ahead of its issue time forecast_demand looks (the forecast's horizon); the dashboard "
              "shifts the forecast by it to line it up with the demand it predicted."),
    MetricDef("predictive_scaler_observed_demand", "gauge",
              "Latest valid observed demand (the scaler's demand unit)."),
    MetricDef("predictive_scaler_forecast_coverage", "gauge",
              "Rolling share of realised demand at or under the forecast planning quantile (target: the quantile)."),
    MetricDef("predictive_scaler_forecast_pinball_loss", "gauge",
              "Rolling pinball loss of the planning quantile against realised demand."),
    MetricDef("predictive_scaler_desired_replicas", "gauge", "Replicas the scaler decided on."),
    MetricDef("predictive_scaler_current_replicas", "gauge", "Ready replicas of the target."),
    MetricDef("predictive_scaler_placeholder_gpus", "gauge", "GPUs held by placeholder (prewarm) pods."),
    MetricDef("predictive_scaler_strategy", "gauge",
              "1 for the strategy in use (predictive, reactive, hold), 0 for the others.",
              SCALER_LABELS + ("strategy",)),
    MetricDef("predictive_scaler_mode", "gauge",
              "1 for the configured mode (forecast-only, scale, keda), 0 for the others.",
              SCALER_LABELS + ("mode",)),
    MetricDef("predictive_scaler_drift_active", "gauge", "1 while forecast drift keeps the scaler reactive."),
    MetricDef("predictive_scaler_budget_gpus_in_use", "gauge", "Speculative GPUs in use against the prewarm budget."),
    MetricDef("predictive_scaler_budget_gpus_limit", "gauge", "The prewarm budget in GPUs (after the cluster-wide cap)."),
    MetricDef("predictive_scaler_budget_limited", "gauge", "1 when the budget cut the speculative capacity this period."),
    MetricDef("predictive_scaler_speculative_cost_per_hour", "gauge",
              "Cost per hour of the speculative capacity now (currency label).", SCALER_LABELS + ("currency",)),
    MetricDef("predictive_scaler_prewarm_cost_total", "counter",
              "Accumulated cost of speculative (prewarm) capacity.", SCALER_LABELS + ("currency",)),
    MetricDef("predictive_scaler_wasted_prewarm_cost_total", "counter",
              "Accumulated cost of speculative capacity that no real demand used (estimate).",
              SCALER_LABELS + ("currency",)),
    MetricDef("predictive_scaler_last_forecast_timestamp_seconds", "gauge",
              "Unix time of the newest forecast."),
    MetricDef("predictive_scaler_model_trained_timestamp_seconds", "gauge",
              "Unix time the serving model's training window ended."),
    MetricDef("predictive_scaler_last_reconcile_timestamp_seconds", "gauge",
              "Unix time of the last completed reconcile."),
    MetricDef("predictive_scaler_reconcile_duration_seconds", "histogram", "Duration of one reconcile step."),
    MetricDef("predictive_scaler_reconcile_errors_total", "counter",
              "Reconcile errors by kind (metrics, model, cluster, config, internal).", SCALER_LABELS + ("kind",)),
    MetricDef("predictive_scaler_api_retries_total", "counter",
              "Kubernetes API calls retried after an error answer, by kind (conflict, throttled, server-error, "
              "unreachable), whether the retry then succeeded or not.", SCALER_LABELS + ("kind",)),
    # Shadow mode (docs/shadow.md): what the live autoscaler did beside what this scaler would have done.
    MetricDef("predictive_scaler_target_replicas", "gauge",
              "Replicas the target's spec asks for now, whoever set them (in forecast-only: the live autoscaler)."),
    MetricDef("predictive_scaler_planned_placeholder_gpus", "gauge",
              "Placeholder (prewarm) GPUs the scaler decided on, held or not (forecast-only holds none)."),
    MetricDef("predictive_scaler_gpus_per_replica", "gauge", "GPUs one replica of the target requests."),
    MetricDef("predictive_scaler_live_autoscaler", "gauge",
              "1 for each other autoscaler (HPA, ScaledObject) that scales the target.",
              SCALER_LABELS + ("kind", "autoscaler")),
    # FinOps (docs/finops.md): GPU-hours and their cost, by team and node pool.
    MetricDef("predictive_scaler_gpu_hours_billed_total", "counter",
              "GPU-hours the target's replicas and its placeholders held (billed), by team and node pool.",
              SCALER_LABELS + ("team", "node_pool")),
    MetricDef("predictive_scaler_gpu_hours_used_total", "counter",
              "GPU-hours DCGM saw busy (dcgm-busy-gpus demand only), by team and node pool.",
              SCALER_LABELS + ("team", "node_pool")),
    MetricDef("predictive_scaler_gpu_cost_total", "counter",
              "Cost of the billed GPU-hours at the price in effect, by team and node pool.",
              SCALER_LABELS + ("team", "node_pool", "currency")),
    MetricDef("predictive_scaler_gpu_price_per_hour", "gauge",
              "Price of one GPU-hour the cost is counted at, and where it came from (spec, opencost).",
              SCALER_LABELS + ("currency", "source")),
    # Capacity per replica and GPU waste (docs/gpu-capacity.md).
    MetricDef("predictive_scaler_capacity_per_replica", "gauge",
              "Demand one replica is planned to serve (the demand's unit): requestsPerReplica, or the learned "
              "capacity in use with capacity.learned: serve."),
    MetricDef("predictive_scaler_learned_capacity", "gauge",
              "Demand one replica serves at capacity.slo, as the retraining job last learned it; kind point, or "
              "lower-bound when the knee was never reached.", SCALER_LABELS + ("kind",)),
    MetricDef("predictive_scaler_waste_gpu_hours", "gauge",
              "GPU-hours wasted a day, by kind (cpu-bound, saturated-at-low-load: the serving history of the "
              "last 6 h; idle: the retraining job's report), at the rate seen; only kinds with evidence.",
              SCALER_LABELS + ("kind",)),
    MetricDef("predictive_scaler_waste_cost", "gauge",
              "Cost a day of predictive_scaler_waste_gpu_hours at the spec's price per GPU-hour (none without one).",
              SCALER_LABELS + ("kind", "currency")),
    MetricDef("predictive_scaler_cluster_cache_staleness_seconds", "gauge",
              "Seconds since the watch-fed cluster cache last knew this resource current (0 while its watch is "
              "connected; +Inf before the first list). Above the bound (120 s) no scaler scales down.",
              ("resource",)),
)

NAMES: frozenset[str] = frozenset(m.name for m in CATALOG)

#: Series the PrometheusRule records from the exported ones (deploy/…/prometheusrule.yaml): alerts and the
#: fleet dashboard may read these too.
RECORDED: tuple[str, ...] = (
    "team:predictive_scaler_gpu_cost:increase1d",
    "team_node_pool:predictive_scaler_gpu_hours_billed:increase1d",
    "team_node_pool:predictive_scaler_gpu_hours_used:increase1d",
    "team:predictive_scaler_cost_per_used_gpu_hour:1d",
)


def exported_series_names() -> frozenset[str]:
    """Every series name a scrape can show (histograms expand to _bucket/_sum/_count, counters to _total)."""
    out: set[str] = set()
    for m in CATALOG:
        if m.type == "histogram":
            out.update({f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"})
        else:
            out.add(m.name)
    return frozenset(out)
