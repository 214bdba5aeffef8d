"""prometheus.auth in the chart: each Secret mounted read-only into the controller's and the retraining
job's pods, and the PREDICTIVE_SCALER_PROMETHEUS_* variables (the --prometheus-* flags' defaults)
pointing at its files; nothing set, nothing added."""

from __future__ import annotations

from typing import Any

import pytest

from predictive_scaler.sources.prometheus_auth import ENVS

from .helm_support import helm_render, validate_all
from .support import one

AUTH = {
    "bearerTokenSecret": {"name": "prom-token"},
    "basicAuthSecret": {"name": "prom-basic"},
    "tlsSecret": {"name": "prom-tls", "caKey": "ca.crt", "certKey": "tls.crt", "keyKey": "tls.key"},
    "headers": {"X-Scope-OrgID": "team-a", "X-Extra": "1"},
}


def pods(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The controller's and the retraining job's pod specs."""
    found = {}
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet") and obj["metadata"]["name"].endswith("-controller"):
            found["controller"] = obj["spec"]["template"]["spec"]
        if obj["kind"] == "CronJob" and obj["metadata"]["name"].endswith("-retrain"):
            found["retrain"] = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert set(found) == {"controller", "retrain"}
    return found


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("shards", [1, 2])
def test_each_secret_is_mounted_read_only_and_named_by_its_variable(shards: int) -> None:
    objs = helm_render({"prometheus": {"auth": AUTH}, "sharding": {"replicas": shards}})
    validate_all(objs)
    for who, pod in pods(objs).items():
        env = env_of(pod)
        assert env["PREDICTIVE_SCALER_PROMETHEUS_BEARER_TOKEN_FILE"] == "/var/run/secrets/prometheus/bearer/token"
        assert env["PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_USER"] == {
            "secretKeyRef": {"name": "prom-basic", "key": "username"}}
        assert env["PREDICTIVE_SCALER_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"] == \
            "/var/run/secrets/prometheus/basic-auth/password"
        assert env["PREDICTIVE_SCALER_PROMETHEUS_CA_FILE"] == "/var/run/secrets/prometheus/tls/ca.crt"
        assert env["PREDICTIVE_SCALER_PROMETHEUS_CERT_FILE"] == "/var/run/secrets/prometheus/tls/tls.crt"
        assert env["PREDICTIVE_SCALER_PROMETHEUS_KEY_FILE"] == "/var/run/secrets/prometheus/tls/tls.key"
        assert env["PREDICTIVE_SCALER_PROMETHEUS_HEADERS"] == "X-Extra=1,X-Scope-OrgID=team-a"
        assert {n for n in env if n.startswith("PREDICTIVE_SCALER_PROMETHEUS_") and n.endswith(
            ("_FILE", "_USER", "_HEADERS"))} <= set(ENVS.values()), "every variable is one the commands read"
        (container,) = pod["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"].startswith("prometheus-")}
        assert {n: (m["mountPath"], m.get("readOnly")) for n, m in mounts.items()} == {
            "prometheus-bearer": ("/var/run/secrets/prometheus/bearer", True),
            "prometheus-basic-auth": ("/var/run/secrets/prometheus/basic-auth", True),
            "prometheus-tls": ("/var/run/secrets/prometheus/tls", True),
        }, who
        volumes = {v["name"]: v for v in pod["volumes"] if v["name"].startswith("prometheus-")}
        assert {n: v["secret"]["secretName"] for n, v in volumes.items()} == {
            "prometheus-bearer": "prom-token", "prometheus-basic-auth": "prom-basic", "prometheus-tls": "prom-tls"}


def test_nothing_is_added_without_auth() -> None:
    for pod in pods(helm_render()).values():
        assert not [n for n in env_of(pod) if n.startswith("PREDICTIVE_SCALER_PROMETHEUS_") and n != (
            "PREDICTIVE_SCALER_PROMETHEUS_URL")]
        assert not [v for v in pod["volumes"] if v["name"].startswith("prometheus-")]


def test_a_ca_alone_and_insecure_skip_verify() -> None:
    objs = helm_render({"prometheus": {"auth": {"tlsSecret": {"name": "ca-only"}, "insecureSkipVerify": False}}})
    env = env_of(pods(objs)["controller"])
    assert env["PREDICTIVE_SCALER_PROMETHEUS_CA_FILE"] == "/var/run/secrets/prometheus/tls/ca.crt"
    assert "PREDICTIVE_SCALER_PROMETHEUS_CERT_FILE" not in env
    env = env_of(pods(helm_render({"prometheus": {"auth": {"insecureSkipVerify": True}}}))["retrain"])
    assert env["PREDICTIVE_SCALER_PROMETHEUS_INSECURE_SKIP_VERIFY"] == "true"


@pytest.mark.parametrize(("auth", "words"), [
    ({"tlsSecret": {"name": "t", "certKey": "tls.crt"}}, "both certKey and keyKey"),
    ({"headers": {"bad name": "x"}}, "bad name"),
    ({"headers": {"X-Scope-OrgID": "a,b"}}, "headers"),
    ({"bearerTokenSecret": {"name": "t", "token": "inline"}}, "token"),
])
def test_bad_auth_values_are_refused(auth: dict[str, Any], words: str) -> None:
    with pytest.raises(Exception, match=words):  # noqa: B017, PT011 - helm_python raises its own error type
        helm_render({"prometheus": {"auth": auth}})


def test_the_controller_deployment_keeps_one_container() -> None:
    objs = helm_render({"prometheus": {"auth": AUTH}})
    assert len(one(objs, "Deployment", "predictive-scaler-controller")["spec"]["template"]["spec"]["containers"]) == 1


def test_the_team_label_reaches_the_controller_only_when_set() -> None:
    settings = one(helm_render({"controller": {"teamLabel": "example.com/team"}}), "ConfigMap",
                   "predictive-scaler-settings")["data"]
    assert settings["PREDICTIVE_SCALER_TEAM_LABEL"] == "example.com/team"
    default = one(helm_render(), "ConfigMap", "predictive-scaler-settings")["data"]
    assert "PREDICTIVE_SCALER_TEAM_LABEL" not in default
