"""Connecting (kube/kubeconfig.py): an ApiClient from a kubeconfig; no credentials is a config error."""

from __future__ import annotations

import json

import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import ConfigError
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.kubeconfig import api_client_from_environment
from tests.kube.shared import DEPLOYMENT, NOW, NS, SCALE_PATH


def test_api_client_from_a_kubeconfig(tmp_path, monkeypatch, fake_api):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake_api.add_deployment(NS, "llm", replicas=2)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [
                    {"name": "fake", "cluster": {"server": fake_api.api_client.configuration.host}}
                ],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
            }
        )
    )
    with api_client_from_environment(str(kubeconfig)) as api:
        clock = FakeClock(NOW)
        cluster = KubeCluster(api, clock=clock, sleep=clock.advance)
        assert cluster.get_scale(DEPLOYMENT).replicas == 2
    (request,) = fake_api.requests
    assert request.path == SCALE_PATH


def test_api_client_without_credentials_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="--kubeconfig") as info:
        api_client_from_environment(str(tmp_path / "missing"))
    assert info.value.field == "kubeconfig"
