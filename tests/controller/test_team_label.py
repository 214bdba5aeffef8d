"""``--team-label``: the FinOps metrics' ``team`` is the value of that label of the scaler's namespace, read with
``get`` on the namespace at most once per NAMESPACE_LABELS_TTL, and a failed read never fails the reconcile."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.commands.controller import register
from predictive_scaler.controller.handlers import build_registry
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ENV_TEAM_LABEL, ControllerSettings
from predictive_scaler.errors import ConfigError
from predictive_scaler.kube.scalers import NAMESPACE_LABELS_TTL
from tests.controller.conftest import NS, TARGET, MakeService, install, scaler, scaler_spec
from tests.controller.test_handlers import call
from tests.support.fakes.apiserver import FakeApiServer

BILLED = "predictive_scaler_gpu_hours_billed_total"


def _service(make_service: MakeService, label: str | None = "team") -> ControllerService:
    service = make_service()
    service.settings = dataclasses.replace(service.settings, team_label=label)
    return service


def _namespace(fake_api: FakeApiServer, **labels: str) -> None:
    fake_api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": labels}})


def _billed(service: ControllerService, team: str) -> float | None:
    return service.telemetry.registry.get_sample_value(
        BILLED, {"namespace": NS, "scaler": TARGET, "team": team, "node_pool": ""})


def _namespace_reads(fake_api: FakeApiServer) -> int:
    return sum(1 for r in fake_api.requests if r.method == "GET" and r.path == f"/api/v1/namespaces/{NS}")


def test_the_team_is_the_namespace_label_read_once_per_ttl(fake_api: FakeApiServer, make_service: MakeService,
                                                           clock: FakeClock) -> None:
    _namespace(fake_api, team="search", other="x")
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    service = _service(make_service)
    handlers = build_registry(service)[1]
    call(handlers, fake_api)
    assert _billed(service, "search") and _billed(service, "") is None
    _namespace(fake_api, team="ads")  # relabelled: seen once the cached labels expire
    clock.advance(60)
    call(handlers, fake_api)
    assert _namespace_reads(fake_api) == 1 and _billed(service, "ads") is None
    clock.advance(NAMESPACE_LABELS_TTL)
    call(handlers, fake_api)
    assert _namespace_reads(fake_api) == 2
    assert _billed(service, "ads") and _billed(service, "search") is None  # the old team's series is gone
    assert scaler(fake_api)["status"]["mode"] == "forecast-only"


def test_without_the_setting_the_namespace_is_never_read(fake_api: FakeApiServer, make_service: MakeService) -> None:
    _namespace(fake_api, team="search")
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    service = _service(make_service, None)
    call(build_registry(service)[1], fake_api)
    assert _namespace_reads(fake_api) == 0 and _billed(service, "")


def test_a_namespace_without_the_label_gives_an_empty_team(fake_api: FakeApiServer, make_service: MakeService) -> None:
    _namespace(fake_api, owner="someone")
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    service = _service(make_service)
    call(build_registry(service)[1], fake_api)
    assert _billed(service, "")


def test_a_forbidden_read_keeps_the_last_team_and_the_reconcile_goes_on(
        fake_api: FakeApiServer, make_service: MakeService, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    _namespace(fake_api, team="search")
    install(fake_api, replicas=4, spec=scaler_spec("forecast-only"))
    service = _service(make_service)
    handlers = build_registry(service)[1]
    call(handlers, fake_api)
    clock.advance(NAMESPACE_LABELS_TTL + 1)
    fake_api.fail_next(f"^/api/v1/namespaces/{NS}$", 403, method="GET")
    before = scaler(fake_api)["status"]["lastReconcileTime"]
    status = call(handlers, fake_api)
    assert status["lastReconcileTime"] != before and _billed(service, "search")
    assert "grant the controller get on namespaces" in caplog.text
    reads = _namespace_reads(fake_api)
    clock.advance(60)
    call(handlers, fake_api)
    assert _namespace_reads(fake_api) == reads  # not retried every period
    clock.advance(NAMESPACE_LABELS_TTL)
    call(handlers, fake_api)
    assert _namespace_reads(fake_api) == reads + 1


def test_the_flag_and_the_environment_set_it_and_a_bad_key_is_refused(tmp_path) -> None:
    import argparse

    from predictive_scaler.commands.controller import settings_from_args

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["controller", "--prometheus-url=http://p:9090", f"--model-store={tmp_path}",
                              "--team-label=example.com/team"])
    assert settings_from_args(args, {}).team_label == "example.com/team"
    env = {ENV_TEAM_LABEL: "team", "PREDICTIVE_SCALER_PROMETHEUS_URL": "http://p:9090",
           "PREDICTIVE_SCALER_MODEL_STORE": str(tmp_path)}
    assert ControllerSettings.from_env(env).team_label == "team"
    assert ControllerSettings.from_env({**env, ENV_TEAM_LABEL: ""}).team_label is None
    with pytest.raises(ConfigError, match="not a Kubernetes label key"):
        ControllerSettings.from_env({**env, ENV_TEAM_LABEL: "a team"})
    assert timedelta(seconds=NAMESPACE_LABELS_TTL) == timedelta(minutes=10)
