"""One demand history: the training pull and the serving pull see the same numbers.

Against the real Prometheus fixture (14 days of a 1-minute trace as per-pod
counters with restarts), with the install example's kind of query: ``rate(…[2m])`` over
5-minute model steps. The retraining job's pull (which ``backtest --prometheus``
shares) and the controller's recent history must agree step by step; the old
training pull — the query evaluated once per model step — did not.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from predictive_scaler.controller.ports import PrometheusMetricsPort
from predictive_scaler.errors import DataError
from predictive_scaler.retrain.history import PrometheusHistory, demand_query, history_for_scaler
from predictive_scaler.retrain.settings import ScalerTarget
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.demand import demand_history
from predictive_scaler.sources.history import pull_history
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.prometheus import BackfilledPrometheus

STEP = 300
RATE_2M = 'sum(rate(requests_total{namespace="ml"}[2m]))'


def spec_for(demand: dict[str, object]) -> ScalerSpec:
    return ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": demand,
                                 "capacity": {"requestsPerReplica": 100}})


@pytest.mark.parametrize("day", [2.5, 9.25, 12.0], ids=lambda d: f"day-{d}")
def test_training_and_serving_pull_the_same_demand(prometheus_server: BackfilledPrometheus, day: float) -> None:
    spec = spec_for({"kind": "requests", "query": RATE_2M})
    t = prometheus_server.history.trace.start.to_pydatetime() + timedelta(days=day)
    end = datetime.fromtimestamp(t.timestamp() // STEP * STEP, UTC)
    source = PrometheusSource(prometheus_server.url, retries=0, timeout=20)

    trained = history_for_scaler(source, spec, end, timedelta(hours=12), namespace="ml", min_history=None,
                                 step_seconds=STEP)
    served = PrometheusMetricsPort.for_spec(source, spec, "ml").recent(end + timedelta(seconds=90),
                                                                      timedelta(hours=12), STEP)
    assert (trained.start, trained.step_seconds, len(trained)) == (served.start, served.step_seconds, len(served))
    assert len(trained) == 144
    both = np.isfinite(trained.values) & np.isfinite(served.values)
    assert both.mean() > 0.95
    rel = np.abs(trained.values[both] - served.values[both]) / served.values[both]
    assert rel.max() < 0.01, f"worst step differs by {rel.max():.2%}"

    # The skew this removes: sampled once per step, a [2m] rate is the last 2 of the 5 minutes.
    sampled = pull_history(source, RATE_2M, end - timedelta(hours=12), end, STEP, min_history=None)
    ok = np.isfinite(sampled.values) & both
    skew = np.abs(sampled.values[ok] - served.values[ok]) / served.values[ok]
    assert (skew > 0.01).mean() > 0.5, "the 1-minute trace varies: per-step sampling should disagree"
    # And the averaged steps are the trace's own 5-minute means (bar the pods' counter restarts).
    truth = prometheus_server.history.trace.resample(STEP)
    i = truth.index_at(served.start)
    expected = truth.values[i: i + len(served)]
    close = np.abs(served.values - expected) / expected
    assert np.nanmedian(close) < 0.02


def test_the_job_and_the_controller_share_one_definition() -> None:
    dcgm_spec = spec_for({"kind": "dcgm-busy-gpus"})
    history = demand_history(dcgm_spec, "ml")
    assert history.query == dcgm.busy_gpus("ml", "llm") == demand_query(dcgm_spec, "ml")
    assert history.freshness_query == dcgm.freshness("ml", "llm")
    port = PrometheusMetricsPort.for_spec(PrometheusSource("http://127.0.0.1:9"), dcgm_spec, "ml")
    assert (port.metrics.demand_query, port.metrics.freshness_query) == (history.query, history.freshness_query)
    assert port.metrics.max_age == history.max_age
    requests_spec = spec_for({"kind": "requests", "query": RATE_2M})
    assert demand_history(requests_spec, "ml").query == RATE_2M == demand_query(requests_spec, "ml")


def test_a_window_without_a_whole_step_is_refused() -> None:
    history = demand_history(spec_for({"kind": "requests", "query": RATE_2M}), "ml")
    start = datetime(2024, 1, 1, 0, 1, tzinfo=UTC)
    with pytest.raises(DataError, match="holds no whole 300s step"):
        history.pull(PrometheusSource("http://127.0.0.1:9"), start, start + timedelta(minutes=4), STEP)


def test_the_job_pulls_through_the_shared_history(prometheus_server: BackfilledPrometheus) -> None:
    spec = spec_for({"kind": "requests", "query": RATE_2M})
    end = datetime.fromtimestamp(
        (prometheus_server.history.trace.start + timedelta(days=3)).timestamp() // STEP * STEP, UTC)
    source = PrometheusSource(prometheus_server.url, retries=0, timeout=20)
    got = PrometheusHistory(source).demand(ScalerTarget("ml", "llm", spec), end - timedelta(hours=2), end, STEP,
                                           min_history=None, max_missing_fraction=None)
    want = demand_history(spec, "ml").pull(source, end - timedelta(hours=2), end, STEP, min_history=None)
    np.testing.assert_allclose(got.values, want.values, rtol=1e-12)
