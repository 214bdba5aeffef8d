"""Random faults and restarts over reconcile steps (hypothesis): the invariants hold on every step.

The machine drives the controller's kopf handler on the fake API server with a
real model store; demand comes from a settable fake metrics port (Prometheus
itself is covered by the matrix). A restart throws away the whole controller
process — caches, budget ledger, Reconciler — so the planner state travels only
through the status dict the API server holds. ``World.step`` checks the common
invariants after every period; the machine adds the state's round trip.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from pytest_httpserver import HTTPServer

from predictive_scaler.clock import FakeClock
from predictive_scaler.forecasting.store import MODEL_FILE, ModelStore
from predictive_scaler.policy.state import PlannerState
from tests.reliability.conftest import MODEL
from tests.reliability.harness import World
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics
from tests.support.specs import scaler_spec

START = datetime(2018, 6, 20, 8, 1, tzinfo=UTC)

SPEC: dict[str, Any] = scaler_spec(model=MODEL, requests_per_replica=150)


class ControllerMachine(RuleBasedStateMachine):
    httpserver: HTTPServer
    store_template: Path
    #: Across all examples: periods run, and how many of them decided each strategy / failed.
    seen: dict[str, int] = {}

    @initialize()
    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="reliability-sm-"))
        shutil.copytree(self.store_template, self.tmp / "models")
        # A clock that never moves: every re-publish of the good model falls in the same second as
        # the last one, so it must not reuse a version directory that was damaged since.
        self.store = ModelStore(self.tmp / "models", clock=FakeClock(datetime(2030, 1, 1, tzinfo=UTC)))
        self.good = self.store.serving(MODEL, expected_series=MODEL)
        self.level: float | None = 700.0
        self.metrics = FakeMetrics(lambda t: self.level)
        self.httpserver.clear()
        self.api = FakeApiServer(self.httpserver)
        self.world = World(self.api, self.store, "http://127.0.0.1:9", START, SPEC, metrics=self.metrics)

    def teardown(self) -> None:
        if hasattr(self, "api"):
            self.api.close()
        if hasattr(self, "tmp"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the world moves ----------------------------------------------------------------------
    @rule(level=st.one_of(st.floats(0, 3000), st.sampled_from([float("nan"), None, 1e12, -5.0])))
    def period(self, level: float | None) -> None:
        self.level = level
        self._period()

    def _period(self) -> None:
        p = self.world.step(len(self.world.periods))
        key = p.strategy or p.outcome
        self.seen[key] = self.seen.get(key, 0) + 1

    @rule(down=st.booleans())
    def prometheus(self, down: bool) -> None:
        self.metrics.down = down
        self._period()

    @rule()
    def damage_model(self) -> None:
        pointer = self.store.pointer(MODEL)
        assert pointer is not None
        path = self.store.version_dir(MODEL, pointer.version) / MODEL_FILE
        path.write_bytes(path.read_bytes()[:40])
        self._period()

    @rule()
    def publish_good_model(self) -> None:
        self.store.publish(MODEL, self.good.model, series=MODEL, window=self.good.manifest.window)
        self._period()

    @rule(requests=st.integers(1, 40), status=st.sampled_from([500, 503, 429]))
    def api_outage(self, requests: int, status: int) -> None:
        self.api.outage(status, requests=requests)
        self._period()

    @rule()
    def api_recovers(self) -> None:
        self.api.clear_faults()
        self._period()

    @rule()
    def restart(self) -> None:
        self.world.restart()
        self._period()

    # -- invariants beyond World.step's --------------------------------------------------------
    @invariant()
    def state_round_trips(self) -> None:
        if not hasattr(self, "world"):
            return
        status = self.world.scaler().get("status") or {}
        state = PlannerState.from_dict(status.get("plannerState"))
        assert PlannerState.from_dict(state.to_dict()) == state

    @invariant()
    def a_strategy_is_reported_for_every_completed_period(self) -> None:
        if not hasattr(self, "world") or not self.world.periods:
            return
        last = self.world.periods[-1]
        if last.outcome == "ok":
            assert last.status.get("strategy") == last.strategy


def test_state_machine(httpserver: HTTPServer, store_template: Path) -> None:
    ControllerMachine.httpserver = httpserver
    ControllerMachine.store_template = store_template
    ControllerMachine.seen = {}
    run_state_machine_as_test(ControllerMachine, settings=settings(
        max_examples=8, stateful_step_count=20, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    seen = ControllerMachine.seen
    # The random walks went through every strategy and through failed reconciles.
    assert sum(seen.values()) >= 120, seen
    assert {"predictive", "reactive", "hold", "retry"} <= set(seen), seen


@pytest.mark.parametrize("level", [float("nan"), None], ids=["nan", "empty"])
def test_missing_demand_never_scales_down_after_a_restart(httpserver: HTTPServer, store_template: Path,
                                                          level: float | None) -> None:
    """A pinned sequence the machine may or may not find: scale up, restart, lose demand."""
    ControllerMachine.httpserver = httpserver
    ControllerMachine.store_template = store_template
    machine = ControllerMachine()
    try:
        machine.start()
        for v in (700.0, 1400.0, 1400.0):
            machine.period(v)
        high = machine.world.target_replicas()
        machine.restart()
        for _ in range(6):
            machine.period(level)
            assert machine.world.target_replicas() >= high
        assert [p.strategy for p in machine.world.periods[-6:]] == ["hold"] * 3 + ["reactive"] * 3
    finally:
        machine.teardown()
