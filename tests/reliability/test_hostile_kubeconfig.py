"""Hostile kubeconfigs and credentials: `controller` and `retrain --in-cluster` refuse them with what
is wrong, in which file, and what to do — before the API client, the telemetry server or kopf start
(nothing hangs, nothing is contacted, the model store is untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.reliability.hostile import BOMB, Case, check, ids

CONTROLLER = "controller --kubeconfig {d}/kc --prometheus-url http://127.0.0.1:9 --model-store {store}"
RETRAIN = "retrain --in-cluster --kubeconfig {d}/kc --store {store} --prometheus http://127.0.0.1:9"
NO_ENV = {"KUBECONFIG": ""}  # a run must not leave $KUBECONFIG set for the tests after it


def kubeconfig(*, server: str | None = "https://127.0.0.1:6443", user: dict[str, object] | None = None,
               cluster: dict[str, object] | None = None, context: str = "a") -> str:
    c: dict[str, object] = {} if server is None else {"server": server}
    c.update(cluster or {})
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": c}],
        "users": [{"name": "u", "user": user if user is not None else {"token": "abc"}}],
    })


def kc(id: str, body: str | bytes, *says: str, argv: str = CONTROLLER) -> Case:
    return Case(id, argv, 2, says, {"kc": body}, env=NO_ENV)


CASES: list[Case] = [
    kc("not-utf8", b"\x00\x01\xff\xfe binary", "kubeconfig", "not text (not UTF-8", "kubectl config view --raw"),
    kc("not-yaml", "apiVersion: v1\nclusters: [\n", "not valid YAML at line 3", "export it again"),
    kc("not-yaml-retrain", "apiVersion: v1\nclusters: [\n", "not valid YAML", argv=RETRAIN),
    kc("alias-bomb", BOMB, "kubeconfig", "YAML aliases expand to", "without anchors"),
    kc("a-list", "- a\n- b\n", "a kubeconfig is a YAML mapping", "this is a list"),
    kc("a-string", "hello\n", "a kubeconfig is a YAML mapping", "this is a str"),
    kc("empty", "", "cannot load Kubernetes credentials", "empty", "pass another --kubeconfig"),
    kc("clusters-not-a-list", "apiVersion: v1\nclusters: 5\n", "clusters must be a list of named entries"),
    kc("no-current-context", "apiVersion: v1\nkind: Config\n", "Expected key current-context", "fix that file"),
    kc("unknown-context", kubeconfig(context="nope"), "Expected object with name nope", "fix that file"),
    kc("no-server", kubeconfig(server=None), "has no server address", "clusters[].cluster.server"),
    kc("ca-file-missing", kubeconfig(cluster={"certificate-authority": "/nonexistent/ca.crt"}),
       "File does not exist: /nonexistent/ca.crt"),
    kc("ca-data-not-base64", kubeconfig(cluster={"certificate-authority-data": "!!!notbase64"}),
       "cannot load Kubernetes credentials", "base64"),
    kc("token-file-missing", kubeconfig(user={"tokenFile": "/nonexistent/token"}), "/nonexistent/token"),
    kc("exec-plugin-missing", kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                                        "command": "/nonexistent/aws-iam-authenticator"}}),
       "exec plugin '/nonexistent/aws-iam-authenticator'", "not installed here", "install it"),
    kc("exec-plugin-missing-retrain", kubeconfig(user={"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                                "command": "no-such-login-tool"}}),
       "exec plugin 'no-such-login-tool'", argv=RETRAIN),
    Case("kubeconfig-missing", CONTROLLER.replace("{d}/kc", "{d}/nope"), 2,
         ("--kubeconfig", "nope: no such file", "kubectl config view --raw"), env=NO_ENV),
    Case("kubeconfig-is-a-directory", CONTROLLER.replace("{d}/kc", "{d}"), 2,
         ("is a directory", "~/.kube/config"), env=NO_ENV),
    Case("kubeconfig-env-not-yaml", "controller --prometheus-url http://127.0.0.1:9 --model-store {store}", 2,
         ("kubeconfig", "not valid YAML"), {"kc": "a: [\n"}, env={"KUBECONFIG": "{d}/kc"}),
    Case("prometheus-url-missing", "controller --kubeconfig {d}/kc --model-store {store}", 2,
         ("no Prometheus URL", "--prometheus-url"), {"kc": kubeconfig()},
         env={"KUBECONFIG": "", "PREDICTIVE_SCALER_PROMETHEUS_URL": ""}),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hostile_kubeconfig(case: Case, work: Path) -> None:
    check(case, work)
