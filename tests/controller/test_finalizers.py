"""The controller puts no finalizer on a PredictiveScaler: deleting one (or the CRD) never waits for it.

The real API server check (controller stopped, scaler and CRD deleted) is in tests/e2e/test_uninstall.py;
these pin the registrations it relies on, so a kopf release that changes them fails here first.
"""

from __future__ import annotations

from typing import Any

import pytest

from predictive_scaler.controller.handlers import build_registry
from predictive_scaler.controller.service import ControllerService
from tests.controller.conftest import MakeService


@pytest.fixture
def service(make_service: MakeService) -> ControllerService:
    return make_service()


def test_no_handler_needs_a_finalizer(service: ControllerService) -> None:
    registry, _ = build_registry(service)
    spawning = registry._spawning.get_all_handlers()  # noqa: SLF001 - what kopf's processing reads
    changing = registry._changing.get_all_handlers()  # noqa: SLF001
    assert [h.id for h in spawning] == ["reconcile"]
    needs = [getattr(h, "requires_finalizer", None) for h in [*spawning, *changing]]
    assert needs == [False] * len(needs), needs


def test_the_timer_stops_once_the_watch_reports_the_scaler_deleted(service: ControllerService) -> None:
    registry, handlers = build_registry(service)
    (timer,) = registry._spawning.get_all_handlers()  # noqa: SLF001
    assert str(timer) == "Timer 'reconcile'" and timer.when is not None
    alive: Any = timer.when  # called with the one keyword it reads
    service.budget.seed("uid-1", 4, 10.0, 0.0)
    handlers.watched(type="MODIFIED", name="llm", namespace="ml", uid="uid-1")
    assert alive(uid="uid-1") and service.budget.total() == (4, 10.0)
    handlers.watched(type="DELETED", name="llm", namespace="ml", uid="uid-1")
    assert not alive(uid="uid-1"), "the timer of a deleted scaler would run on"
    assert alive(uid="uid-2")
    assert service.budget.total() == (0, 0.0), "the deleted scaler's booking was kept"
