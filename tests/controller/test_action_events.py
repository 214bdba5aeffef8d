"""Every action of mode scale is one Event on the PredictiveScaler, with from→to and the kind of reason,
and a repeat of the same action raises that Event's count (client-go's recorder), not a new Event."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller import service as service_module
from predictive_scaler.controller.handlers import Handlers, build_registry
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.core.values import Forecast
from predictive_scaler.kube import manifests
from predictive_scaler.series import Series
from tests.controller.conftest import NS, TARGET, MakeService, install, scaler, scaler_spec
from tests.support.fakes.apiserver import FakeApiServer

SPEC = scaler_spec(maxReplicas=16, prewarm={"enabled": True, "gpusPerNode": 8, "budget": {"maxGpus": 16}})


def reconcile(handlers: Handlers, fake_api: FakeApiServer) -> dict[str, Any]:
    obj = scaler(fake_api)
    handlers.reconcile(name=TARGET, namespace=NS, uid=obj["metadata"]["uid"], spec=obj["spec"],
                       status=obj.get("status") or {}, meta=obj["metadata"], body=obj, logger=None)
    return scaler(fake_api)["status"]


def action_events(fake_api: FakeApiServer) -> list[dict[str, Any]]:
    return [e for e in fake_api.objects("v1", "Event", NS)
            if e["reason"] in ("SuccessfulRescale", "PlaceholdersCreated", "PlaceholdersRemoved")]


def stepped_forecast(level: Callable[[], tuple[float, float]]) -> Callable[[Series, datetime], Forecast]:
    """A model whose next step stays at ``level()[0]`` and every later step is at ``level()[1]``."""
    def forecast(recent: Series, now: datetime) -> Forecast:
        near, far = level()
        row = np.array([near] + [far] * 5)
        return Forecast(recent.last_time, recent.step_seconds, (0.5, 0.95), np.vstack([row, row]), "stepped")
    return forecast


@pytest.fixture
def service(make_service: MakeService) -> ControllerService:
    return make_service()


def test_each_action_is_one_event_and_a_repeat_raises_its_count(
        fake_api: FakeApiServer, service: ControllerService, demand: dict[str, float], clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A window longer than the four model steps the test spans, so the second creation is a repeat.
    monkeypatch.setattr(service_module, "EVENT_REPEAT_SECONDS", 1800.0)
    handlers = build_registry(service)[1]
    install(fake_api, replicas=4, spec=SPEC)
    demand["now"] = demand["before"] = 42.0
    levels = {"now": (42.0, 42.0)}

    reconcile(handlers, fake_api)  # 42 req/s at 10 per replica: 4 → 5
    rescale = "New size: 5; reason: predictive (Deployment/llm scaled from 4 to 5 replicas)"
    assert [(e["reason"], e["message"], e["count"]) for e in action_events(fake_api)] == [
        ("SuccessfulRescale", rescale, 1)]

    runtime = next(iter(service._runtimes.values()))
    assert runtime.model is not None
    monkeypatch.setattr(runtime.model, "forecast", stepped_forecast(lambda: levels["now"]))
    created = "New placeholder size: 5 pods, 5 GPUs; reason: predictive (placeholder pods from 0 to 5)"
    removed = "New placeholder size: 0 pods, 0 GPUs; reason: predictive (placeholder pods from 5 to 0)"
    for far, pods, expected in [
        (100.0, 5, [("SuccessfulRescale", rescale, 1), ("PlaceholdersCreated", created, 1)]),
        (42.0, 0, [("SuccessfulRescale", rescale, 1), ("PlaceholdersCreated", created, 1),
                   ("PlaceholdersRemoved", removed, 1)]),
        # The same creation again: the Event posted is counted again, none is added.
        (100.0, 5, [("SuccessfulRescale", rescale, 1), ("PlaceholdersCreated", created, 2),
                    ("PlaceholdersRemoved", removed, 1)]),
        # Nothing changed: no action, no Event.
        (100.0, 5, [("SuccessfulRescale", rescale, 1), ("PlaceholdersCreated", created, 2),
                    ("PlaceholdersRemoved", removed, 1)]),
    ]:
        levels["now"] = (42.0, far)
        clock.advance(timedelta(seconds=300))  # a new model step: the forecast is asked again
        status = reconcile(handlers, fake_api)
        held = fake_api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(TARGET))
        assert held is not None and held["spec"]["replicas"] == pods and status["placeholderGpus"] == pods
        assert sorted((e["reason"], e["message"], e["count"]) for e in action_events(fake_api)) == sorted(expected)
    again = next(e for e in action_events(fake_api) if e["reason"] == "PlaceholdersCreated")
    assert again["lastTimestamp"] > again["firstTimestamp"]
    repeats = [r for r in fake_api.requests if r.method == "PATCH" and "/events/" in r.path]
    assert len(repeats) == 1 and repeats[0].body["count"] == 2


def test_forecast_only_reports_would_scale_and_acts_on_nothing(
        fake_api: FakeApiServer, service: ControllerService, demand: dict[str, float]) -> None:
    handlers = build_registry(service)[1]
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    demand["now"] = demand["before"] = 62.0
    reconcile(handlers, fake_api)
    reasons = [e["reason"] for e in fake_api.objects("v1", "Event", NS)]
    assert "ForecastOnly" in reasons and not action_events(fake_api)


@pytest.mark.parametrize(("with_placeholder", "ending"), [
    (True, "(or set mode: forecast-only to only report) — the placeholder was removed"),
    (False, "(or set mode: forecast-only to only report)"),
], ids=["placeholder-removed", "none-held"])
def test_the_conflict_says_the_placeholder_was_removed_only_when_one_was(
        fake_api: FakeApiServer, service: ControllerService, with_placeholder: bool, ending: str) -> None:
    handlers = build_registry(service)[1]
    obj = install(fake_api, replicas=4)
    if with_placeholder:
        fake_api.put(manifests.placeholder_deployment(TARGET, NS, obj["metadata"]["uid"], 2, 1))
    fake_api.add_hpa(NS, "llm-hpa", "Deployment", TARGET)
    status = reconcile(handlers, fake_api)
    conflict = next(c for c in status["conditions"] if c["type"] == "ConflictingAutoscaler")
    assert conflict["message"].endswith(ending), conflict["message"]
    assert conflict["message"].startswith("refusing to scale Deployment/llm: HorizontalPodAutoscaler")
