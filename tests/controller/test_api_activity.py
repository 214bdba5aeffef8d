"""Kubernetes API trouble is reported: ApiDegraded, the ClusterApiErrors Event and api_retries_total."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import kopf
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.api_activity import (
    RETRY_KINDS,
    ApiActivity,
    ApiTally,
    answer_kind,
    error_kind,
    failure_kind,
)
from predictive_scaler.controller.handlers import Handlers, build_registry
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.errors import (
    ClusterError,
    ConflictError,
    ForbiddenError,
    MissingApiError,
    NotFoundError,
    ServerError,
    ThrottledError,
)
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.sources.prometheus import PrometheusSource
from tests.controller.conftest import NS, TARGET, condition, install, scaler
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics


@pytest.mark.parametrize(
    ("status", "kind"),
    [(None, "unreachable"), (0, "unreachable"), (409, "conflict"), (429, "throttled"), (500, "server-error"),
     (503, "server-error"), (404, None), (200, None)],
    ids=["no-status", "zero", "409", "429", "500", "503", "404", "200"],
)
def test_answer_kind(status: int | None, kind: str | None) -> None:
    assert answer_kind(status) == kind
    assert kind is None or kind in RETRY_KINDS


@pytest.mark.parametrize(
    ("error", "kind", "failure"),
    [
        (ServerError("no answer"), "unreachable", "unreachable"),
        (ServerError("boom", status=503), "server-error", "server-error"),
        (ConflictError("stale"), "conflict", "conflict"),
        (ThrottledError("slow", retry_after=1.0), "throttled", "throttled"),
        (NotFoundError("gone", status=404), None, "HTTP 404"),
        (ForbiddenError("no", status=403), None, "HTTP 403"),
        (ClusterError("malformed"), None, "unreachable"),
        (MissingApiError("none", api="autoscaling/v2"), None, "missing API autoscaling/v2"),
        (None, None, None),
    ],
    ids=["unreachable", "server-error", "conflict", "throttled", "not-found", "forbidden", "plain", "missing-api",
         "none"],
)
def test_kinds_follow_the_error_type(error: ClusterError | None, kind: str | None, failure: str | None) -> None:
    assert error_kind(error) == kind
    if error is not None:
        assert failure_kind(error) == failure


def test_tallies_add_and_describe_in_a_fixed_order() -> None:
    total = ApiTally({"throttled": 1}) + ApiTally({"conflict": 2, "throttled": 1})
    assert total.retries == {"conflict": 2, "throttled": 2} and total.total == 4
    assert total.describe() == "2 conflict, 2 throttled"


def test_a_retry_is_counted_under_the_answer_before_it() -> None:
    activity, slept = ApiActivity(), []
    sleep = activity.sleep(slept.append)
    activity.begin()
    activity.answered(409)
    sleep(0.1)
    activity.answered(503)
    sleep(0.5)
    sleep(1.0)  # a second retry after the same answer
    activity.answered(200)
    assert slept == [0.1, 0.5, 1.0]
    assert activity.take().retries == {"conflict": 1, "server-error": 2}
    assert activity.take().total == 0  # taken: counting starts again


# -- the controller over the fake API, wired as run.py wires it ------------------------------------------

@pytest.fixture
def world(fake_api: FakeApiServer, clock: FakeClock, store: ModelStore,
          demand: dict[str, float]) -> tuple[Handlers, ControllerService]:
    activity = ApiActivity()
    kube = KubeCluster(activity.wrap(fake_api.api_client), retry=RetryPolicy(), clock=clock,
                       sleep=activity.sleep(clock.advance), rng=random.Random(7), request_timeout=5.0)
    settings = ControllerSettings(prometheus_url="http://127.0.0.1:9", model_store=store.root)
    metrics = FakeMetrics(lambda t: demand["now"])
    service = ControllerService(settings, kube, PrometheusSource("http://127.0.0.1:9", retries=0), store, clock,
                                metrics_factory=lambda spec, ref: metrics, api_activity=activity)
    return build_registry(service)[1], service


def _reconcile(handlers: Handlers, fake_api: FakeApiServer) -> str:
    obj = scaler(fake_api)
    try:
        handlers.reconcile(name=TARGET, namespace=NS, uid=obj["metadata"]["uid"], spec=obj["spec"],
                           status=obj.get("status") or {}, meta=obj["metadata"])
    except kopf.TemporaryError:
        return "retry"
    return "ok"


def _retries(service: ControllerService, kind: str) -> float:
    return service.telemetry.registry.get_sample_value(
        "predictive_scaler_api_retries_total", {"namespace": NS, "scaler": TARGET, "kind": kind}) or 0.0


def _warnings(fake_api: FakeApiServer) -> list[dict[str, Any]]:
    return [e for e in fake_api.objects("v1", "Event", NS) if e.get("reason") == "ClusterApiErrors"]


def _status_patches(fake_api: FakeApiServer) -> int:
    return sum(1 for r in fake_api.requests if r.method == "PATCH" and r.path.endswith("/status"))


Inject = Callable[[FakeApiServer], None]

FAILURES: list[tuple[str, Inject, bool]] = [
    # (id, fault for one period, whether the failing period can already write ApiDegraded)
    ("scale-5xx", lambda api: api.fail_next(r"/scale$", 500, times=50, method="PATCH"), True),
    ("status-5xx", lambda api: api.fail_next(r"/status$", 503, times=50, method="PATCH"), False),
]


@pytest.mark.parametrize(("inject", "reported_at_once"), [f[1:] for f in FAILURES], ids=[f[0] for f in FAILURES])
def test_a_failed_reconcile_is_reported_in_the_status_an_event_and_a_metric(
    fake_api: FakeApiServer, clock: FakeClock, demand: dict[str, float],
    world: tuple[Handlers, ControllerService], inject: Inject, reported_at_once: bool,
) -> None:
    handlers, service = world
    demand["now"] = 42.0
    install(fake_api, replicas=4)
    assert _reconcile(handlers, fake_api) == "ok"
    assert condition(scaler(fake_api)["status"], "ApiDegraded")["status"] == "False"
    assert not _warnings(fake_api)

    demand["now"] = 75.0  # the decision changes: /scale is patched
    clock.advance(timedelta(seconds=60))
    inject(fake_api)
    patches_before = _status_patches(fake_api)
    assert _reconcile(handlers, fake_api) == "retry"
    status = scaler(fake_api)["status"]
    assert _retries(service, "server-error") == RetryPolicy().max_attempts - 1  # every retry of the call
    if reported_at_once:
        cond = condition(status, "ApiDegraded")
        assert cond["status"] == "True" and cond["reason"] == "ReconcileFailed", cond
        assert "1 reconcile(s) failed" in cond["message"] and "HTTP 500" in cond["message"]
        assert status["strategy"] == "predictive"  # the rest of the status is untouched
        assert len(_warnings(fake_api)) == 1
    else:
        # The status write itself failed: it is not tried a second time in the same period.
        assert _status_patches(fake_api) - patches_before == RetryPolicy().max_attempts
        assert condition(status, "ApiDegraded")["status"] == "False"

    fake_api.clear_faults()
    clock.advance(timedelta(seconds=60))
    assert _reconcile(handlers, fake_api) == "ok"
    cond = condition(scaler(fake_api)["status"], "ApiDegraded")
    assert cond["status"] == "True" and "1 reconcile(s) failed" in cond["message"], cond
    assert len(_warnings(fake_api)) == 1  # posted once (deduplicated), whichever period could

    clock.advance(timedelta(seconds=60))
    assert _reconcile(handlers, fake_api) == "ok"
    assert condition(scaler(fake_api)["status"], "ApiDegraded")["status"] == "False"


def test_retries_absorbed_inside_a_reconcile_are_reported_in_its_own_status(
    fake_api: FakeApiServer, clock: FakeClock, world: tuple[Handlers, ControllerService],
) -> None:
    handlers, service = world
    install(fake_api, replicas=4)
    fake_api.throttle(429, retry_after=1.0, times=2)
    assert _reconcile(handlers, fake_api) == "ok"
    cond = condition(scaler(fake_api)["status"], "ApiDegraded")
    assert cond["status"] == "True" and cond["reason"] == "RetriesAbsorbed"
    assert "2 API call(s) retried (2 throttled)" in cond["message"] and "Priority and Fairness" in cond["message"]
    assert _retries(service, "throttled") == 2 and _retries(service, "conflict") == 0


@pytest.mark.parametrize(
    ("served", "outcome", "event_names"),
    [
        ((), "retry", "missing API autoscaling/v2 or autoscaling/v2beta2"),
        (("v2beta2",), "ok", None),
    ],
    ids=["no-hpa-api", "v2beta2-only-kubernetes-1.20"],
)
def test_a_server_without_the_hpa_api_is_named_in_the_condition_and_event(
    fake_api: FakeApiServer, world: tuple[Handlers, ControllerService], served: tuple[str, ...], outcome: str,
    event_names: str | None,
) -> None:
    # Before: a 404 on autoscaling/v2 had no retry kind, so the Event read "Kubernetes API errors (): …".
    from tests.kube.shared import serve_hpa_versions

    handlers, _ = world
    install(fake_api, replicas=4)
    serve_hpa_versions(fake_api, served)
    assert _reconcile(handlers, fake_api) == outcome
    cond = condition(scaler(fake_api)["status"], "ApiDegraded")
    warnings = _warnings(fake_api)
    if event_names is None:
        assert cond["status"] == "False" and not warnings
        return
    assert cond["status"] == "True" and cond["reason"] == "ApiMissing", cond
    assert "serves neither autoscaling/v2 nor autoscaling/v2beta2" in cond["message"]
    (event,) = warnings
    assert event["type"] == "Warning"
    assert f"Kubernetes API errors ({event_names})" in event["message"], event["message"]
    assert "()" not in event["message"] and "upgrade the cluster" in event["message"]
