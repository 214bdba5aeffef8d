"""Service tracking (``spec.service``) in real time, on the real control plane.

The session's control plane (kube-apiserver, controller-manager and kube-scheduler 1.20.2, deploy/
applied) and a real Prometheus holding 15 days of the example's request counter: 12 req/s, and for
the last half hour and the next 40 minutes bursts to 24 req/s for 3 minutes in every 6 — bursts
the model (a seasonal naive one trained before they began) does not forecast. The example runs in
``mode: scale`` with service tracking enabled (``gainPerHour`` raised so a few bursts show it; the
drift monitor widened so the plan stays predictive) in two namespaces, each with its own controller:

- ``e2e-service``: a stand-in kubelet marks every bound pod of the Deployment Running and Ready, so
  ready replicas are capacity: the bursts go unserved, the controller widens its plan — the
  status shows the headroom and ``plannerState.headroomLog`` > 0 — within the prewarm budget;
- ``e2e-service-unready``: no pod ever becomes ready (as here without a kubelet): a shortfall no
  replica could serve is no evidence, and the headroom stays at 1.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.forecasting.baselines import SeasonalNaiveForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.kube import manifests
from predictive_scaler.series import Series
from tests.deploy.support import OVERLAYS, render
from tests.e2e.conftest import ControllerProcess, start_controller
from tests.support.kubeapi import GPU, KubeApiServer
from tests.support.openmetrics import CounterFamily
from tests.support.prometheus import PrometheusServer
from tests.support.ticker import Ticker

NAME = "llm-server"
SELECTOR = "app.kubernetes.io/name=llm-server"
POOL_LABEL = "e2e.predictive-scaler.io/pool"
READY_NS, UNREADY_NS = "e2e-service", "e2e-service-unready"
LEVEL, BURST = 12.0, 24.0  # req/s; 24 < the 32 that maxReplicas (8 × 4 req/s) serve: not saturated
BURSTS_SINCE = timedelta(minutes=30)
BURST_MINUTES, EVERY_MINUTES = 3, 6
HISTORY_DAYS = 15
INTERVAL = 15
MODEL_STEP = 300
BUDGET_GPUS = 8  # the example's prewarm.budget.maxGpus


def demand_history(now: datetime, seed: int = 5) -> Series:
    """Req/s a minute for 15 days up to 40 minutes from now: LEVEL with 2 % noise, and BURST for
    3 minutes in every 6 from half an hour ago."""
    start = now.replace(second=0, microsecond=0) - timedelta(days=HISTORY_DAYS)
    minutes = HISTORY_DAYS * 24 * 60 + 40
    values = LEVEL * (1 + 0.02 * np.random.default_rng(seed).standard_normal(minutes))
    first = minutes - 40 - int(BURSTS_SINCE.total_seconds() // 60)
    for i in range(first, minutes, EVERY_MINUTES):
        values[i:i + BURST_MINUTES] *= BURST / LEVEL
    return Series(values, pd.Timestamp(start), 60, name=NAME)


def objects(namespace: str) -> list[dict[str, Any]]:
    """deploy/examples/vllm-forecast-only in ``mode: scale`` with service tracking, in ``namespace``
    and its own node pool."""
    out = []
    for obj in render(OVERLAYS["example-vllm-forecast-only"]):
        obj = dict(obj)
        kind = obj["kind"]
        obj["metadata"] = {**obj["metadata"], ("name" if kind == "Namespace" else "namespace"): namespace}
        if kind == "Deployment":
            pod = obj["spec"]["template"]["spec"]
            pod["terminationGracePeriodSeconds"] = 0
            pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), POOL_LABEL: namespace}
        if kind == "PredictiveScaler":
            spec = obj["spec"]
            spec["mode"] = "scale"
            spec["service"] = {"enabled": True, "gainPerHour": 60}
            spec["drift"] = {"farAboveMargin": 10, "maxAboveFraction": 1.0}
            spec["prewarm"]["nodeSelector"] = {**spec["prewarm"].get("nodeSelector", {}), POOL_LABEL: namespace}
        out.append(obj)
    return out


@dataclass
class StandInKubelet:
    """Marks every bound pod of the Deployment in ``namespace`` Running and Ready, about a second later."""

    api: KubeApiServer
    namespace: str
    errors: list[str] = field(default_factory=list)
    _ticker: Ticker | None = None

    def start(self) -> None:
        self._ticker = Ticker("stand-in-kubelet", self._tick)
        self._ticker.start()

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()

    def _tick(self) -> None:
        try:
            for pod in self.api.pods(self.namespace, SELECTOR):
                status = pod.get("status") or {}
                ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in status.get("conditions") or ())
                if pod["spec"].get("nodeName") and not ready and not pod["metadata"].get("deletionTimestamp"):
                    name = pod["metadata"]["name"]
                    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    body = {"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}}
                    answer = self.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
                                              body=body, content_type="application/merge-patch+json")
                    if answer.status_code not in (200, 404, 409):
                        self.errors.append(f"{name}: {answer.status_code} {answer.text[:200]}")
        except Exception as exc:  # noqa: BLE001 - recorded, and the tests report it
            self.errors.append(repr(exc))


@dataclass
class World:
    api: KubeApiServer
    controllers: dict[str, ControllerProcess]
    kubelet: StandInKubelet
    prometheus: PrometheusServer

    def scaler(self, namespace: str) -> dict[str, Any]:
        got = self.api.get(f"/apis/{manifests.GROUP}/{manifests.VERSION}/namespaces/{namespace}/"
                           f"{manifests.PLURAL}/{NAME}")
        assert got is not None
        return got

    def logs(self, namespace: str, chars: int = 3000) -> str:
        return self.controllers[namespace].log_text()[-chars:]


@pytest.fixture(scope="module")
def world(kube_api: KubeApiServer, controller_kubeconfig: Path, prometheus_factory: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    now = datetime.now(UTC)
    series = demand_history(now)
    counter = CounterFamily(name="vllm:request_success_total", series=series,
                            pods=("llm-server-0", "llm-server-1", "llm-server-2"),
                            labels={"namespace": "inference"}, rate_unit_seconds=1.0, reset_every=None)
    prometheus = prometheus_factory(counters=[counter], sample_step=30)
    # The model learns only the days before the bursts began.
    grid = series.resample(MODEL_STEP)
    history = grid.slice(0, grid.index_at(now - BURSTS_SINCE) - 1)
    history = Series(history.values, history.start, MODEL_STEP, name=NAME)
    store = ModelStore(tmp_path_factory.mktemp("service-models"))
    store.publish(NAME, SeasonalNaiveForecaster().fit(history), series=NAME, window=TrainingWindow.of(history))

    taint = {"key": GPU, "value": "present", "effect": "NoSchedule"}
    for ns in (READY_NS, UNREADY_NS):
        for i in range(2):
            kube_api.add_gpu_node(f"{ns}-gpu-{i}", 8, taints=[taint],
                                  labels={"nvidia.com/gpu.present": "true", POOL_LABEL: ns})
        kube_api.apply(objects(ns))
    kubelet = StandInKubelet(kube_api, READY_NS)
    logs = tmp_path_factory.mktemp("service-controllers")
    controllers: dict[str, ControllerProcess] = {}
    try:
        kubelet.start()
        for ns in (READY_NS, UNREADY_NS):
            controllers[ns] = start_controller(controller_kubeconfig, prometheus.url, store, logs / f"{ns}.log",
                                               interval=INTERVAL, namespace=ns)
        yield World(kube_api, controllers, kubelet, prometheus)
    finally:
        kubelet.stop()
        for proc in controllers.values():
            with contextlib.suppress(Exception):
                proc.stop()


def _headroom(scaler: dict[str, Any]) -> float:
    return float(((scaler.get("status") or {}).get("plannerState") or {}).get("headroomLog") or 0.0)


def test_unserved_bursts_widen_the_plan_within_the_budget(world: World) -> None:
    api = world.api
    deadline = time.time() + 8 * 60
    seen: list[tuple[float, int | None, str]] = []

    def widened() -> dict[str, Any] | None:
        for proc in world.controllers.values():
            assert proc.alive(), f"a controller exited:\n{proc.log_text()[-3000:]}"
        scaler = world.scaler(READY_NS)
        status = scaler.get("status") or {}
        reasons = " ".join(status.get("reasons") or ())
        seen.append((time.time(), status.get("desiredReplicas"), reasons[:300]))
        return scaler if _headroom(scaler) > 0 and "service headroom" in reasons else None

    scaler = api.wait_for("the plan widened for unserved bursts", widened, timeout=max(1.0, deadline - time.time()),
                          interval=2.0)
    assert not world.kubelet.errors, world.kubelet.errors[:5]
    status = scaler["status"]
    multiplier = math.exp(_headroom(scaler))
    assert 1 < multiplier <= 4, status["plannerState"]
    deployment = api.get(f"/apis/apps/v1/namespaces/{READY_NS}/deployments/{NAME}")
    assert deployment is not None
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    assert ready >= 1, f"the stand-in kubelet made no pod ready: {deployment.get('status')}\n{world.logs(READY_NS)}"
    assert int(status["budgetInUse"]["gpus"]) <= BUDGET_GPUS, status["budgetInUse"]
    print(f"widened to × {multiplier:.3g} after {len(seen)} polls; last: {seen[-1]}")


def test_no_ready_replica_is_no_evidence_for_headroom(world: World) -> None:
    # By now the other namespace's plan has widened (the test above), so the bursts have come.
    scaler = world.scaler(UNREADY_NS)
    state = (scaler.get("status") or {}).get("plannerState") or {}
    assert state.get("lastDecidedAt") is not None, world.logs(UNREADY_NS)
    assert _headroom(scaler) == 0.0, (state, world.logs(UNREADY_NS))
    assert state.get("unreadySince") is not None, state
    assert "service headroom" not in " ".join((scaler.get("status") or {}).get("reasons") or ())
