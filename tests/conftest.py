"""Shared fixtures for the whole test suite.

``prometheus_server``: one real Prometheus per test session, holding 14 days of
a real trace backfilled with promtool (see ``support/prometheus.py`` for what
is in it). Tests that use it are marked ``prometheus`` automatically; it fails
— never skips — when the ``prometheus``/``promtool`` binaries are missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.prometheus import (
    BackfilledPrometheus,
    backfill,
    running_prometheus,
    standard_history,
)

PROMETHEUS_FIXTURES = {"prometheus_server"}


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
