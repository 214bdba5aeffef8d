"""Shared fixtures and hooks for the whole test suite.

``fake_api`` and ``clock``: the stateful fake Kubernetes API server and a fake
clock, from ``tests/support/fakes/`` (the one fakes package).
``prometheus_server``: one real Prometheus per test session, holding 14 days of
a real trace backfilled with promtool (see ``tests/support/prometheus.py`` for what
is in it). ``prometheus_factory``: start more servers with your own backfilled
families (each costs a promtool run: keep them few and module/session-scoped).
Tests that use either are marked ``prometheus`` automatically; they fail —
never skip — when the ``prometheus``/``promtool`` binaries are missing.

The markers of what a test needs (``tests/support/markers.py``) are added here where a
fixture or a module implies them; the Hypothesis profiles ``full`` and ``unit`` are
registered here (``tests/support/profiles.py``); and the session ends with the test time
by marker. docs/development.md says which marker needs what.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.support import markers, profiles

# The shared fakes' fixtures (fake_api, clock and the server under fake_api), defined once in tests/support/fakes/.
from tests.support.fakes.fixtures import clock, fake_api, threaded_httpserver  # noqa: F401
from tests.support.openmetrics import (
    DEFAULT_SAMPLE_STEP_SECONDS,
    CounterFamily,
    GaugeFamily,
)
from tests.support.prometheus import (
    BackfilledPrometheus,
    PrometheusServer,
    backfill,
    running_prometheus,
    standard_history,
)

# One SeaweedFS for the session, whichever object-store modules run (a fixture imported into each module
# would start one per module).
from tests.support.seaweedfs import seaweedfs  # noqa: F401

TESTS = Path(__file__).parent
profiles.register()

#: prometheus_factory(counters=[…], gauges=[…], sample_step=60) -> a running, backfilled server.
PrometheusFactory = Callable[..., PrometheusServer]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out a module that needs a program to be imported when `-m` deselects all its tests."""
    carried = markers.IMPORT_NEEDS.get(markers.relative(collection_path, TESTS) or "")
    if carried is None or markers.could_select(config.getoption("markexpr") or "", carried):
        return None
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        needs = set(markers.IMPORT_NEEDS.get(markers.relative(item.path, TESTS) or "", ()))
        needs |= {markers.FIXTURE_NEEDS[f] for f in getattr(item, "fixturenames", ()) if f in markers.FIXTURE_NEEDS}
        for name in sorted(needs):
            item.add_marker(name)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    # After every conftest has marked its tests: the label travels with the reports (xdist included).
    for item in session.items:
        item.user_properties.append(("needs", markers.group(m.name for m in item.iter_markers())))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Seconds spent per marker group: setup + call + teardown of each test (fixtures started included)."""
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            label = dict(report.user_properties).get("needs", markers.UNMARKED)
            seconds[label] += report.duration
            tests[label].add(report.nodeid)
    if not tests:
        return
    terminalreporter.section("test time by what the tests need (setup + call + teardown, summed)")
    for label in sorted(tests, key=lambda k: -seconds[k]):
        terminalreporter.write_line(f"{label:<28} {len(tests[label]):>5} tests {seconds[label]:>9.1f} s")


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
