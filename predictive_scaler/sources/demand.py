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

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from predictive_scaler.errors import ConfigError, DataError
from predictive_scaler.series import DEFAULT_MIN_HISTORY, Series
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.dcgm import escape_label_value
from predictive_scaler.sources.history import PULL_STEP_SECONDS, pull_history
from predictive_scaler.sources.prometheus import Combine, PrometheusSource
from predictive_scaler.spec import ScalerSpec

__all__ = ["DemandHistory", "ServingQueries", "ServingSignals", "demand_history", "preset_demand_query",
           "pull_serving", "serving_queries"]


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
    if query is None and demand.preset is not None and demand.kind != "dcgm-busy-gpus":
        query = preset_demand_query(spec, namespace, labels)
        if demand.kind == "concurrency" and demand.preset != "triton":
            # Gauges: a frozen exporter keeps its last value; the oldest pod's sample age says so.
            running = _PRESETS[demand.preset]["running"]
            freshness = f"min(timestamp({running}{dcgm.pod_selector(namespace, spec.target.name, labels)}))"
    if demand.kind == "dcgm-busy-gpus" and query is None:
        query = dcgm.busy_gpus(namespace, spec.target.name, labels)
        # A frozen exporter keeps answering: the oldest GPU sample's age says so.
        freshness = dcgm.freshness(namespace, spec.target.name, labels)
    if query is None:  # ScalerSpec validation makes this unreachable; say what to do anyway
        raise ConfigError(f"spec.demand.query is required for demand.kind {demand.kind!r}", field="spec.demand.query")
    return DemandHistory(query=query, freshness_query=freshness,
                         max_age=timedelta(seconds=demand.max_age_seconds), name=spec.target.name)


# -- presets: what vLLM, TGI and Triton export ----------------------------------------------------
#
# Names are those each server defines, checked against its source:
# - vLLM at commit a6f0308cfe806b7731ad4979c9bea6e470c35efd (vllm/v1/metrics/loggers.py,
#   PrometheusStatLogger): counters vllm:prompt_tokens_total, vllm:generation_tokens_total,
#   vllm:request_success_total; gauges vllm:num_requests_running, vllm:num_requests_waiting;
#   histogram vllm:e2e_request_latency_seconds. Every series carries model_name and engine labels.
# - TGI v3.3.7 (commit db931fcf42da018a3657580c64bf2720f167f9ab: router/src/server.rs,
#   router/src/validation.rs, backends/v3/src/backend.rs and queue.rs), exported by
#   metrics-exporter-prometheus 0.15, which adds no _total to counters: tgi_request_success;
#   histograms tgi_request_duration (s), tgi_request_input_length and tgi_request_generated_tokens
#   (tokens; their _sum counts tokens); gauges tgi_batch_current_size, tgi_queue_size.
# - Triton (its documented metrics: the user guide's metrics page, not checked against its source):
#   nv_inference_request_success,
#   nv_inference_request_duration_us (cumulative µs, so its rate ÷ 1e6 is the mean number of
#   requests in the server: Little's law), nv_inference_exec_count. It exports no token counters.

#: Range of the demand queries a preset writes: two scrapes at 60 s still land in it.
PRESET_RANGE = "2m"
#: Replaced by the learning window in the serving queries (``capacity.slo.windowSeconds``).
WINDOW = "$window"

_PRESETS: dict[str, dict[str, str | None]] = {
    "vllm": {
        "requests": "vllm:request_success_total", "tokens": "vllm:prompt_tokens_total|vllm:generation_tokens_total",
        "running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
        "latency": "vllm:e2e_request_latency_seconds",
    },
    "tgi": {
        # Prompt tokens are counted when a request is admitted, generated ones when it completes: over a
        # demand range the two differ only by the requests in flight at its edges.
        "requests": "tgi_request_success", "tokens": "tgi_request_input_length_sum|tgi_request_generated_tokens_sum",
        "running": "tgi_batch_current_size", "waiting": "tgi_queue_size", "latency": "tgi_request_duration",
    },
    "triton": {"requests": "nv_inference_request_success", "tokens": None, "running": None, "waiting": None,
               "latency": None},
}


def _sel(metric: str, selector: str) -> str:
    """``metric{selector}``, or ``{__name__=~"a|b",selector}`` for several gauges summed as one."""
    if "|" not in metric:
        return metric + selector
    return "{" + f'__name__=~"{escape_label_value(metric)}",' + selector[1:]


def _rate_sum(metrics: str, selector: str, rng: str) -> str:
    """Σ rate over one or more counters. Summed one by one: ``rate`` drops the metric name, so one
    ``rate({__name__=~"a|b"})`` would hold two series with one label set, which Prometheus refuses."""
    return " + ".join(f"sum(rate({m}{selector}[{rng}]))" for m in metrics.split("|"))


def preset_demand_query(spec: ScalerSpec, namespace: str, labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS) -> str:
    """The preset's demand PromQL for the spec's kind: requests/s, tokens/s, or requests in flight."""
    preset, kind = spec.demand.preset, spec.demand.kind
    if preset is None:
        raise ConfigError("spec.demand.preset is not set", field="spec.demand.preset")
    sel = dcgm.pod_selector(namespace, spec.target.name, labels)
    names = _PRESETS[preset]
    if kind == "concurrency":
        if preset == "triton":
            return f"sum(rate(nv_inference_request_duration_us{sel}[{PRESET_RANGE}])) / 1e6"
        in_flight = f"{names['running']}|{names['waiting']}"
        return f"sum({_sel(in_flight, sel)})"
    metric = names["tokens" if kind == "tokens" else "requests"]
    if metric is None:
        raise ConfigError(f"preset {preset!r} exports no token counters; give spec.demand.query",
                          field="spec.demand.preset")
    return _rate_sum(metric, sel, PRESET_RANGE)


@dataclass(frozen=True)
class ServingQueries:
    """The PromQL of what a target served (whole target), with ``$window`` already replaced."""

    served: str
    mean_latency: str
    latency_quantile: str | None
    running: str | None
    #: Serving replicas (pods exporting the server's metrics); None: DCGM's GPUs ÷ gpusPerReplica.
    replicas: str | None
    window_seconds: int


def serving_queries(spec: ScalerSpec, namespace: str, labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS,
                    *, window_seconds: int | None = None, quantile: float = 0.95) -> ServingQueries | None:
    """The served-rate, latency and running-batch queries from ``demand`` (given ones win over the preset's);
    None when neither gives a served rate and a latency."""
    d = spec.demand
    slo = spec.capacity.slo
    width = int(window_seconds or (slo.window_seconds if slo else 60))
    rng = f"{width}s"
    given = {"served": d.served_query, "mean_latency": d.latency_query,
             "latency_quantile": d.latency_quantile_query, "running": d.running_query}
    made: dict[str, str | None] = dict.fromkeys(given)
    replicas = None
    if d.preset is not None:
        sel = dcgm.pod_selector(namespace, spec.target.name, labels)
        names = _PRESETS[d.preset]
        unit = "tokens" if d.kind == "tokens" and names["tokens"] else "requests"
        made["served"] = _rate_sum(str(names[unit]), sel, rng)
        lat = names["latency"]
        if lat is not None:
            made["mean_latency"] = (f"sum(rate({lat}_sum{sel}[{rng}])) / sum(rate({lat}_count{sel}[{rng}]))")
            made["latency_quantile"] = f"histogram_quantile({quantile:g}, sum by (le) (rate({lat}_bucket{sel}[{rng}])))"
        else:  # Triton: cumulative microseconds over completed requests
            made["mean_latency"] = (f"sum(rate(nv_inference_request_duration_us{sel}[{rng}])) / "
                                    f"sum(rate(nv_inference_request_success{sel}[{rng}])) / 1e6")
        if names["running"] is not None:
            made["running"] = f"sum(avg_over_time({names['running']}{sel}[{rng}]))"
        # One series per serving pod: count the pods, not the series (vLLM labels each engine).
        counted = str(names["running"] or names["requests"])
        replicas = f"count(count by ({labels.pod}) ({counted}{sel}))"
    q = {k: (v.replace(WINDOW, rng) if v is not None else made[k]) for k, v in given.items()}
    if q["served"] is None or q["mean_latency"] is None:
        return None
    return ServingQueries(served=q["served"], mean_latency=q["mean_latency"], latency_quantile=q["latency_quantile"],
                          running=q["running"], replicas=replicas, window_seconds=width)


@dataclass(frozen=True)
class ServingSignals:
    """What a target served, per replica, on one grid (each step a window of ``window_seconds``)."""

    served: Series
    mean_latency: Series
    latency_quantile: Series | None
    running: Series | None
    gpu_util: Series | None
    #: Replicas (or GPUs ÷ gpusPerReplica) per step; the whole target's GPUs are ``replicas × gpusPerReplica``.
    replicas: Series
    window_seconds: int


def _scaled(series: Series, values: np.ndarray) -> Series:
    return dataclasses.replace(series, values=np.asarray(values, dtype=float))


def pull_serving(source: PrometheusSource, spec: ScalerSpec, namespace: str, start: datetime, end: datetime, *,
                 labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS, window_seconds: int | None = None,
                 step_seconds: int | None = None) -> ServingSignals:
    """The serving history over [start, end] per replica, on a grid of a third of the window (overlapping
    windows, as ``query_range`` gives them). ConfigError when the spec names no serving queries."""
    queries = serving_queries(spec, namespace, labels, window_seconds=window_seconds)
    if queries is None:
        raise ConfigError("no serving history to learn capacity from: give spec.demand.preset, or "
                          "servedQuery and latencyQuery", field="spec.demand.preset")
    step = int(step_seconds or max(1, queries.window_seconds // 3))

    def pull(query: str | None, name: str) -> Series | None:
        if query is None:
            return None
        found = pull_history(source, query, start, end, step, min_history=None, combine="sum", name=name)
        return found if np.isfinite(found.values).any() else None

    target = spec.target.name
    replicas = pull(queries.replicas, "replicas")
    if replicas is None:
        gpus = pull(dcgm.allocated_gpus(namespace, target, labels), "gpus")
        if gpus is None:
            raise DataError(f"no replica count for {namespace}/{target}: neither the server's metrics nor DCGM "
                            "reported its pods")
        replicas = _scaled(gpus, gpus.values / spec.gpus_per_replica)
    served = pull(queries.served, "served")
    latency = pull(queries.mean_latency, "mean latency")
    if served is None or latency is None:
        raise DataError(f"no serving history for {namespace}/{target} in {start} → {end} "
                        f"({queries.served!r} or {queries.mean_latency!r} returned nothing)")
    per = np.where(replicas.values > 0, replicas.values, np.nan)
    running = pull(queries.running, "running")
    return ServingSignals(
        served=_scaled(served, served.values / per), mean_latency=latency,
        latency_quantile=pull(queries.latency_quantile, "latency quantile"),
        running=_scaled(running, running.values / per) if running is not None else None,
        gpu_util=pull(dcgm.mean_utilisation(namespace, target, labels), "gpu_util"),
        replicas=replicas, window_seconds=queries.window_seconds)
