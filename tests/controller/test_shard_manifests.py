"""The sharded install's builders: a StatefulSet whose ordinal is the shard index, and its Service."""

from __future__ import annotations

import copy

import pytest
import yaml

from predictive_scaler.controller.settings import ENV_SHARD_COUNT, ControllerSettings
from predictive_scaler.controller.shard_manifests import (
    SHARDS_SERVICE,
    controller_statefulset,
    render,
    sharded_objects,
    shards_service,
)
from predictive_scaler.errors import ConfigError
from tests.deploy.support import DEPLOY

DEPLOYMENT = yaml.safe_load((DEPLOY / "base" / "deployment.yaml").read_text())


def _env(obj: dict) -> dict[str, object]:
    (controller,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "controller"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in controller["env"]}


@pytest.mark.parametrize("replicas", [1, 2, 7], ids=["one", "two", "seven"])
def test_the_statefulset_runs_the_controller_pod_once_per_shard(replicas: int) -> None:
    sts = controller_statefulset(DEPLOYMENT, replicas)
    assert (sts["kind"], sts["metadata"]["name"]) == ("StatefulSet", "predictive-scaler-controller")
    assert sts["spec"]["replicas"] == replicas
    assert sts["spec"]["serviceName"] == SHARDS_SERVICE and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["selector"] == DEPLOYMENT["spec"]["selector"]
    assert "strategy" not in sts["spec"]  # a Deployment field
    env = _env(sts)
    assert env[ENV_SHARD_COUNT] == str(replicas)
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # Otherwise the very pod template of the Deployment.
    template = copy.deepcopy(sts["spec"]["template"])
    for c in template["spec"]["containers"]:
        c["env"] = [e for e in c["env"] if e["name"] not in (ENV_SHARD_COUNT, "POD_NAMESPACE")]
    assert template == DEPLOYMENT["spec"]["template"]


@pytest.mark.parametrize("ordinal", [0, 1, 4], ids=["first", "second", "last"])
def test_each_pod_reads_its_shard_from_its_name(ordinal: int) -> None:
    # What the controller makes of the StatefulSet's environment in pod predictive-scaler-controller-<i>.
    env = {k: v for k, v in _env(controller_statefulset(DEPLOYMENT, 5)).items() if isinstance(v, str)}
    settings = ControllerSettings.from_env({**env, "HOSTNAME": f"predictive-scaler-controller-{ordinal}"},
                                           prometheus_url="http://prometheus:9090", model_store="/models")
    assert (settings.shard_index, settings.shard_count) == (ordinal, 5)


def test_the_headless_service_selects_the_controller_pods() -> None:
    svc = shards_service(DEPLOYMENT)
    assert svc["spec"]["clusterIP"] == "None" and svc["metadata"]["name"] == SHARDS_SERVICE
    assert svc["spec"]["selector"].items() <= DEPLOYMENT["spec"]["template"]["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] == DEPLOYMENT["metadata"]["namespace"]


def test_a_second_build_replaces_the_shard_variables_rather_than_adding_them() -> None:
    once = controller_statefulset(DEPLOYMENT, 2)
    as_deployment = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "template": once["spec"]["template"]}}
    twice = controller_statefulset(as_deployment, 3)
    names = [e["name"] for e in twice["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names.count(ENV_SHARD_COUNT) == 1 and _env(twice)[ENV_SHARD_COUNT] == "3"


@pytest.mark.parametrize("replicas", [0, -1, True, 2.5, "2"], ids=["zero", "negative", "bool", "fraction", "text"])
def test_a_bad_replica_count_is_refused(replicas: object) -> None:
    with pytest.raises(ConfigError, match="whole number"):
        controller_statefulset(DEPLOYMENT, replicas)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [{"kind": "StatefulSet", "spec": {}}, {"kind": "Deployment"}],
                         ids=["not-a-deployment", "no-spec"])
def test_anything_but_the_controller_deployment_is_refused(bad: dict) -> None:
    with pytest.raises(ConfigError, match="Deployment"):
        controller_statefulset(bad, 2)


def test_the_committed_overlay_is_what_the_builders_make() -> None:
    committed = (DEPLOY / "overlays" / "sharded" / "statefulset.yaml").read_text()
    replicas = yaml.safe_load(committed.split("---")[0])["spec"]["replicas"]
    assert committed == render((DEPLOY / "base" / "deployment.yaml").read_text(), replicas), (
        "deploy/overlays/sharded/statefulset.yaml is out of date: run `make sharded-manifests`")
    assert [o["kind"] for o in sharded_objects(DEPLOYMENT, replicas)] == ["StatefulSet", "Service"]
