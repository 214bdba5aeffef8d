"""Stopping: a period that has written nothing is abandoned, one that has written is finished."""

from __future__ import annotations

import time

import pytest

from predictive_scaler.controller.api_activity import ApiActivity
from predictive_scaler.controller.handlers import build_registry
from predictive_scaler.controller.health import LoopMonitor
from predictive_scaler.controller.lifecycle import Shutdown
from predictive_scaler.errors import ShuttingDown
from tests.controller.conftest import NS, TARGET, MakeService, install, scaler
from tests.support.fakes.apiserver import FakeApiServer


@pytest.mark.parametrize(("stopping", "wrote", "outcome"), [
    (False, False, "slept"),
    (True, False, "abandoned"),
    (True, True, "slept"),
], ids=["running", "stopping-before-any-write", "stopping-mid-writes"])
def test_retry_sleep_on_shutdown(stopping: bool, wrote: bool, outcome: str) -> None:
    activity = ApiActivity()
    activity.begin()
    if wrote:
        activity.writing()
    shutdown = Shutdown(activity)
    if stopping:
        shutdown.request("SIGTERM")
    began = time.monotonic()
    if outcome == "abandoned":
        with pytest.raises(ShuttingDown, match="before any write"):
            shutdown.sleep(5.0)
        assert time.monotonic() - began < 0.5  # at once, not after the 5 s
    else:
        shutdown.sleep(0.2)
        assert time.monotonic() - began >= 0.19  # a period that wrote keeps its retry pace


def test_writes_are_noticed_by_the_observed_client(fake_api: FakeApiServer) -> None:
    activity = ApiActivity()
    client = activity.wrap(fake_api.api_client)
    activity.begin()
    client.call_api("GET", fake_api.httpserver.url_for("/api/v1/nodes"))
    assert not activity.wrote()
    client.call_api("DELETE", fake_api.httpserver.url_for("/api/v1/namespaces/ml/pods/none"))
    assert activity.wrote()
    activity.begin()
    assert not activity.wrote()


def test_no_period_starts_once_stopping(fake_api: FakeApiServer, make_service: MakeService) -> None:
    install(fake_api)
    service = make_service()
    service.shutdown = Shutdown(service.api_activity)
    service.loop = LoopMonitor(30)
    _, handlers = build_registry(service)
    service.shutdown.request("SIGTERM")
    obj = scaler(fake_api)
    before = len(fake_api.requests)
    handlers.reconcile(name=TARGET, namespace=NS, uid=obj["metadata"]["uid"], spec=obj["spec"], status={},
                       meta=obj["metadata"])  # returns quietly: kopf does not retry a stopping process
    assert len(fake_api.requests) == before and "status" not in scaler(fake_api)
    assert service.loop.in_flight == 0
