"""Exported metrics (exactly :mod:`predictive_scaler.metrics_catalog`) and the /metrics, /healthz, /readyz server.

Besides copying the decision into gauges, two live estimates are kept here,
in memory (they are reports, not decisions — losing them on restart changes
no scaling):

- :class:`ForecastQuality` — rolling coverage and pinball loss of the planning
  quantile: each observed demand is scored against the forecast issued *before*
  its model step began (the one the planner acted on);
- :class:`WasteEstimator` — speculative GPU-hours that no real demand used:
  capacity bought at ``t`` counts as used if demand within the node lead time
  after ``t`` needed it, and as wasted otherwise.
"""

from __future__ import annotations

import math
import threading
import typing
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from predictive_scaler.controller.api_activity import RETRY_KINDS, ApiTally
from predictive_scaler.controller.finops import billed_gpus, node_pool, price_for
from predictive_scaler.controller.health import Verdict
from predictive_scaler.controller.status import CapacityInUse, WasteKind
from predictive_scaler.core.values import Forecast
from predictive_scaler.metrics_catalog import CATALOG
from predictive_scaler.policy.capacity import replicas_for
from predictive_scaler.policy.reasons import Limit
from predictive_scaler.reconcile import ReconcileResult
from predictive_scaler.spec import Mode, ScalerSpec

STRATEGIES = ("predictive", "reactive", "hold")
MODES: tuple[str, ...] = typing.get_args(Mode)
ERROR_KINDS = ("metrics", "model", "cluster", "config", "internal")
#: Reconcile duration buckets (seconds): one reconcile should take well under a second.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# -- live estimates ------------------------------------------------------------------------------

class ForecastQuality:
    """Rolling coverage / pinball loss of quantile ``q`` over the last ``window`` observations."""

    def __init__(self, q: float, window: int = 60) -> None:
        self.q = q
        self._forecasts: deque[Forecast] = deque(maxlen=4)
        self._scores: deque[tuple[bool, float]] = deque(maxlen=window)

    def observe(self, forecast: Forecast | None, demand: float | None, now_s: float) -> None:
        if demand is not None and math.isfinite(demand):
            predicted = self._predicted_for(now_s)
            if predicted is not None:
                err = demand - predicted
                self._scores.append((demand <= predicted, max(self.q * err, (self.q - 1) * err)))
        if forecast is not None and (not self._forecasts or self._forecasts[-1].issued_at != forecast.issued_at):
            self._forecasts.append(forecast)

    def _predicted_for(self, t: float) -> float | None:
        for f in reversed(self._forecasts):
            step = f.step_seconds
            first = f.issued_at.timestamp() + step  # start of its first forecast step
            h = math.floor((t - first) / step)
            if 0 <= h < f.horizon_steps:
                try:
                    return float(f.quantile(self.q)[h])
                except Exception:  # noqa: BLE001 — a forecast without the quantile is skipped
                    return None
        return None

    @property
    def coverage(self) -> float | None:
        return sum(c for c, _ in self._scores) / len(self._scores) if self._scores else None

    @property
    def pinball(self) -> float | None:
        return sum(p for _, p in self._scores) / len(self._scores) if self._scores else None


class WasteEstimator:
    """Speculative GPU-hours bought but not needed by the demand that followed within ``lead_s``."""

    def __init__(self) -> None:
        self._open: deque[tuple[float, float, int, int, float]] = deque(maxlen=512)  # t, dt, base, spec, price
        self._demand: deque[tuple[float, float]] = deque(maxlen=512)

    def observe(self, now_s: float, period_s: float, demand: float | None, reactive_gpus: int,
                speculative_gpus: int, price: float | None, capacity: float, gpus_per_replica: int,
                lead_s: float) -> float:
        """Book this period; return the wasted cost settled now (speculation older than ``lead_s``)."""
        if demand is not None and math.isfinite(demand):
            self._demand.append((now_s, demand))
        if speculative_gpus > 0 and price is not None:
            self._open.append((now_s, period_s, reactive_gpus, speculative_gpus, price))
        wasted = 0.0
        while self._open and self._open[0][0] + lead_s <= now_s:
            t, dt, base, spec_gpus, p = self._open.popleft()
            peak = max((v for ts, v in self._demand if t <= ts <= t + lead_s), default=None)
            if peak is None:
                continue  # no demand seen: unknown, not counted as waste
            needed = replicas_for(peak, capacity) * gpus_per_replica
            used = min(spec_gpus, max(0, needed - base))
            wasted += (spec_gpus - used) * p * dt / 3600.0
        while self._demand and self._open and self._demand[0][0] < self._open[0][0]:
            self._demand.popleft()
        if not self._open:
            while len(self._demand) > 1:
                self._demand.popleft()
        return wasted


# -- the registry ---------------------------------------------------------------------------------

@dataclass
class _ScalerTrack:
    quality: ForecastQuality
    waste: WasteEstimator
    labels: tuple[str, str]
    currency: str | None = None
    #: Label values last written to the shadow and FinOps series (a change removes the old series).
    live: tuple[tuple[str, str], ...] = ()
    finops: tuple[str, ...] | None = None


class Telemetry:
    """A prometheus_client registry holding exactly the catalogue's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, Any] = {}
        for m in CATALOG:
            if m.type == "gauge":
                self.metrics[m.name] = Gauge(m.name, m.help, m.labels, registry=self.registry)
            elif m.type == "counter":
                # prometheus_client appends _total itself; the catalogue names the series.
                base = m.name[: -len("_total")] if m.name.endswith("_total") else m.name
                self.metrics[m.name] = Counter(base, m.help, m.labels, registry=self.registry)
            else:
                self.metrics[m.name] = Histogram(m.name, m.help, m.labels, registry=self.registry,
                                                 buckets=DURATION_BUCKETS)
        self._tracks: dict[tuple[str, str], _ScalerTrack] = {}
        self._lock = threading.Lock()
        self.scalers = 0

    def _m(self, name: str) -> Any:
        return self.metrics[name]

    def _track(self, namespace: str, name: str, spec: ScalerSpec) -> _ScalerTrack:
        key = (namespace, name)
        track = self._tracks.get(key)
        if track is None or track.quality.q != spec.quantile:
            track = _ScalerTrack(ForecastQuality(spec.quantile), WasteEstimator(), key)
            self._tracks[key] = track
        return track

    def record(self, namespace: str, name: str, spec: ScalerSpec, result: ReconcileResult,
               budget_gpus: int, budget_limit: int | None, duration_s: float, period_s: float, *,
               live: tuple[tuple[str, str], ...] = (), team: str = "", opencost_price: float | None = None) -> None:
        # live: (kind, name) of the other autoscalers on the target; team: the team label's value.
        labels = (namespace, name)
        d = result.decision
        now_s = result.now.timestamp()
        with self._lock:
            track = self._track(namespace, name, spec)
            m = self._m
            f = result.forecast
            if f is not None:
                for q in sorted({0.5, spec.quantile}):
                    try:
                        m("predictive_scaler_forecast_demand").labels(*labels, f"{q:g}").set(float(f.quantile(q)[-1]))
                    except Exception:  # noqa: BLE001 — a quantile the model did not produce is skipped
                        continue
                m("predictive_scaler_last_forecast_timestamp_seconds").labels(*labels).set(f.issued_at.timestamp())
                m("predictive_scaler_forecast_horizon_seconds").labels(*labels).set(f.horizon_steps * f.step_seconds)
            if d.demand is not None:
                m("predictive_scaler_observed_demand").labels(*labels).set(d.demand)
            track.quality.observe(f, d.demand, now_s)
            if track.quality.coverage is not None:
                m("predictive_scaler_forecast_coverage").labels(*labels).set(track.quality.coverage)
                m("predictive_scaler_forecast_pinball_loss").labels(*labels).set(track.quality.pinball)
            m("predictive_scaler_desired_replicas").labels(*labels).set(d.desired_replicas)
            m("predictive_scaler_current_replicas").labels(*labels).set(result.cluster.ready_replicas)
            m("predictive_scaler_placeholder_gpus").labels(*labels).set(
                d.placeholder_gpus if result.applied else result.cluster.placeholder_gpus)
            for s in STRATEGIES:
                m("predictive_scaler_strategy").labels(*labels, s).set(1 if d.strategy == s else 0)
            for mode in MODES:
                m("predictive_scaler_mode").labels(*labels, mode).set(1 if spec.mode == mode else 0)
            m("predictive_scaler_drift_active").labels(*labels).set(1 if d.drift else 0)
            m("predictive_scaler_budget_gpus_in_use").labels(*labels).set(budget_gpus)
            own = spec.prewarm.budget.max_gpus
            limits = [x for x in (own, budget_limit) if x is not None]
            if limits:
                m("predictive_scaler_budget_gpus_limit").labels(*labels).set(min(limits))
            m("predictive_scaler_budget_limited").labels(*labels).set(1 if Limit.BUDGET in d.limits else 0)
            currency = d.currency
            price = spec.prewarm.budget.price_per_gpu_hour
            if track.currency is not None and track.currency != currency:
                m("predictive_scaler_speculative_cost_per_hour").remove(*labels, track.currency)
            track.currency = currency
            held_cost = 0.0 if price is None else budget_gpus * price
            m("predictive_scaler_speculative_cost_per_hour").labels(*labels, currency).set(held_cost)
            if held_cost and result.applied:
                m("predictive_scaler_prewarm_cost_total").labels(*labels, currency).inc(held_cost * period_s / 3600)
            wasted = track.waste.observe(
                now_s, period_s, d.demand, d.reactive_replicas * spec.gpus_per_replica,
                budget_gpus if result.applied else 0, price, spec.capacity_per_replica, spec.gpus_per_replica,
                float(spec.lead_times.node_start_seconds))
            # Touch the counters so they exist at 0 (an alert on a missing series never fires).
            m("predictive_scaler_wasted_prewarm_cost_total").labels(*labels, currency).inc(wasted)
            m("predictive_scaler_prewarm_cost_total").labels(*labels, currency).inc(0)
            self._shadow(track, spec, result, live)
            self._finops(track, spec, result, period_s, team, opencost_price)
            m("predictive_scaler_last_reconcile_timestamp_seconds").labels(*labels).set(now_s)
            m("predictive_scaler_reconcile_duration_seconds").labels(*labels).observe(duration_s)
            for kind in ERROR_KINDS:
                m("predictive_scaler_reconcile_errors_total").labels(*labels, kind).inc(0)
            for kind in RETRY_KINDS:
                m("predictive_scaler_api_retries_total").labels(*labels, kind).inc(0)

    def _shadow(self, track: _ScalerTrack, spec: ScalerSpec, result: ReconcileResult,
                live: tuple[tuple[str, str], ...]) -> None:
        """What the target runs (whoever scaled it) beside what this scaler decided (docs/shadow.md)."""
        m, labels = self._m, track.labels
        m("predictive_scaler_target_replicas").labels(*labels).set(result.cluster.desired_replicas)
        m("predictive_scaler_planned_placeholder_gpus").labels(*labels).set(result.decision.placeholder_gpus)
        m("predictive_scaler_gpus_per_replica").labels(*labels).set(spec.gpus_per_replica)
        m("predictive_scaler_capacity_per_replica").labels(*labels).set(spec.capacity_per_replica)
        for gone in set(track.live) - set(live):
            m("predictive_scaler_live_autoscaler").remove(*labels, *gone)
        for kind, autoscaler in live:
            m("predictive_scaler_live_autoscaler").labels(*labels, kind, autoscaler).set(1)
        track.live = live

    def _finops(self, track: _ScalerTrack, spec: ScalerSpec, result: ReconcileResult, period_s: float,
                team: str, opencost_price: float | None) -> None:
        """GPU-hours billed (and used, where DCGM measures demand) this period, and their cost (docs/finops.md)."""
        m, labels = self._m, track.labels
        d, c = result.decision, result.cluster
        price = price_for(spec, opencost_price)
        currency = d.currency
        keys = (team, node_pool(spec.prewarm.node_selector), currency, price.source)
        if track.finops is not None and track.finops != keys:
            old_team, old_pool, old_currency, old_source = track.finops
            for name, extra in (("predictive_scaler_gpu_hours_billed_total", ()),
                                ("predictive_scaler_gpu_hours_used_total", ()),
                                ("predictive_scaler_gpu_cost_total", (old_currency,))):
                _remove(m(name), (*labels, old_team, old_pool, *extra))
            _remove(m("predictive_scaler_gpu_price_per_hour"), (*labels, old_currency, old_source))
        track.finops = keys
        where = (*labels, team, keys[1])
        held = billed_gpus(c.desired_replicas, d.placeholder_gpus if result.applied else c.placeholder_gpus,
                           spec.gpus_per_replica)
        hours = held * period_s / 3600.0
        m("predictive_scaler_gpu_hours_billed_total").labels(*where).inc(hours)
        used = m("predictive_scaler_gpu_hours_used_total").labels(*where)
        if spec.demand.kind == "dcgm-busy-gpus" and d.demand is not None and math.isfinite(d.demand):
            # Busy GPUs are the demand itself: no query beyond the one the step made.
            used.inc(min(float(held), max(0.0, d.demand)) * period_s / 3600.0)
        else:
            used.inc(0)
        cost = m("predictive_scaler_gpu_cost_total").labels(*where, currency)
        cost.inc(0 if price.per_gpu_hour is None else hours * price.per_gpu_hour)
        if price.per_gpu_hour is not None:
            m("predictive_scaler_gpu_price_per_hour").labels(*labels, currency, price.source).set(price.per_gpu_hour)

    def model_trained(self, namespace: str, name: str, trained_until_s: float | None) -> None:
        if trained_until_s is not None:
            self._m("predictive_scaler_model_trained_timestamp_seconds").labels(namespace, name).set(trained_until_s)

    def refused(self, namespace: str, name: str, now_s: float) -> None:
        """A reconcile that decided nothing on purpose (paused, invalid spec, conflict) still completed."""
        with self._lock:
            self._m("predictive_scaler_last_reconcile_timestamp_seconds").labels(namespace, name).set(now_s)

    def error(self, namespace: str, name: str, kind: str) -> None:
        self._m("predictive_scaler_reconcile_errors_total").labels(
            namespace, name, kind if kind in ERROR_KINDS else "internal").inc()

    def api_retries(self, namespace: str, name: str, tally: ApiTally) -> None:
        """Count Kubernetes API calls retried for this scaler (absorbed or not), by kind."""
        for kind, n in tally.retries.items():
            if n:
                self._m("predictive_scaler_api_retries_total").labels(
                    namespace, name, kind if kind in RETRY_KINDS else "unreachable").inc(n)

    def cache_staleness(self, stale_for: Mapping[str, float]) -> None:
        """The cluster cache's staleness per watched resource (kube/cache.py)."""
        for resource, seconds in stale_for.items():
            self._m("predictive_scaler_cluster_cache_staleness_seconds").labels(resource).set(seconds)

    def capacity_and_waste(self, namespace: str, name: str, capacity: CapacityInUse | None,
                           waste: tuple[WasteKind, ...], currency: str) -> None:
        """The learned capacity (by kind) and the GPU waste (by kind) of this reconcile; a kind no longer
        known is removed, never left at its last value."""
        labels = (namespace, name)
        with self._lock:
            learned = self._m("predictive_scaler_learned_capacity")
            kind = capacity.kind if capacity is not None and capacity.learned is not None else None
            for k in ("point", "lower-bound"):
                if k == kind and capacity is not None and capacity.learned is not None:
                    learned.labels(*labels, k).set(capacity.learned)
                else:
                    _remove(learned, (*labels, k))
            hours, cost = self._m("predictive_scaler_waste_gpu_hours"), self._m("predictive_scaler_waste_cost")
            now = {w.kind: w for w in waste}
            for old in _label_sets(hours):
                if old[:2] == labels and old[2] not in now:
                    hours.remove(*old)
            for old in _label_sets(cost):
                if old[:2] == labels and (old[2] not in now or now[old[2]].cost_per_day is None or old[3] != currency):
                    cost.remove(*old)
            for w in waste:
                hours.labels(*labels, w.kind).set(w.gpu_hours_per_day)
                if w.cost_per_day is not None:
                    cost.labels(*labels, w.kind, currency).set(w.cost_per_day)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted scaler's series (a stale gauge would keep alerting)."""
        with self._lock:
            self._tracks.pop((namespace, name), None)
            for metric in self.metrics.values():
                for labels in list(_label_sets(metric)):
                    if labels[:2] == (namespace, name):
                        metric.remove(*labels)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _remove(metric: Any, labels: tuple[str, ...]) -> None:
    if labels in _label_sets(metric):
        metric.remove(*labels)


def _label_sets(metric: Any) -> list[tuple[str, ...]]:
    return [tuple(k) for k in list(getattr(metric, "_metrics", {}).keys())]


# -- HTTP ------------------------------------------------------------------------------------------

Probe = Callable[[], Verdict]


def telemetry_app(registry: CollectorRegistry, liveness: Probe, readiness: Probe) -> Callable[..., Any]:
    """One WSGI app: ``/metrics`` is prometheus_client's own exposition; ``/healthz``, ``/readyz`` the probes."""
    metrics = make_wsgi_app(registry)
    probes = {"/healthz": liveness, "/readyz": readiness}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        probe = probes.get(path)
        if path == "/metrics":
            return metrics(environ, start_response)
        if probe is None:
            status, body = "404 Not Found", b"not found: try /metrics, /healthz or /readyz\n"
        else:
            verdict = probe()
            status = "200 OK" if verdict.ok else "503 Service Unavailable"
            body = (verdict.message + "\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — probes every 10 s would flood logs
        return


class TelemetryServer:
    """Serves :func:`telemetry_app` with prometheus_client's threading WSGI server.

    One port (``metrics_port``, default 8080) serves all three paths; a distinct
    ``health_port`` adds a second listener with the same app.
    """

    def __init__(self, telemetry: Telemetry, host: str, metrics_port: int, health_port: int | None,
                 liveness: Probe, readiness: Probe) -> None:
        self.app = telemetry_app(telemetry.registry, liveness, readiness)
        ports = [metrics_port] + ([health_port] if health_port is not None and health_port != metrics_port else [])
        self.servers = [make_server(host, port, self.app, ThreadingWSGIServer, handler_class=_QuietHandler)
                        for port in ports]
        self._threads: list[threading.Thread] = []

    @property
    def ports(self) -> list[int]:
        return [int(s.server_address[1]) for s in self.servers]

    def start(self) -> TelemetryServer:
        for server in self.servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                      name="telemetry-http", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
