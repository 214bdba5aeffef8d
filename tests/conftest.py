"""Shared fixtures for the whole test suite.

``fake_api`` and ``clock``: the stateful fake Kubernetes API server and a fake
clock, from ``support/fakes/`` (the one fakes package).
``prometheus_server``: one real Prometheus per test session, holding 14 days of
a real trace backfilled with promtool (see ``support/prometheus.py`` for what
is in it). ``prometheus_factory``: start more servers with your own backfilled
families (each costs a promtool run: keep them few and module/session-scoped). Tests that use it are marked ``prometheus`` automatically; it fails
— never skips — when the ``prometheus``/``promtool`` binaries are missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import pytest
from support.prometheus import (
    BackfilledPrometheus,
    PrometheusServer,
    backfill,
    running_prometheus,
    standard_history,
)

# The shared fakes' fixtures (fake_api, clock), defined once in tests/support/fakes/.
from tests.support.fakes.fixtures import clock, fake_api  # noqa: E402, F401
from tests.support.openmetrics import (
    DEFAULT_SAMPLE_STEP_SECONDS,
    CounterFamily,
    GaugeFamily,
)

PROMETHEUS_FIXTURES = {"prometheus_server", "prometheus_factory"}

#: prometheus_factory(counters=[…], gauges=[…], sample_step=60) -> a running, backfilled server.
PrometheusFactory = Callable[..., PrometheusServer]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROMETHEUS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.prometheus)


@pytest.fixture(scope="session")
def prometheus_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackfilledPrometheus]:
    """A running Prometheus with the standard 14-day history (started once per session)."""
    root = tmp_path_factory.mktemp("prometheus")
    history, counters, gauges = standard_history()
    report = backfill(root / "tsdb", root / "work", counters=counters, gauges=gauges,
                      sample_step=history.sample_step)
    with running_prometheus(root / "tsdb", root / "work") as server:
        yield BackfilledPrometheus(server=server, history=history, backfill=report)


@pytest.fixture(scope="session")
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    """Backfill the given families into a fresh TSDB and start a Prometheus on it (stopped at session end)."""
    with contextlib.ExitStack() as stack:

        def start(*, counters: Sequence[CounterFamily] = (), gauges: Sequence[GaugeFamily] = (),
                  sample_step: int = DEFAULT_SAMPLE_STEP_SECONDS) -> PrometheusServer:
            root = tmp_path_factory.mktemp("prometheus-custom")
            backfill(root / "tsdb", root / "work", counters=counters, gauges=gauges, sample_step=sample_step)
            return stack.enter_context(running_prometheus(root / "tsdb", root / "work"))

        yield start
