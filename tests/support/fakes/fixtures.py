"""The fixtures the kube and controller tests share, defined once (their conftests import them)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pytest_httpserver import HTTPServer

from predictive_scaler.clock import FakeClock
from tests.support.fakes.apiserver import FakeApiServer

#: The fake clock's start: a Monday morning.
START = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)


@pytest.fixture
def fake_api(httpserver: HTTPServer) -> Iterator[FakeApiServer]:
    """The stateful fake Kubernetes API server on pytest-httpserver's loopback port."""
    with FakeApiServer(httpserver) as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at :data:`START`; nothing sleeps for real."""
    return FakeClock(START)
