"""Fixtures for the controller: the stateful fake API server, a fake clock, a model store
holding a real (persistence) model, and a ControllerService wired to them."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ClusterBudgetLimits, ControllerSettings
from predictive_scaler.forecasting.baselines import PersistenceForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.kube.api_calls import api_call_for
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.series import Series
from predictive_scaler.sources.prometheus import PrometheusSource
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.fixtures import START
from tests.support.fakes.ports import FakeMetrics

NS = "ml"
TARGET = "llm"
LABELS = {"app": TARGET}


def scaler_spec(mode: str = "scale", **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": mode,
        "target": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET},
        "demand": {"kind": "requests", "query": 'sum(rate(requests_total{namespace="ml"}[2m]))'},
        "capacity": {"requestsPerReplica": 10},
        "minReplicas": 1,
        "maxReplicas": 8,
        "prewarm": {"enabled": True, "gpusPerNode": 8,
                    "budget": {"maxGpus": 8, "pricePerGpuHour": 2.5, "currency": "USD"}},
        "model": {"name": TARGET},
    }
    spec.update(overrides)
    return spec


def synthetic_history(days: int = 3, level: float = 40.0) -> Series:
    n = days * 288
    t = np.arange(n)
    values = level * (1 + 0.2 * np.sin(2 * np.pi * t / 288))
    return Series(values, pd.Timestamp(START - timedelta(days=days)), 300, name=TARGET)


def publish_model(store: ModelStore, name: str = TARGET, level: float = 40.0) -> str:
    history = synthetic_history(level=level)
    model = PersistenceForecaster().fit(history)
    return store.publish(name, model, series=name, window=TrainingWindow.of(history))


@pytest.fixture
def kube(fake_api: FakeApiServer, clock: FakeClock) -> Iterator[KubeCluster]:
    """The adapter on the fake API; every request it made must be a documented API call."""
    yield KubeCluster(fake_api.api_client, retry=RetryPolicy(), clock=clock, sleep=clock.advance,
                      rng=random.Random(7), request_timeout=5.0)
    undocumented = [(r.method, r.path) for r in fake_api.requests if api_call_for(r.method, r.path) is None]
    assert not undocumented, f"requests missing from API_CALLS: {undocumented}"


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    s = ModelStore(tmp_path / "models")
    publish_model(s)
    return s


@pytest.fixture
def demand() -> dict[str, float]:
    """Mutable demand the FakeMetrics reads: ``now`` (req/s now) and ``before`` (history)."""
    return {"now": 42.0, "before": 42.0}


MakeService = Callable[..., ControllerService]


@pytest.fixture
def make_service(kube: KubeCluster, store: ModelStore, clock: FakeClock,
                 demand: dict[str, float]) -> MakeService:
    def make(*, budget: ClusterBudgetLimits | None = None, metrics: Any = None) -> ControllerService:
        settings = ControllerSettings(prometheus_url="http://127.0.0.1:9", model_store=store.root,
                                      cluster_budget=budget or ClusterBudgetLimits())
        cutoff = lambda: clock.now() - timedelta(minutes=1)  # noqa: E731
        fake = metrics or FakeMetrics(lambda t: demand["now"] if t >= cutoff() else demand["before"])
        return ControllerService(settings, kube, PrometheusSource("http://127.0.0.1:9", retries=0), store, clock,
                                 metrics_factory=lambda spec, ref: fake)
    return make


def install(fake_api: FakeApiServer, *, replicas: int = 4, ready: int | None = None, spec: dict[str, Any] | None = None,
            name: str = TARGET, target: str = TARGET, gpu_nodes: int = 1) -> dict[str, Any]:
    """The target Deployment with its pods on GPU nodes, and its PredictiveScaler."""
    labels = {"app": target}
    fake_api.add_deployment(NS, target, replicas=replicas, labels=labels)
    for i in range(gpu_nodes):
        fake_api.add_gpu_node(f"gpu-{target}-{i}", 8)
    for i in range(replicas):
        fake_api.add_pod(NS, f"{target}-abc-{i}", labels, ready=ready is None or i < ready,
                         node=f"gpu-{target}-0", gpus=1)
    return fake_api.add_scaler(NS, name, spec or scaler_spec())


def scaler(fake_api: FakeApiServer, name: str = TARGET) -> dict[str, Any]:
    obj = fake_api.get("autoscaling.predictive-scaler.io/v1alpha1", "PredictiveScaler", NS, name)
    assert obj is not None
    return obj


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)
