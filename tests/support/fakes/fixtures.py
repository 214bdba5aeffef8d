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


@pytest.fixture(scope="session")
def threaded_httpserver() -> Iterator[HTTPServer]:
    """A loopback pytest-httpserver that serves each request on a thread of its own.

    The plugin's ``httpserver`` answers one request at a time, so one held watch stream (the
    cache's reflectors, kopf) stalls every other call for up to a second: a real API server
    serves them side by side. The fake's state is behind a lock, so this is safe.
    """
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.clear()
    if server.is_running():
        server.stop()


@pytest.fixture
def fake_api(threaded_httpserver: HTTPServer) -> Iterator[FakeApiServer]:
    """The stateful fake Kubernetes API server on a loopback port."""
    threaded_httpserver.clear()
    with FakeApiServer(threaded_httpserver) as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at :data:`START`; nothing sleeps for real."""
    return FakeClock(START)
