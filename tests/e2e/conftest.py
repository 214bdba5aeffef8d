"""Fixtures of the end-to-end suite: a real API server with deploy/ applied, a real Prometheus
holding recent demand, a model store, and the real `predictive-scaler controller` process.

Every test here is marked ``kubeapi`` (and ``prometheus`` when it reads metrics). A missing
binary fails the test with what to run (tests/support/kubeapi.py); nothing skips.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from predictive_scaler import crd
from predictive_scaler.forecasting.baselines import SeasonalNaiveForecaster
from predictive_scaler.forecasting.store import ModelStore, TrainingWindow
from predictive_scaler.kube.manifests import GROUP, PLURAL, VERSION
from predictive_scaler.series import Series
from tests.deploy.support import OVERLAYS, render
from tests.support.kubeapi import KubeApiServer, apply_deploy, running_control_plane
from tests.support.openmetrics import CounterFamily
from tests.support.processes import stop_process
from tests.support.prometheus import LoadedPrometheus, PrometheusServer, free_port
from tests.support.specs import scaler_spec

CONTROLLER_SA = "predictive-scaler-controller"
MODEL = "llm"
#: Demand level (req/s) around which the backfilled series moves, and one replica's capacity.
LEVEL = 40.0
PER_REPLICA = 10.0
#: The demand of every scaler here: the workload's pods are not real, so the series is one backfilled family.
QUERY = 'sum(rate(requests_total{namespace="e2e",job="inference"}[2m]))'
INTERVAL_SECONDS = 5
SCALER_API = f"/apis/{GROUP}/{VERSION}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.kubeapi)


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """The control plane with what of deploy/overlays/default Kubernetes 1.20 serves."""
    with running_control_plane(tmp_path_factory.mktemp("kubeapi")) as server:
        left_out = apply_deploy(server, render(OVERLAYS["default"]))
        assert [o["kind"] for o in left_out] == ["CronJob"]  # batch/v1 CronJob is 1.21+
        yield server


@pytest.fixture(scope="session")
def controller_kubeconfig(kube_api: KubeApiServer) -> Path:
    """A kubeconfig holding a token of the controller's ServiceAccount (its RBAC from deploy/)."""
    return kube_api.service_account_kubeconfig(crd.CONTROLLER_NAMESPACE, CONTROLLER_SA)


#: Yesterday, from BUMP_FROM to BUMP_TO after the time the suite started, demand doubled: a seasonal
#: model expects it again today, so the forecast one node start ahead needs placeholders while the
#: demand now (and one pod start ahead) does not.
BUMP_FROM, BUMP_TO, BUMP = timedelta(minutes=20), timedelta(hours=4), 2.0
HISTORY_DAYS = 4


def demand_series(start: datetime, minutes: int, now: datetime, seed: int = 3) -> Series:
    """Request rate (req/s) at 1-minute steps: LEVEL with noise, and yesterday's bump."""
    rng = np.random.default_rng(seed)
    values = LEVEL * (1 + 0.05 * rng.standard_normal(minutes))
    t = np.array([start + timedelta(minutes=int(i)) for i in range(minutes)])
    yesterday = now - timedelta(days=1)
    values[(t >= yesterday + BUMP_FROM) & (t < yesterday + BUMP_TO)] *= BUMP
    return Series(np.maximum(values, 1.0), pd.Timestamp(start), 60, name=MODEL)


@dataclass(frozen=True)
class RecentDemand(LoadedPrometheus):
    """A real Prometheus whose counters run from four days ago to three hours ahead of the wall clock
    (the controller process reads at the system time), and the series they integrate."""

    series: Series
    started: datetime


@pytest.fixture(scope="session")
def recent_demand(prometheus_factory: Callable[..., PrometheusServer]) -> RecentDemand:
    now = datetime.now(UTC)
    start = datetime.fromtimestamp(math.floor(now.timestamp() / 300) * 300, UTC) - timedelta(days=HISTORY_DAYS)
    series = demand_series(start, (HISTORY_DAYS * 24 + 3) * 60, now)
    pods = ("llm-0", "llm-1", "llm-2")
    counters = [CounterFamily(name="requests_total", series=series, pods=pods,
                              labels={"namespace": "e2e", "job": "inference"}, rate_unit_seconds=1.0,
                              reset_every=None)]
    return RecentDemand(prometheus_factory(counters=counters), series, now)


@pytest.fixture(scope="session")
def model_store(recent_demand: RecentDemand, tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A seasonal-naive model on the 5-minute grid, trained on the history up to yesterday's bump (so its
    calibrated spread is the noise's); the bump reaches it through the recent history."""
    grid = recent_demand.series.resample(300)
    cutoff = grid.index_at(recent_demand.started - timedelta(days=1) + BUMP_FROM)
    history = grid.slice(0, cutoff)
    history = Series(history.values, history.start, 300, name=MODEL)
    store = ModelStore(tmp_path_factory.mktemp("e2e-models"))
    store.publish(MODEL, SeasonalNaiveForecaster().fit(history), series=MODEL, window=TrainingWindow.of(history))
    return store


@dataclass
class ControllerProcess:
    """`predictive-scaler controller` running as the controller's ServiceAccount."""

    popen: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def restart(self) -> int:
        """Stop the process (SIGTERM) and start a new one with the same arguments; the exit code."""
        code = self.stop()
        with open(self.log, "ab") as out:
            out.write(b"---- restarted ----\n")
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        return code

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        stop_process(self.popen, grace=20, sig=sig)
        return int(self.popen.returncode)


#: Tries at starting a controller: its ports are picked free, but another process can take one before
#: the controller binds it (the controller then exits at once: "Address already in use").
START_TRIES = 3
#: How long a start waits for the controller's metrics port, or its exit.
START_WAIT_SECONDS = 20.0


def start_controller(kubeconfig: Path, prometheus_url: str, store: ModelStore, log: Path,
                     interval: int = INTERVAL_SECONDS, namespace: str | None = None) -> ControllerProcess:
    exe = Path(sys.executable).with_name("predictive-scaler")
    assert exe.exists(), f"{exe} is missing: install the package (make install)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREDICTIVE_SCALER_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    for _ in range(START_TRIES):
        port = free_port()
        argv = [str(exe), "controller", f"--kubeconfig={kubeconfig}", f"--prometheus-url={prometheus_url}",
                f"--model-store={store.root}", f"--interval={interval}", f"--metrics-port={port}",
                f"--health-port={free_port()}", *([f"--namespace={namespace}"] if namespace else [])]
        logged = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        proc = ControllerProcess(popen, log, port, argv, env)
        if not _lost_port_race(proc, logged):
            break
    return proc


def _lost_port_race(proc: ControllerProcess, logged: int) -> bool:
    """Wait until ``proc`` serves its metrics port or exits: True when it exited because a port it was
    given was taken (its log past ``logged`` bytes says so); any other exit is the test's to report."""
    deadline = time.monotonic() + START_WAIT_SECONDS
    while time.monotonic() < deadline:
        if not proc.alive():
            return "Address already in use" in proc.log_text().encode()[logged:].decode(errors="replace")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", proc.metrics_port), timeout=0.5):
            return False
        time.sleep(0.1)
    return False


# Per module: a cluster-wide controller left running would also reconcile the scalers of later
# modules, which run their own controllers (tests/e2e/test_scheduler.py).
@pytest.fixture(scope="module")
def controller(kube_api: KubeApiServer, controller_kubeconfig: Path, recent_demand: RecentDemand,
               model_store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    log = tmp_path_factory.mktemp("controller") / "controller.log"
    proc = start_controller(controller_kubeconfig, recent_demand.url, model_store, log)
    time.sleep(0.5)
    yield proc
    proc.stop()


def make_target(api: KubeApiServer, namespace: str, name: str = MODEL, replicas: int = 2) -> None:
    """A namespace and a GPU Deployment in it (its pods stay Pending: there is no kubelet)."""
    api.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                  "template": {"metadata": {"labels": {"app": name}},
                               "spec": {"containers": [{"name": "server", "image": "registry.invalid/llm:1",
                                                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}},
    ])


def scaler_manifest(namespace: str, mode: str = "scale", name: str = MODEL, **spec: Any) -> dict[str, Any]:
    body = scaler_spec(model=MODEL, query=QUERY, requests_per_replica=PER_REPLICA, max_replicas=12,
                       node_start_seconds=1800, gpus_per_node=1, max_gpus=6, target={"name": MODEL}, mode=mode)
    body.update(spec)  # whole top-level fields, `model` included (scaler_spec's own `model` is a name)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PredictiveScaler",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


def get_scaler(api: KubeApiServer, namespace: str, name: str = MODEL) -> dict[str, Any] | None:
    return api.get(f"{SCALER_API}/namespaces/{namespace}/{PLURAL}/{name}")


def get_deployment(api: KubeApiServer, namespace: str, name: str) -> dict[str, Any] | None:
    return api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")


def events(api: KubeApiServer, namespace: str) -> list[dict[str, Any]]:
    answer = api.get(f"/api/v1/namespaces/{namespace}/events")
    assert answer is not None
    return list(answer["items"])


def wait_for_events(api: KubeApiServer, namespace: str, reason: str) -> list[dict[str, Any]]:
    """The namespace's Events of ``reason``, once there is one: the controller posts a period's Events
    after its status write, so one can be read before the other is there."""
    return list(api.wait_for(f"an Event {reason} in {namespace}",
                             lambda: [e for e in events(api, namespace) if e["reason"] == reason]))


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None
