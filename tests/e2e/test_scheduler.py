"""Placement, preemption and the onset of a predicted step, in real time, against a real kube-scheduler.

The control plane is the session's (kube-apiserver, controller-manager and kube-scheduler 1.20.2,
deploy/ applied); the workload is deploy/examples/vllm-forecast-only switched to ``mode: scale``;
the GPU nodes are fake Node objects made Ready (tests/support/kubeapi.py), in one pool per scenario
(a label the scenario's pods select, and the ``nvidia.com/gpu`` taint the example tolerates, so no
other test's pods land on them). A real Prometheus holds 15 days of the example's request counter,
scraped every 30 s: 12 req/s, stepping to 28 req/s at the same time every day — and today that time
is a few minutes after this module starts, on the model's 5-minute grid. The model is a seasonal
naive one trained on those days, so the forecast knows the step is coming.

Each scenario runs its own ``predictive-scaler controller`` process, restricted to its namespace, at
its own reconcile interval, all at once: the step happens once for all of them, and a recorder
samples what the API server holds every second. The tests then read the recording:

- placeholders are bound by the scheduler ahead of the rise;
- a priority-0 pod that needs their GPUs preempts them;
- at the step the Deployment is scaled up ahead and keeps its replicas through the onset (until one
  full ``rate()`` window after it has been observed), at reconcile intervals of 15 s and 60 s;
- no placeholder is created, removed and created again within 10 minutes (a cycle).
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

NAME = "llm-server"  # the example's Deployment and PredictiveScaler (and so the model's name)
PLACEHOLDER = manifests.placeholder_name(NAME)
PLACEHOLDER_PODS = f"{manifests.ROLE_LABEL}=placeholder"
POOL_LABEL = "e2e.predictive-scaler.io/pool"
GPUS_PER_NODE = 8
NODES_PER_POOL = 2

LOW, HIGH = 12.0, 28.0  # req/s before and after the daily step
PEAK = timedelta(hours=3)
HISTORY_DAYS = 15
SCRAPE_SECONDS = 30
RATE_WINDOW_SECONDS = 120  # the example query's rate(…[2m])
#: From the module's start to the earliest step: Prometheus backfilled and started, the model
#: trained, three controllers started and reconciling, placeholders placed — under a loaded CI host.
LEAD = timedelta(minutes=4)
MODEL_STEP = 300
CYCLE_SECONDS = 600


@dataclass(frozen=True)
class Scenario:
    key: str
    namespace: str
    interval: int


#: The example as shipped lives in `inference`; the others are copies in their own namespaces.
SCENARIOS = (Scenario("preempt", "e2e-preempt", 15), Scenario("step-15", "e2e-step-15", 15),
             Scenario("step-60", "inference", 60))


def scenario(key: str) -> Scenario:
    return next(s for s in SCENARIOS if s.key == key)


# -- what the API server held, second by second ----------------------------------------------------

@dataclass(frozen=True)
class Sample:
    t: float  # epoch seconds
    replicas: int | None  # the Deployment's spec.replicas
    placeholders: int  # the placeholder Deployment's spec.replicas; 0 when there is none
    placeholder_uid: str | None
    bound: tuple[tuple[str, str], ...]  # placeholder pods (name, node) the scheduler bound
    status: tuple[Any, ...]  # (strategy, desiredReplicas)
    reasons: tuple[str, ...]  # the status's sentences: why


@dataclass
class Recorder:
    api: KubeApiServer
    namespaces: tuple[str, ...]
    period: float = 1.0
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _ticker: Ticker | None = None

    def start(self) -> None:
        self.samples = {ns: [] for ns in self.namespaces}
        self._ticker = Ticker("e2e-recorder", self._tick, self.period)
        self._ticker.start()

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()

    def _tick(self) -> None:
        for ns in self.namespaces:
            try:
                self.samples[ns].append(self._sample(ns))
            except Exception as exc:  # noqa: BLE001 - recorded, and a test reports it
                self.errors.append(f"{ns}: {exc!r}")

    def _sample(self, ns: str) -> Sample:
        t = time.time()
        deployment = self.api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}")
        placeholder = self.api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{PLACEHOLDER}")
        pods = self.api.pods(ns, PLACEHOLDER_PODS)
        scaler = self.api.get(f"/apis/{manifests.GROUP}/{manifests.VERSION}/namespaces/{ns}/{manifests.PLURAL}/{NAME}")
        status = (scaler or {}).get("status") or {}
        return Sample(
            t=t,
            replicas=None if deployment is None else int(deployment["spec"].get("replicas", 1)),
            placeholders=0 if placeholder is None else int(placeholder["spec"].get("replicas", 1)),
            placeholder_uid=None if placeholder is None else placeholder["metadata"]["uid"],
            bound=tuple(sorted((p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods
                               if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))),
            status=(status.get("strategy"), status.get("desiredReplicas")),
            reasons=tuple(status.get("reasons") or ()),
        )

    def timeline(self, ns: str, origin: float, attribute: str = "replicas") -> list[str]:
        """The changes of one attribute or of the strategy, as "+12s: replicas=4 ('predictive', 4): why" lines."""
        lines, last = [], None
        for s in self.samples[ns]:
            key = (getattr(s, attribute), s.status)
            if key != last:
                lines.append(f"{s.t - origin:+.0f}s: {attribute}={key[0]} {s.status}: {' '.join(s.reasons)}")
                last = key
        return lines


# -- the world: Prometheus, model, nodes, the example in three namespaces, three controllers --------

@dataclass
class World:
    api: KubeApiServer
    started: float
    step_at: float  # epoch seconds of today's step
    recorder: Recorder
    controllers: dict[str, ControllerProcess]
    prometheus: PrometheusServer

    def logs(self, key: str, chars: int = 3000) -> str:
        return self.controllers[key].log_text()[-chars:]

    def wait_until(self, t: float, why: str) -> None:
        """Sleep until epoch ``t``, failing early if a controller or the control plane died."""
        while time.time() < t:
            for key, proc in self.controllers.items():
                assert proc.alive(), f"the {key} controller exited while waiting for {why}:\n{self.logs(key)}"
            self.api.check_alive()
            time.sleep(min(5.0, max(0.0, t - time.time())))


def step_time(now: datetime) -> datetime:
    """Today's step: the first model-grid boundary at least LEAD from now."""
    return datetime.fromtimestamp(math.ceil((now + LEAD).timestamp() / MODEL_STEP) * MODEL_STEP, UTC)


def step_history(step_at: datetime, seed: int = 11) -> Series:
    """Req/s at 1-minute steps for 15 days before the step and an hour after: LOW, and HIGH for PEAK
    from the step's time of day every day, with 2% noise."""
    start = step_at - timedelta(days=HISTORY_DAYS)
    minutes = HISTORY_DAYS * 24 * 60 + 60
    into_day = (np.arange(minutes) * 60) % 86400  # seconds since that day's step
    level = np.where(into_day < PEAK.total_seconds(), HIGH, LOW)
    noise = 1 + 0.02 * np.random.default_rng(seed).standard_normal(minutes)
    return Series(level * noise, pd.Timestamp(start), 60, name=NAME)


def example_objects(sc: Scenario) -> list[dict[str, Any]]:
    """deploy/examples/vllm-forecast-only in ``mode: scale``, moved to the scenario's namespace and pool.

    Also: the Deployment's grace period is 0 — a bound pod deleted with one stays Terminating here,
    holding its GPU, as no kubelet confirms the deletion (the placeholders already have 0).
    """
    out = []
    for obj in render(OVERLAYS["example-vllm-forecast-only"]):
        obj = dict(obj)
        kind = obj["kind"]
        if kind == "Namespace":
            obj["metadata"] = {**obj["metadata"], "name": sc.namespace}
        else:
            obj["metadata"] = {**obj["metadata"], "namespace": sc.namespace}
        if kind == "Deployment":
            pod = obj["spec"]["template"]["spec"]
            pod["terminationGracePeriodSeconds"] = 0
            pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), POOL_LABEL: sc.namespace}
        if kind == "PredictiveScaler":
            assert obj["spec"]["mode"] == "forecast-only"
            obj["spec"]["mode"] = "scale"
            prewarm = obj["spec"]["prewarm"]
            prewarm["nodeSelector"] = {**prewarm.get("nodeSelector", {}), POOL_LABEL: sc.namespace}
        out.append(obj)
    return out


@pytest.fixture(scope="module")
def world(kube_api: KubeApiServer, controller_kubeconfig: Path, prometheus_factory: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    started = datetime.now(UTC)
    step_at = step_time(started)
    series = step_history(step_at)
    counter = CounterFamily(name="vllm:request_success_total", series=series,
                            pods=("llm-server-0", "llm-server-1", "llm-server-2"),
                            labels={"namespace": "inference"}, rate_unit_seconds=1.0, reset_every=None)
    prometheus = prometheus_factory(counters=[counter], sample_step=SCRAPE_SECONDS)

    # The model learns the past only (up to the last whole model step before now).
    grid = series.resample(MODEL_STEP)
    history = grid.slice(0, grid.index_at(started) - 1)
    history = Series(history.values, history.start, MODEL_STEP, name=NAME)
    store = ModelStore(tmp_path_factory.mktemp("scheduler-models"))
    store.publish(NAME, SeasonalNaiveForecaster().fit(history), series=NAME, window=TrainingWindow.of(history))

    taint = {"key": GPU, "value": "present", "effect": "NoSchedule"}
    for sc in SCENARIOS:
        for i in range(NODES_PER_POOL):
            kube_api.add_gpu_node(f"{sc.namespace}-gpu-{i}", GPUS_PER_NODE, taints=[taint],
                                  labels={"nvidia.com/gpu.present": "true", POOL_LABEL: sc.namespace})
        kube_api.apply(example_objects(sc))

    logs = tmp_path_factory.mktemp("scheduler-controllers")
    controllers: dict[str, ControllerProcess] = {}
    recorder = Recorder(kube_api, tuple(sc.namespace for sc in SCENARIOS))
    try:
        for sc in SCENARIOS:
            controllers[sc.key] = start_controller(controller_kubeconfig, prometheus.url, store,
                                                   logs / f"{sc.key}.log", interval=sc.interval,
                                                   namespace=sc.namespace)
        recorder.start()
        yield World(kube_api, started.timestamp(), step_at.timestamp(), recorder, controllers, prometheus)
    finally:
        recorder.stop()
        for proc in controllers.values():
            with contextlib.suppress(Exception):
                proc.stop()


# -- the tests ---------------------------------------------------------------------------------------

def test_the_control_plane_reports_its_real_version(kube_api: KubeApiServer) -> None:
    version = kube_api.get("/version")
    assert version is not None
    assert (version["gitVersion"], version["major"], version["minor"]) == ("v1.20.2", "1", "20"), version
    scheduler = kube_api.audit("system:kube-scheduler")
    assert scheduler and all(e["userAgent"].startswith("kube-scheduler/v1.20.2 ") for e in scheduler[:5]), \
        scheduler[:1]


def placeholders_bound(api: KubeApiServer, ns: str) -> list[dict[str, Any]] | None:
    """The placeholder pods once there are some and the scheduler has bound every one."""
    pods = [p for p in api.pods(ns, PLACEHOLDER_PODS) if not p["metadata"].get("deletionTimestamp")]
    placeholder = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{PLACEHOLDER}")
    wanted = 0 if placeholder is None else int(placeholder["spec"]["replicas"])
    if wanted and len(pods) == wanted and all(p["spec"].get("nodeName") for p in pods):
        return pods
    return None


def test_placeholders_are_bound_by_the_scheduler_ahead_of_a_forecast_rise(world: World) -> None:
    sc, api = scenario("preempt"), world.api
    deadline = world.step_at - 150  # before the step, and before the replicas' own scale-up for it
    pods = api.wait_for("placeholder pods, all bound", lambda: placeholders_bound(api, sc.namespace),
                        timeout=max(1.0, deadline - time.time()), interval=1.0)
    bound_at = time.time()
    assert bound_at < world.step_at, "bound only after the rise began"
    priority = api.get("/apis/scheduling.k8s.io/v1/priorityclasses/" + manifests.PLACEHOLDER_PRIORITY_CLASS)
    assert priority is not None and int(priority["value"]) < 0
    for pod in pods:
        spec = pod["spec"]
        assert spec["priority"] == int(priority["value"]) and spec["preemptionPolicy"] == "Never", spec
        assert spec["nodeName"].startswith(f"{sc.namespace}-gpu-")
        (container,) = spec["containers"]
        assert int(container["resources"]["requests"][GPU]) == 1
    binds = [e for e in api.audit("system:kube-scheduler") if e["verb"] == "create"
             and e["objectRef"].get("subresource") == "binding" and e["objectRef"].get("namespace") == sc.namespace]
    assert {e["objectRef"]["name"] for e in binds} >= {p["metadata"]["name"] for p in pods}
    print(f"placeholders {[p['spec']['nodeName'] for p in pods]} bound {world.step_at - bound_at:.0f}s "
          "before the step")


def test_a_priority_0_pod_that_needs_their_gpus_preempts_the_placeholders(world: World) -> None:
    sc, api = scenario("preempt"), world.api
    pods = api.wait_for("placeholder pods, all bound", lambda: placeholders_bound(api, sc.namespace), timeout=60)
    by_node: dict[str, list[str]] = {}
    for p in pods:
        by_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
    node, victims = max(by_node.items(), key=lambda kv: len(kv[1]))
    # Every GPU of the node but those of pods the new one cannot preempt (the replicas, priority 0):
    # it fits only if the placeholders on that node go.
    held = sum(int(c["resources"].get("requests", {}).get(GPU, 0)) for p in api.pods(sc.namespace)
               if p["spec"].get("nodeName") == node and manifests.ROLE_LABEL not in p["metadata"].get("labels", {})
               for c in p["spec"]["containers"])
    need = GPUS_PER_NODE - held
    urgent = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "urgent", "namespace": sc.namespace},
              "spec": {"terminationGracePeriodSeconds": 0,
                       "nodeSelector": {"kubernetes.io/hostname": node},
                       "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                       "containers": [{"name": "main", "image": "registry.invalid/urgent:1",
                                       "resources": {"limits": {GPU: need}, "requests": {GPU: need}}}]}}
    answer = api.request("POST", f"/api/v1/namespaces/{sc.namespace}/pods", body=urgent)
    assert answer.status_code == 201, answer.text
    try:
        created = answer.json()
        assert created["spec"]["priority"] == 0
        bound = api.wait_for(f"the urgent pod bound to {node}", lambda: (
            (p := api.get(f"/api/v1/namespaces/{sc.namespace}/pods/urgent")) and p["spec"].get("nodeName") and p),
            timeout=60, interval=0.5)
        assert bound["spec"]["nodeName"] == node
        for name in victims:
            assert api.get(f"/api/v1/namespaces/{sc.namespace}/pods/{name}") is None, f"{name} survived"
        deletes = {e["objectRef"]["name"] for e in api.audit("system:kube-scheduler") if e["verb"] == "delete"
                   and e["objectRef"].get("namespace") == sc.namespace}
        assert set(victims) <= deletes, (victims, deletes)
        events = api.get(f"/api/v1/namespaces/{sc.namespace}/events")
        preempted = {e["involvedObject"]["name"]: e["message"] for e in (events or {}).get("items", [])
                     if e["reason"] == "Preempted"}
        for name in victims:
            assert preempted.get(name, "").startswith(f"Preempted by {sc.namespace}/urgent on node {node}"), preempted
    finally:
        api.request("DELETE", f"/api/v1/namespaces/{sc.namespace}/pods/urgent")


@pytest.mark.parametrize("key", ["step-15", "step-60"])
def test_at_a_predicted_step_the_deployment_scales_ahead_and_keeps_its_replicas_through_the_onset(
        world: World, key: str) -> None:
    sc = scenario(key)
    # Through the onset: until one full rate() window after the step has been observed, with a
    # scrape and two reconciles of slack for it to reach the controller.
    end = world.step_at + RATE_WINDOW_SECONDS + 2 * max(sc.interval, SCRAPE_SECONDS)
    world.wait_until(end + 2, f"the onset of the step ({sc.namespace})")
    samples = [s for s in world.recorder.samples[sc.namespace] if s.replicas is not None]
    timeline = "\n".join(world.recorder.timeline(sc.namespace, world.step_at))
    context = f"(times relative to the step)\n{timeline}\ncontroller log:\n{world.logs(key)}"
    assert not world.recorder.errors, world.recorder.errors[:5]
    before = [s for s in samples if s.t <= world.step_at]
    during = [s for s in samples if world.step_at <= s.t <= end]
    assert before and during, "the recorder missed the step"
    high = math.ceil(HIGH / 4)  # the example's requestsPerReplica
    at_step = before[-1].replicas
    assert at_step is not None and at_step >= high, \
        f"not scaled up ahead of the step: {at_step} replicas at its start, {high} needed {context}"
    lowest = min(during, key=lambda s: s.replicas or 0)
    assert lowest.replicas is not None and lowest.replicas >= at_step, (
        f"scaled {at_step} -> {lowest.replicas} {lowest.t - world.step_at:+.0f}s after the step began, "
        f"before a full rate() window of it was observed {context}")


def cycles(samples: list[Sample]) -> list[tuple[float, float, float]]:
    """(rise, fall, rise again) times within CYCLE_SECONDS of the placeholder count (0 without one)."""
    changes: list[tuple[float, int]] = []
    last: tuple[int, str | None] | None = None
    for s in samples:
        now = (s.placeholders, s.placeholder_uid)
        if last is not None:
            if s.placeholders > last[0] or (s.placeholder_uid and last[1] and s.placeholder_uid != last[1]):
                changes.append((s.t, +1))
            elif s.placeholders < last[0]:
                changes.append((s.t, -1))
        last = now
    found = []
    for i, (t1, d1) in enumerate(changes):
        if d1 < 0:
            continue
        fall = next(((t2, j) for j, (t2, d2) in enumerate(changes[i + 1:], i + 1) if d2 < 0), None)
        if fall is None:
            continue
        t2, j = fall
        again = next((t3 for t3, d3 in changes[j + 1:] if d3 > 0), None)
        if again is not None and again - t1 <= CYCLE_SECONDS:
            found.append((t1, t2, again))
    return found


def test_no_placeholder_is_created_removed_and_created_again_within_ten_minutes(world: World) -> None:
    end = world.step_at + RATE_WINDOW_SECONDS + 2 * max(sc.interval for sc in SCENARIOS)
    world.wait_until(end, "the end of the recording")
    assert not world.recorder.errors, world.recorder.errors[:5]
    problems = {}
    for sc in SCENARIOS:
        samples = world.recorder.samples[sc.namespace]
        assert samples and max(s.placeholders for s in samples) > 0, f"{sc.namespace}: never prewarmed"
        found = cycles(samples)
        if found:
            problems[sc.namespace] = ([tuple(round(t - world.step_at) for t in c) for c in found],
                                      world.recorder.timeline(sc.namespace, world.step_at, "placeholders"))
    assert not problems, problems
