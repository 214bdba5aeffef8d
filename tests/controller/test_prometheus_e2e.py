"""Against a REAL Prometheus holding 14 days of a shared trace (per-pod request counters with resets,
per-pod DCGM gauges, 60 s samples — tests/support/prometheus.py): the controller's metrics port, and
the end-to-end reconcile compared with the backtest's adapters on the same series, time and state."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.ports import PrometheusMetricsPort
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.errors import SourceError
from predictive_scaler.forecasting.arima import ArimaForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import Reconciler
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeCluster
from tests.support.prometheus import BackfilledPrometheus

QUERY = 'sum(rate(requests_total{namespace="ml",job="inference"}[2m]))'
#: With samples exactly every 60 s, a [1m] range holds the two samples bounding the last minute, so the
#: rate is exactly the trace's last minute — what the backtest's TraceMetrics reports (delay 60 s).
ONE_MINUTE = 'sum(rate(requests_total{namespace="ml",job="inference"}[1m]))'


def minute_after(prom: BackfilledPrometheus, offset: timedelta) -> datetime:
    """A time on a whole minute, one minute past a 5-minute boundary (see test_end_to_end)."""
    t = prom.history.trace.start.to_pydatetime() + offset
    return datetime.fromtimestamp(math.floor(t.timestamp() / 300) * 300 + 60, UTC)


def trace_at(prom: BackfilledPrometheus, when: datetime) -> float:
    trace = prom.history.trace
    return float(trace.values[trace.index_at(when)])


def metrics_port(prom: BackfilledPrometheus, **demand: Any) -> PrometheusMetricsPort:
    spec = ScalerSpec.from_dict({"target": {"name": demand.pop("target", "llm")},
                                 "demand": {"kind": "requests", "query": demand.pop("query", QUERY), **demand},
                                 "capacity": {"requestsPerReplica": 100}})
    source = PrometheusSource(prom.url, retries=0, timeout=10)
    return PrometheusMetricsPort.for_spec(source, spec, "ml")


@pytest.mark.parametrize("days", [2.3, 5.7, 9.1, 12.6], ids=lambda d: f"day-{d}")
@pytest.mark.parametrize("query, minutes", [(QUERY, 2), (ONE_MINUTE, 1)], ids=["rate-2m", "rate-1m"])
def test_sum_rate_demand_is_the_trace_across_counter_resets(prometheus_server: BackfilledPrometheus,
                                                           days: float, query: str, minutes: int) -> None:
    now = minute_after(prometheus_server, timedelta(days=days))
    sample = metrics_port(prometheus_server, query=query).demand_now(now)
    # rate(x[Nm]) at a sample time is the mean of the trace's last N minutes (the range is closed).
    expected = np.mean([trace_at(prometheus_server, now - timedelta(minutes=k)) for k in range(1, minutes + 1)])
    assert sample.value == pytest.approx(expected, rel=1e-6)


def test_a_scrape_gap_is_missing_data_never_zero(prometheus_server: BackfilledPrometheus) -> None:
    gap_start, _ = prometheus_server.history.gap
    with pytest.raises(SourceError, match="no series"):
        metrics_port(prometheus_server).demand_now(gap_start + timedelta(minutes=20))


def test_dcgm_busy_gpus_by_default_for_the_target(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    spec = ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {"kind": "dcgm-busy-gpus"}})
    port = PrometheusMetricsPort.for_spec(PrometheusSource(prometheus_server.url, retries=0), spec, "ml")
    now = minute_after(prometheus_server, timedelta(days=4, hours=5))
    share = trace_at(prometheus_server, now - timedelta(minutes=1)) / len(h.pods)
    expected = len(h.pods) * min(100.0, share / h.capacity_per_gpu * 100.0) / 100.0
    assert port.demand_now(now).value == pytest.approx(expected, rel=1e-6)  # llm-canary's GPU not counted


def test_a_frozen_dcgm_exporter_is_stale_data(prometheus_server: BackfilledPrometheus) -> None:
    spec = ScalerSpec.from_dict({"target": {"name": "stuck"}, "demand": {"kind": "dcgm-busy-gpus",
                                                                         "maxAgeSeconds": 60}})
    port = PrometheusMetricsPort.for_spec(PrometheusSource(prometheus_server.url, retries=0), spec, "ml")
    with pytest.raises(SourceError, match="old"):
        port.demand_now(prometheus_server.history.stuck_stop + timedelta(minutes=3))


def test_duplicated_series_are_refused(prometheus_server: BackfilledPrometheus) -> None:
    port = metrics_port(prometheus_server)
    port.metrics.demand_query = 'queue_depth{namespace="dup"}'
    with pytest.raises(SourceError, match="sum"):
        port.demand_now(minute_after(prometheus_server, timedelta(days=3)))


def test_recent_history_is_the_trace_on_the_model_grid(prometheus_server: BackfilledPrometheus) -> None:
    # The demand query itself is pulled every minute and averaged into 5-minute model steps.
    port = metrics_port(prometheus_server, query=ONE_MINUTE)
    now = minute_after(prometheus_server, timedelta(days=11))
    recent = port.recent(now, timedelta(days=1), 300)
    grid = prometheus_server.history.trace.resample(300)
    i = grid.index_at(recent.start)
    expected = grid.values[i: i + len(recent)]
    assert len(recent) == 288
    rel = np.abs(recent.values - expected) / expected
    # Exact but where a pod restarted: rate() loses half a scrape interval of that pod's counter,
    # at most 1/(2 x 3 pods x 5 samples) of the step. Restarts are 16 h apart across the pods.
    off = rel > 1e-6
    assert off.sum() <= 2
    assert rel.max() < 1 / 30 * 1.2


# -- end to end ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(prometheus_server: BackfilledPrometheus, tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A two-stage ARIMA on the first 10 days at 5 minutes, published to a model store."""
    grid = prometheus_server.history.trace.resample(300)
    history = grid.slice(0, 10 * 288)
    model = ArimaForecaster().fit(history)
    store = ModelStore(tmp_path_factory.mktemp("models"))
    store.publish("llm", model, series="llm", window=TrainingWindow.of(history))
    return store


def spec_dict(prom: BackfilledPrometheus) -> dict[str, Any]:
    p95 = float(np.nanpercentile(prom.history.trace.values, 95))
    return {"mode": "scale", "target": {"name": "llm"},
            "demand": {"kind": "requests", "query": ONE_MINUTE},
            "capacity": {"requestsPerReplica": round(p95 / 6, 1)},
            "minReplicas": 1, "maxReplicas": 12,
            "prewarm": {"enabled": True, "gpusPerNode": 4, "budget": {"maxGpus": 8, "pricePerGpuHour": 2.0}},
            "model": {"name": "llm"}}


@pytest.mark.parametrize("offset", [timedelta(days=11, hours=7), timedelta(days=12, hours=20)],
                         ids=["day-11", "day-12"])
def test_end_to_end_decision_equals_the_backtest(prometheus_server: BackfilledPrometheus, trained: ModelStore,
                                                 fake_api: FakeApiServer, offset: timedelta) -> None:
    """Real Prometheus → controller ports → Reconciler.step, versus the backtest's TraceMetrics and
    ServedModel (predictive_scaler/backtest/adapters.py) over the same trace, time and planner state.
    The cluster side of the backtest is a port reporting the state the fake API server holds."""
    from predictive_scaler.backtest.adapters import ServedModel, TraceMetrics

    prom = prometheus_server
    now = minute_after(prom, offset)
    clock = FakeClock(now)
    spec = spec_dict(prom)
    fake_api.add_deployment("ml", "llm", replicas=5, labels={"app": "llm"})
    fake_api.add_gpu_node("gpu-0", 8)
    for i in range(5):
        fake_api.add_pod("ml", f"llm-x-{i}", {"app": "llm"}, node="gpu-0", gpus=1)
    obj = fake_api.add_scaler("ml", "llm", spec)
    kube = KubeCluster(fake_api.api_client, retry=RetryPolicy(), clock=clock, sleep=clock.advance,
                       rng=random.Random(1))
    settings = ControllerSettings(prometheus_url=prom.url, model_store=Path(trained.root))
    service = ControllerService(settings, kube, PrometheusSource(prom.url, retries=0, clock=clock), trained, clock)

    loaded = trained.serving("llm")
    parsed = ScalerSpec.from_dict(spec)
    served = ServedModel(loaded.model, "v", horizon_steps=parsed.horizon_seconds // 300, quantiles=(0.5, 0.95))
    sim_cluster = FakeCluster(desired=5, ready=5, free_gpus=3)
    backtest = Reconciler(parsed, TraceMetrics(prom.history.trace, delay_s=60), served, sim_cluster, clock)
    state = PlannerState()
    for _ in range(3):  # three periods: the controller re-reads its state from the status each time
        meta = fake_api.get("autoscaling.predictive-scaler.io/v1alpha1", "PredictiveScaler", "ml", "llm")
        ours = service.reconcile(name="llm", namespace="ml", uid=obj["metadata"]["uid"], spec=spec,
                                 status=meta.get("status") or {}, generation=1).result
        theirs = backtest.step(state)
        assert ours is not None
        a, b = ours.decision, theirs.decision
        assert (a.desired_replicas, a.placeholder_gpus, a.strategy, a.speculative_gpus, a.limits) == \
            (b.desired_replicas, b.placeholder_gpus, b.strategy, b.speculative_gpus, b.limits)
        assert a.strategy == "predictive"
        assert a.demand == pytest.approx(b.demand, rel=1e-6)
        assert a.forecast_pod_lead == pytest.approx(b.forecast_pod_lead, rel=1e-2)
        assert ours.state.recommendations == theirs.state.recommendations
        state = theirs.state
        # Keep the two clusters alike: the fake API's pods follow the decision as the simulator's do.
        sim_cluster.desired = sim_cluster.ready = a.desired_replicas
        sim_cluster.placeholder_gpus = a.placeholder_gpus
        for i in range(5, a.desired_replicas):
            if fake_api.get("v1", "Pod", "ml", f"llm-x-{i}") is None:
                fake_api.add_pod("ml", f"llm-x-{i}", {"app": "llm"}, node="gpu-0", gpus=1)
        clock.advance(60)
