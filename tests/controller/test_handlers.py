"""The kopf handlers, called directly with what kopf would pass, against the stateful fake API server."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import kopf
import pytest

from predictive_scaler.controller.handlers import Handlers, build_registry
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ClusterBudgetLimits
from predictive_scaler.crd import PAUSE_ANNOTATION
from predictive_scaler.kube import manifests
from tests.controller.conftest import (
    NS,
    TARGET,
    MakeService,
    condition,
    install,
    scaler,
    scaler_spec,
)
from tests.support.fakes.apiserver import FakeApiServer

DEPLOYMENT = ("apps/v1", "Deployment")


def call(handlers: Handlers, fake_api: FakeApiServer, name: str = TARGET) -> dict[str, Any]:
    """Run the timer handler on the resource as the watch would deliver it; return the new status."""
    obj = scaler(fake_api, name)
    handlers.reconcile(name=name, namespace=NS, uid=obj["metadata"]["uid"], spec=obj["spec"],
                       status=obj.get("status") or {}, meta=obj["metadata"], body=obj, logger=None)
    return scaler(fake_api, name)["status"]


def replicas(fake_api: FakeApiServer, name: str = TARGET) -> int:
    obj = fake_api.get(*DEPLOYMENT, NS, name)
    assert obj is not None
    return int(obj["spec"]["replicas"])


def placeholder(fake_api: FakeApiServer, name: str = TARGET) -> dict[str, Any] | None:
    return fake_api.get(*DEPLOYMENT, NS, manifests.placeholder_name(name))


def add_placeholder(fake_api: FakeApiServer, name: str = TARGET, pods: int = 2) -> None:
    """A placeholder left by an earlier reconcile in scale mode."""
    uid = scaler(fake_api, name)["metadata"]["uid"]
    fake_api.put(manifests.placeholder_deployment(name, NS, uid, pods, 1))


def events(fake_api: FakeApiServer) -> list[dict[str, Any]]:
    return fake_api.objects("v1", "Event", NS)


@pytest.fixture
def service(make_service: MakeService) -> ControllerService:
    return make_service()


@pytest.fixture
def handlers(service: ControllerService) -> Handlers:
    return build_registry(service)[1]


def test_registry_registers_the_handlers_on_its_own_registry(service: ControllerService) -> None:
    registry, handlers = build_registry(service)
    assert isinstance(registry, kopf.OperatorRegistry)
    other, _ = build_registry(service)
    assert other is not registry  # a fresh registry per call: no global state between tests
    assert callable(handlers.reconcile) and callable(handlers.startup) and callable(handlers.deleted)


def test_scale_mode_scales_the_target_and_writes_status(fake_api: FakeApiServer, handlers: Handlers,
                                                         demand: dict[str, float]) -> None:
    demand["now"] = demand["before"] = 62.0  # 62 req/s at 10 per replica: at least 7 replicas
    install(fake_api, replicas=4)
    status = call(handlers, fake_api)
    assert status["desiredReplicas"] >= 7
    assert replicas(fake_api) == status["desiredReplicas"]
    assert status["mode"] == "scale"
    assert condition(status, "Ready")["reason"] == "Scaled"
    assert condition(status, "ConflictingAutoscaler")["status"] == "False"
    assert status["plannerState"]["lastDecidedAt"] is not None
    assert status["modelVersion"]
    assert len(status["forecast"]["p95"]) == 1800 // 300
    patch = next(r for r in fake_api.requests if r.method == "PATCH" and r.path.endswith("/scale"))
    assert patch.body["spec"]["replicas"] == status["desiredReplicas"]
    assert patch.body["metadata"]["resourceVersion"]  # written against what was read


def test_forecast_only_touches_nothing_but_reports(fake_api: FakeApiServer, handlers: Handlers,
                                                  demand: dict[str, float]) -> None:
    demand["now"] = demand["before"] = 62.0
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    before = {(r.method, r.path) for r in fake_api.requests}
    status = call(handlers, fake_api)
    writes = [(r.method, r.path) for r in fake_api.writes() if (r.method, r.path) not in before]
    assert replicas(fake_api) == 4
    assert {m for m, p in writes} <= {"PATCH", "POST"}
    assert all(p.endswith("/status") or p.endswith("/events") for _, p in writes), writes
    assert status["desiredReplicas"] >= 7 and status["mode"] == "forecast-only"
    ready = condition(status, "Ready")
    assert ready["reason"] == "ForecastOnly" and "scaling would run" in ready["message"]
    assert any(e["reason"] == "ForecastOnly" for e in events(fake_api))
    assert status["budgetInUse"]["gpus"] == 0  # nothing is held in forecast-only


@pytest.mark.parametrize("change", ["forecast-only", "prewarm-off"])
def test_leaving_scale_mode_or_prewarm_removes_the_placeholder(fake_api: FakeApiServer, handlers: Handlers,
                                                              change: str) -> None:
    spec = scaler_spec("forecast-only") if change == "forecast-only" else scaler_spec(
        prewarm={"enabled": False, "budget": {"maxGpus": 8}})
    install(fake_api, spec=spec)
    add_placeholder(fake_api)
    call(handlers, fake_api)
    assert placeholder(fake_api) is None
    assert any(r.method == "DELETE" and r.path.endswith(manifests.placeholder_name(TARGET))
               for r in fake_api.requests)


def test_deleting_the_scaler_garbage_collects_its_placeholder(fake_api: FakeApiServer, handlers: Handlers) -> None:
    install(fake_api)
    add_placeholder(fake_api)
    fake_api.delete(manifests.API_VERSION, manifests.KIND, NS, TARGET)
    assert placeholder(fake_api) is None  # ownerReferences, not a finalizer of ours


def test_paused_annotation_acts_on_nothing(fake_api: FakeApiServer, handlers: Handlers,
                                           demand: dict[str, float]) -> None:
    demand["now"] = demand["before"] = 62.0
    obj = install(fake_api, replicas=4)
    obj["metadata"].setdefault("annotations", {})[PAUSE_ANNOTATION] = "true"
    fake_api.put(obj)
    add_placeholder(fake_api)
    status = call(handlers, fake_api)
    assert replicas(fake_api) == 4 and placeholder(fake_api) is not None
    paused = condition(status, "Paused")
    assert paused["status"] == "True" and PAUSE_ANNOTATION in paused["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert "plannerState" not in status


INVALID = [
    ("min-above-max", {"minReplicas": 9, "maxReplicas": 3}, "spec.minReplicas"),
    ("negative-budget", {"prewarm": {"enabled": True, "budget": {"maxGpus": -1}}}, "spec.prewarm.budget.maxGpus"),
    ("unknown-kind", {"target": {"apiVersion": "apps/v1", "kind": "Deploymnet", "name": TARGET}}, "spec.target.kind"),
    ("no-scale-subresource", {"target": {"apiVersion": "v1", "kind": "Pod", "name": TARGET}}, "spec.target.kind"),
    ("unknown-field", {"maxReplica": 3}, "spec.maxReplica"),
]


@pytest.mark.parametrize("overrides, field", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_spec_is_a_condition_and_an_event_and_no_action(fake_api: FakeApiServer, handlers: Handlers,
                                                               overrides: dict[str, Any], field: str) -> None:
    install(fake_api, replicas=4, spec=scaler_spec(**overrides))
    status = call(handlers, fake_api)
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert field in ready["message"]
    warning = [e for e in events(fake_api) if e["reason"] == "InvalidSpec"]
    assert warning and warning[0]["type"] == "Warning" and field in warning[0]["message"]
    assert replicas(fake_api) == 4
    assert not [r for r in fake_api.writes() if "/scale" in r.path or "deployments" in r.path]


@pytest.mark.parametrize("other", ["hpa", "scaledobject"])
def test_another_autoscaler_on_the_target_is_refused_in_scale_mode(fake_api: FakeApiServer, handlers: Handlers,
                                                                 demand: dict[str, float], other: str) -> None:
    demand["now"] = demand["before"] = 62.0
    install(fake_api, replicas=4)
    add_placeholder(fake_api)
    if other == "hpa":
        fake_api.add_hpa(NS, "llm-hpa", "Deployment", TARGET)
    else:
        fake_api.install_keda()
        fake_api.add_scaled_object(NS, "llm-keda", TARGET)
    status = call(handlers, fake_api)
    conflict = condition(status, "ConflictingAutoscaler")
    assert conflict["status"] == "True" and ("llm-hpa" in conflict["message"] or "llm-keda" in conflict["message"])
    assert replicas(fake_api) == 4
    assert placeholder(fake_api) is None  # nothing speculative lingers while refused
    assert any(e["reason"] == "ConflictingAutoscaler" and e["type"] == "Warning" for e in events(fake_api))


def test_another_autoscaler_only_reported_in_forecast_only(fake_api: FakeApiServer, handlers: Handlers) -> None:
    install(fake_api, spec=scaler_spec("forecast-only"))
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", TARGET)
    status = call(handlers, fake_api)
    assert condition(status, "ConflictingAutoscaler")["status"] == "True"
    assert condition(status, "Ready")["reason"] == "ForecastOnly"
    assert status["desiredReplicas"] >= 1


FAULTS = [
    # (id, inject, outcome): outcome "ok" = reconciled after retries; "retry" = kopf.TemporaryError
    ("409-stale-scale", lambda api: api.fail_next(r"/scale$", 409, method="PATCH"), "ok"),
    ("409-every-2nd-patch", lambda api: api.fail_every_nth_patch(2, 409), "ok"),
    ("429-retry-after", lambda api: api.throttle(429, retry_after=1.0, times=2), "ok"),
    ("503-once", lambda api: api.fail_next(r"/pods$", 503), "ok"),
    ("500-outage", lambda api: api.outage(500, requests=40), "retry"),
    ("429-too-long", lambda api: api.throttle(429, retry_after=120.0, times=40), "retry"),
]


@pytest.mark.parametrize("inject, outcome", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_api_faults_are_retried_and_never_change_the_strategy(fake_api: FakeApiServer, handlers: Handlers,
                                                            demand: dict[str, float], clock: Any,
                                                            inject: Any, outcome: str) -> None:
    demand["now"] = demand["before"] = 62.0
    install(fake_api, replicas=4)
    first = call(handlers, fake_api)
    strategy = first["strategy"]
    demand["now"] = demand["before"] = 75.0
    clock.advance(60)
    inject(fake_api)
    if outcome == "retry":
        with pytest.raises(kopf.TemporaryError) as info:
            call(handlers, fake_api)
        assert info.value.delay is not None and 0 < info.value.delay <= 60
        assert scaler(fake_api)["status"]["plannerState"] == first["plannerState"]  # nothing half-written
        fake_api.clear_faults()
        clock.advance(60)
    second = call(handlers, fake_api)
    assert second["strategy"] == strategy == "predictive"
    # 75 req/s at 10 per replica: 7 replicas are within the HPA's 10 % tolerance, so at least 7.
    assert replicas(fake_api) == second["desiredReplicas"] >= 7


def test_missing_target_is_reported_not_retried(fake_api: FakeApiServer, handlers: Handlers) -> None:
    fake_api.add_scaler(NS, TARGET, scaler_spec())
    status = call(handlers, fake_api)
    ready = condition(status, "Ready")
    assert ready["reason"] == "TargetNotFound" and "spec.target" in ready["message"]


def test_a_restart_changes_no_decision(fake_api: FakeApiServer, make_service: MakeService,
                                       demand: dict[str, float], clock: Any) -> None:
    """Planner state lives in the status: a fresh process decides exactly as the old one would have."""
    install(fake_api, replicas=8)
    demand["now"] = demand["before"] = 75.0
    first = build_registry(make_service())[1]
    call(first, fake_api)
    # Demand drops: the HPA's 300 s scale-down stabilisation (in plannerState) must hold the replicas.
    demand["now"] = demand["before"] = 20.0
    clock.advance(60)
    fresh = build_registry(make_service())[1]  # a new process: empty memory
    after_restart = call(fresh, fake_api)
    assert after_restart["desiredReplicas"] == 8  # stabilised, not dropped to 2
    assert "stabilis" in " ".join(c["message"] for c in after_restart["conditions"]) or \
        after_restart["plannerState"]["recommendations"]


def test_cluster_budget_bounds_the_sum_over_scalers(fake_api: FakeApiServer, make_service: MakeService,
                                                   demand: dict[str, float], store: Any) -> None:
    """Two scalers that each may speculate on 8 GPUs share a cluster cap of 3."""
    from tests.controller.conftest import publish_model

    publish_model(store, "other")
    # History at 60 req/s, demand now 25: the forecast asks for more than the HPA rule.
    demand["now"], demand["before"] = 25.0, 60.0
    install(fake_api, replicas=3)
    install(fake_api, replicas=3, name="other", target="other",
            spec=scaler_spec(target={"apiVersion": "apps/v1", "kind": "Deployment", "name": "other"},
                             model={"name": "other"}))
    service = make_service(budget=ClusterBudgetLimits(max_gpus=3))
    handlers = build_registry(service)[1]
    a = call(handlers, fake_api, TARGET)
    b = call(handlers, fake_api, "other")
    total = a["budgetInUse"]["gpus"] + b["budgetInUse"]["gpus"]
    assert a["budgetInUse"]["gpus"] > 0, "the scenario must speculate for the cap to matter"
    assert total <= 3
    assert service.budget.total()[0] <= 3


def test_startup_seeds_the_budget_from_every_status(fake_api: FakeApiServer, make_service: MakeService) -> None:
    install(fake_api)
    obj = scaler(fake_api)
    obj["status"] = {"budgetInUse": {"gpus": 5, "costPerHour": 12.5, "currency": "USD"}}
    fake_api.put(obj)
    service = make_service(budget=ClusterBudgetLimits(max_gpus=6))
    handlers = build_registry(service)[1]
    handlers.startup(settings=kopf.OperatorSettings(), logger=None)
    assert service.budget.total() == (5, 12.5)
    with service.budget.reserve("someone-else", 2.5, 0.0) as r:
        assert r.allowed_gpus == 1


def test_deleted_handler_releases_the_booking(fake_api: FakeApiServer, service: ControllerService,
                                              handlers: Handlers) -> None:
    service.budget.seed("uid-1", 4, 10.0, 0.0)
    handlers.deleted(name=TARGET, namespace=NS, uid="uid-1", logger=None)
    assert service.budget.total() == (0, 0.0)


def test_events_are_not_repeated_every_period(fake_api: FakeApiServer, handlers: Handlers, clock: Any) -> None:
    install(fake_api, spec=scaler_spec(minReplicas=9, maxReplicas=3))
    for _ in range(3):
        call(handlers, fake_api)
        clock.advance(timedelta(seconds=60))
    assert len([e for e in events(fake_api) if e["reason"] == "InvalidSpec"]) == 1
