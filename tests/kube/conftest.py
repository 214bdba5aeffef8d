"""Fixtures for the Kubernetes adapter tests: the stateful fake API server and
an adapter pointed at it with a fake clock (no real sleeping)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.kube.api_calls import api_call_for
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from tests.support.fakes.apiserver import FakeApiServer


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def cluster(
    fake_api: FakeApiServer, clock: FakeClock, sleeps: list[float]
) -> Iterator[KubeCluster]:
    """The adapter under test. On teardown, every request it made must be one of
    the documented ``API_CALLS`` (the RBAC rules are derived from that list)."""

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    yield KubeCluster(
        fake_api.api_client,
        retry=RetryPolicy(),
        clock=clock,
        sleep=sleep,
        rng=random.Random(7),
        request_timeout=5.0,
    )
    undocumented = [
        (r.method, r.path) for r in fake_api.requests
        if api_call_for(r.method, r.path, watch=r.query.get("watch") == "true") is None
    ]
    assert not undocumented, f"requests missing from API_CALLS: {undocumented}"
