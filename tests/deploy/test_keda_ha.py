"""KEDA high availability and TLS: the KEDA-only Deployment, its budget and Service, the TLS Secret.

`keda.highAvailability.enabled` renders `<fullname>-keda`, a Deployment running
`controller --keda-only` (docs/keda.md, "High availability and sharding"), which must equal the
kustomize overlay deploy/overlays/keda-ha; `keda.tls` mounts a kubernetes.io/tls Secret into every
pod serving KEDA and points PREDICTIVE_SCALER_KEDA_TLS_* at it. The container's arguments and
environment are parsed by the CLI and the controller's settings, so what the chart sets is what
the process runs with. Every render validates strictly (1.27 and the newest schemas).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from predictive_scaler import cli
from predictive_scaler.commands.controller import settings_from_args

from .helm_support import NAMESPACE, helm_render, validate_all
from .helm_support import key as _key
from .support import OVERLAYS, find, one, render
from .test_helm_chart import _diff, _normalised

HA: dict[str, Any] = {"keda": {"highAvailability": {"enabled": True}}}
TLS_DIR = "/etc/predictive-scaler/keda-tls"
SHARED = {"predictive-scaler.io/serves-keda": "true"}


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.kubectl
def test_helm_renders_the_keda_ha_overlay() -> None:
    ours = {_key(o): o for o in helm_render(HA)}
    theirs = {_key(o): o for o in render(OVERLAYS["keda-ha"])}
    del theirs[("Namespace", "", NAMESPACE)]  # release-namespace (test_helm_chart.INTENDED_DIFFERENCES)
    assert sorted(ours) == sorted(theirs)
    drift = {k: _diff(_normalised(theirs[k]), _normalised(ours[k])) for k in theirs
             if _normalised(theirs[k]) != _normalised(ours[k])}
    assert not drift, "the chart differs from deploy/overlays/keda-ha:\n" + "\n".join(
        f"--- {k}\n{d}" for k, d in drift.items())


def test_off_by_default() -> None:
    objs = helm_render()
    assert not find(objs, "Deployment", "predictive-scaler-keda")
    assert not find(objs, "PodDisruptionBudget")
    assert "predictive-scaler.io/serves-keda" not in _pod(one(objs, "Deployment"))["metadata"]["labels"]


@pytest.mark.parametrize("which", ["helm", pytest.param("kustomize", marks=pytest.mark.kubectl)])
def test_the_keda_only_deployment(which: str) -> None:
    objs = helm_render(HA) if which == "helm" else render(OVERLAYS["keda-ha"])
    keda = one(objs, "Deployment", "predictive-scaler-keda")
    controller = one(objs, "Deployment", "predictive-scaler-controller")
    spec, pod = keda["spec"], _pod(keda)["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    (container,) = pod["containers"]
    assert container["args"][:2] == ["controller", "--keda-only"]
    assert {p["containerPort"] for p in container["ports"]} == {6000, 8080}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert pod["serviceAccountName"] == _pod(controller)["spec"]["serviceAccountName"]
    assert container["envFrom"] == _pod(controller)["spec"]["containers"][0]["envFrom"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v], "no model store"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["maxSkew"] == 1
    assert _matches(spread["labelSelector"]["matchLabels"], _pod(keda)["metadata"]["labels"])
    # Drains keep one.
    pdb = one(objs, "PodDisruptionBudget", "predictive-scaler-keda")["spec"]
    assert pdb["minAvailable"] == 1
    assert _matches(pdb["selector"]["matchLabels"], _pod(keda)["metadata"]["labels"])
    assert not _matches(pdb["selector"]["matchLabels"], _pod(controller)["metadata"]["labels"])
    # The Service reaches both servers, and nothing else.
    selector = one(objs, "Service", "predictive-scaler-keda")["spec"]["selector"]
    assert SHARED.items() <= selector.items()
    assert _matches(selector, _pod(keda)["metadata"]["labels"])
    assert _matches(selector, _pod(controller)["metadata"]["labels"])
    assert not _matches(selector, one(objs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"])
    # The NetworkPolicy covers the pods: KEDA's namespace to 6000, Prometheus's to 8080.
    policy = one(objs, "NetworkPolicy", "predictive-scaler")["spec"]
    assert _matches(policy["podSelector"]["matchLabels"], _pod(keda)["metadata"]["labels"])
    ingress = {(r["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                r["ports"][0]["port"]) for r in policy["ingress"]}
    assert ingress == {("monitoring", 8080), ("keda", 6000)}
    if which == "helm":
        validate_all(objs)


def _settings(objs: list[dict[str, Any]], container: dict[str, Any]) -> Any:
    """What the process makes of the container's arguments and environment."""
    environ = dict(one(objs, "ConfigMap", "predictive-scaler-settings")["data"])
    environ.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    # Kubernetes expands $(VAR) in arguments from the container's environment.
    args = [re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: environ[m.group(1)], a) for a in container["args"]]
    args = cli.build_parser().parse_args(args)
    return settings_from_args(args, environ)


@pytest.mark.parametrize("client_ca", [False, True], ids=["tls", "mtls"])
@pytest.mark.parametrize("ha", [False, True], ids=["controller-only", "ha"])
def test_tls_is_mounted_into_every_pod_serving_keda(client_ca: bool, ha: bool) -> None:
    values: dict[str, Any] = {"keda": {"tls": {"secretName": "keda-cert", "clientCA": client_ca},
                                       "highAvailability": {"enabled": ha}}}
    objs = helm_render(values)
    validate_all(objs)
    servers = [one(objs, "Deployment", "predictive-scaler-controller")]
    if ha:
        servers.append(one(objs, "Deployment", "predictive-scaler-keda"))
    assert len(find(objs, "Deployment")) == len(servers)
    for server in servers:
        pod = _pod(server)["spec"]
        container = pod["containers"][0]
        assert {"name": "keda-tls", "secret": {"secretName": "keda-cert"}} in pod["volumes"]
        assert {"name": "keda-tls", "mountPath": TLS_DIR, "readOnly": True} in container["volumeMounts"]
        settings = _settings(objs, container)
        assert settings.keda_only == (server["metadata"]["name"] == "predictive-scaler-keda")
        assert (settings.keda_tls_cert, settings.keda_tls_key) == (f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key")
        assert settings.keda_tls_client_ca == (f"{TLS_DIR}/ca.crt" if client_ca else None)
        if settings.keda_only:
            assert (settings.metrics_port, settings.health_port, settings.keda_port) == (8080, None, 6000)
    # The retraining pod serves nothing: no certificate there.
    retrain = one(objs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert "keda-tls" not in {v["name"] for v in retrain["volumes"]}


def test_tls_reaches_every_shard() -> None:
    objs = helm_render({"sharding": {"replicas": 2}, "keda": {"tls": {"secretName": "keda-cert"},
                                                              "highAvailability": {"enabled": True}}})
    validate_all(objs)
    shards = one(objs, "StatefulSet")
    assert SHARED.items() <= _pod(shards)["metadata"]["labels"].items()
    assert {"name": "keda-tls", "secret": {"secretName": "keda-cert"}} in _pod(shards)["spec"]["volumes"]


def test_replicas_follow_the_value() -> None:
    objs = helm_render({"keda": {"highAvailability": {"enabled": True, "replicas": 3}}})
    assert one(objs, "Deployment", "predictive-scaler-keda")["spec"]["replicas"] == 3


@pytest.mark.parametrize("values, says", [
    ({"keda": {"tls": {"clientCA": True}}}, "keda.tls.clientCA (mTLS) needs the server's certificate too"),
    ({"keda": {"enabled": False, "highAvailability": {"enabled": True}}}, "keda.highAvailability.enabled needs"),
    ({"keda": {"enabled": False, "tls": {"secretName": "keda-cert"}}}, "keda.enabled is false"),
    ({"keda": {"highAvailability": {"enabled": True, "replicas": 1}}}, "replicas"),
    ({"keda": {"tls": {"secretName": "Not_A_Name"}}}, "secretName"),
], ids=["client-ca-without-cert", "ha-without-keda", "tls-without-keda", "one-replica", "bad-secret-name"])
def test_what_cannot_work_is_refused(values: dict[str, Any], says: str) -> None:
    with pytest.raises(Exception, match=says.replace("(", r"\(").replace(")", r"\)")):
        helm_render(values)
