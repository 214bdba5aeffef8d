"""Transport and retries (kube/transport.py): transient failures back off, long outages give up
within the budget, throttling, an unreachable server, the readiness ping."""

from __future__ import annotations

import random
import socket

import pytest
from kubernetes.client import ApiClient, Configuration

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import ClusterError, ThrottledError
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import NO_RETRY
from tests.kube.shared import DEPLOYMENT, NOW, NS


@pytest.mark.parametrize(
    ("inject", "min_total_sleep"),
    [
        (lambda f: f.outage(503, requests=2), 0.25 + 0.5),
        (lambda f: f.fail_next(r"/scale$", 500, times=3), 0.25 + 0.5 + 1.0),
        (lambda f: f.throttle(429, retry_after=2, times=1), 2.0),
        (lambda f: f.fail_next(r"/scale$", 504, times=1, method="PATCH"), 0.25),
    ],
    ids=["503-outage", "500-three-times", "429-retry-after", "504-on-patch"],
)
def test_transient_failures_back_off_then_succeed(
    fake_api, cluster, sleeps, inject, min_total_sleep
):
    fake_api.add_deployment(NS, "llm", replicas=1)
    inject(fake_api)
    assert cluster.patch_scale(DEPLOYMENT, 3).replicas == 3
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 3
    assert sum(sleeps) >= min_total_sleep
    assert len(sleeps) == sum(1 for r in fake_api.requests if r.status >= 500 or r.status == 429)


def test_a_long_outage_gives_up_within_budget_with_a_retryable_error(fake_api, cluster, clock):
    fake_api.add_deployment(NS, "llm", replicas=1)
    fake_api.outage(503, requests=1000)
    started = clock.now()
    with pytest.raises(ClusterError) as info:
        cluster.patch_scale(DEPLOYMENT, 3)
    assert info.value.status == 503 and info.value.retryable
    assert (clock.now() - started).total_seconds() <= 20
    assert len(fake_api.requests) == 5  # RetryPolicy.max_attempts
    assert fake_api.get("apps/v1", "Deployment", NS, "llm")["spec"]["replicas"] == 1


def test_throttling_longer_than_allowed_raises_throttled_error(fake_api, cluster):
    fake_api.add_deployment(NS, "llm", replicas=1)
    fake_api.throttle(429, retry_after=120, times=1)
    with pytest.raises(ThrottledError) as info:
        cluster.get_scale(DEPLOYMENT)
    assert info.value.retry_after == 120
    assert len(fake_api.requests) == 1


def test_unreachable_api_server_is_a_retryable_cluster_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    config = Configuration(host=f"http://127.0.0.1:{port}")
    config.retries = False
    clock = FakeClock(NOW)
    with ApiClient(config) as api:
        cluster = KubeCluster(
            api, retry=NO_RETRY, clock=clock, sleep=clock.advance, rng=random.Random(0)
        )
        with pytest.raises(ClusterError, match="cannot reach the API server") as info:
            cluster.get_scale(DEPLOYMENT)
    assert info.value.retryable and info.value.status is None


@pytest.mark.parametrize(("status", "reachable"), [(None, True), (404, True), (401, False), (403, False),
                                                   (500, False), (503, False)],
                         ids=["answers", "answers-404", "unauthorised", "forbidden", "server-error", "unavailable"])
def test_ping_says_whether_the_api_server_is_reachable(fake_api, cluster, status, reachable):
    if status is not None:
        fake_api.fail_next("^/version$", status)
    problem = cluster.ping(timeout=2.0)
    assert (problem is None) is reachable, problem
    if not reachable:
        assert "check the API server" in problem
