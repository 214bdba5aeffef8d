"""Process faults: the controller SIGKILLed between two API writes (20 times), and two replicas.

SIGKILL: a forked controller process reconciles against the fake API server
(in this process, over loopback HTTP); the server kills it with SIGKILL right
after committing its k-th write — e.g. the target's /scale is patched but the
status is not yet written. A new process starts from what the API server holds
(kopf's startup handler, then the timer), exactly as after a real crash. After
20 kills the cluster and the planner state must equal an uninterrupted run's.
"""

from __future__ import annotations

import math
import os
import random
import signal
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from pytest_httpserver import HTTPServer

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.handlers import build_registry
from predictive_scaler.controller.service import ControllerService
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.kube import manifests
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.reliability.conftest import MODEL, MakeWorld, matrix_spec
from tests.reliability.harness import NS, SCALER_API, World
from tests.reliability.scenarios import BY_ID
from tests.support.fakes.apiserver import FakeApiServer
from tests.support.fakes.ports import FakeMetrics
from tests.support.prometheus import BackfilledPrometheus

START = datetime(2018, 6, 20, 8, 1, tzinfo=UTC)
KILLS = 20
PERIODS = 90
WRITES = ("POST", "PUT", "PATCH", "DELETE")


class KillingApi(FakeApiServer):
    """The fake API server, able to SIGKILL its client right after committing a write."""

    victim: int | None = None
    kill_after_writes: int | None = None
    writes_seen = 0
    #: Kill only after a /scale or placeholder write (before that period's status write).
    only_mid_period = False
    #: (method, path) of the write each kill followed.
    killed_after: list[tuple[str, str]]

    def _respond(self, method: str, path: str, query: dict[str, str], content_type: str | None,
                 body: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
        answer = super()._respond(method, path, query, content_type, body)
        if method in WRITES and answer[0] < 300 and self.victim is not None:
            self.writes_seen += 1
            mid_period_write = not path.endswith("/status") and "/events" not in path
            if (self.kill_after_writes is not None and self.writes_seen >= self.kill_after_writes
                    and (mid_period_write or not self.only_mid_period)):
                os.kill(self.victim, signal.SIGKILL)  # committed, never acknowledged
                self.killed_after.append((method, path))
                self.kill_after_writes = None
        return answer


def demand(t: datetime) -> float:
    """A morning ramp with a wobble: enough change to scale up, down and prewarm."""
    hours = (t - START).total_seconds() / 3600
    return 700 + 500 * math.sin(2 * math.pi * hours / 0.5) + 60 * math.sin(hours * 17)


def controller_process(api_url: str, store_root: str) -> None:
    """The child: start like kopf would (startup handler), then run timer periods until PERIODS.

    The period to run is derived from the status the API server holds, so a process
    killed before writing its status runs the same period again.
    """
    from kubernetes.client import ApiClient, Configuration

    configuration = Configuration(host=api_url)
    configuration.retries = False
    clock = FakeClock(START)
    kube = KubeCluster(ApiClient(configuration), retry=RetryPolicy(), clock=clock, sleep=clock.advance,
                       rng=random.Random(1), request_timeout=5.0)
    settings = ControllerSettings(prometheus_url="http://127.0.0.1:9", model_store=store_root, interval_seconds=60)
    metrics = FakeMetrics(demand)
    service = ControllerService(settings, kube, PrometheusSource("http://127.0.0.1:9", retries=0), ModelStore(store_root),
                                clock, metrics_factory=lambda spec, ref: metrics)
    _, handlers = build_registry(service)
    handlers.startup(settings=kopf.OperatorSettings())
    while True:
        obj = kube.get_scaler(MODEL, NS)
        last = (obj.get("status") or {}).get("lastReconcileTime")
        k = 0 if last is None else int((datetime.fromisoformat(last.replace("Z", "+00:00")) - START)
                                       .total_seconds() // 60) + 1
        if k >= PERIODS:
            return
        clock.set(START + timedelta(minutes=k))
        meta = obj["metadata"]
        try:
            handlers.reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=obj["spec"],
                               status=obj.get("status") or {}, meta=meta)
        except kopf.TemporaryError:
            continue


def run_child(api: KillingApi, store_root: str, kill_after: int | None, *, only_mid_period: bool = False) -> bool:
    """Fork a controller process; True when it was SIGKILLed."""
    api.writes_seen = 0
    api.kill_after_writes = kill_after
    api.only_mid_period = only_mid_period
    pid = os.fork()
    if pid == 0:  # pragma: no cover — the child never returns into pytest
        code = 0
        try:
            controller_process(api.httpserver.url_for("/").rstrip("/"), store_root)
        except BaseException:  # noqa: BLE001 — report through the exit code, never into pytest
            import traceback
            traceback.print_exc()
            code = 3
        os._exit(code)
    api.victim = pid
    _, status = os.waitpid(pid, 0)
    api.victim = None
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the controller process failed (see captured stderr)"
    return False


def install(api: FakeApiServer, spec: dict[str, Any]) -> None:
    api.add_deployment(NS, MODEL, replicas=4, labels={"app": MODEL})
    api.add_gpu_node("gpu-0", 16)
    for i in range(4):
        api.add_pod(NS, f"{MODEL}-pod-{i}", {"app": MODEL}, node="gpu-0", gpus=1)
    api.add_scaler(NS, MODEL, spec)


def snapshot(api: FakeApiServer) -> dict[str, Any]:
    target = api.get("apps/v1", "Deployment", NS, MODEL)
    placeholder = api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(MODEL))
    scaler = api.get(SCALER_API, "PredictiveScaler", NS, MODEL)
    assert target is not None and scaler is not None
    status = scaler.get("status") or {}
    return {"replicas": target["spec"]["replicas"],
            "placeholder": None if placeholder is None else placeholder["spec"]["replicas"],
            "plannerState": status.get("plannerState"), "strategy": status.get("strategy"),
            "lastReconcileTime": status.get("lastReconcileTime")}


def check_cluster(api: FakeApiServer, spec: ScalerSpec) -> None:
    snap = snapshot(api)
    assert spec.min_replicas <= snap["replicas"] <= spec.max_replicas
    assert (snap["placeholder"] or 0) * spec.gpus_per_replica <= (spec.prewarm.budget.max_gpus or 0)
    PlannerState.from_dict(snap["plannerState"])  # never half-written
    placeholders = [d for d in api.objects("apps/v1", "Deployment", NS)
                    if (d["metadata"].get("labels") or {}).get(manifests.ROLE_LABEL) == "placeholder"]
    assert len(placeholders) <= 1


@pytest.fixture
def killing_api(httpserver: HTTPServer) -> Iterator[Callable[[], KillingApi]]:
    made: list[KillingApi] = []

    def fresh() -> KillingApi:
        httpserver.clear()
        api = KillingApi(httpserver)
        api.killed_after = []
        made.append(api)
        return api

    yield fresh
    for api in made:
        api.close()


def test_sigkill_mid_reconcile(killing_api: Callable[[], KillingApi], store: ModelStore,
                               prometheus_server: BackfilledPrometheus) -> None:
    scenario = BY_ID["sigkill-20"]
    spec_dict = matrix_spec(prometheus_server)
    spec = ScalerSpec.from_dict(spec_dict)

    reference = killing_api()
    install(reference, spec_dict)
    assert run_child(reference, str(store.root), None) is False
    expected = snapshot(reference)
    reference_writes = len(reference.writes())

    api = killing_api()
    install(api, spec_dict)
    rng = random.Random(2024)
    kills = 0
    while kills < KILLS:
        # Every fourth kill waits for a /scale or placeholder write, so some kills surely land
        # between two writes of one period however often the planner changes its mind.
        killed = run_child(api, str(store.root), rng.randint(1, 3), only_mid_period=kills % 4 == 3)
        assert killed, f"the run finished after only {kills} kills; lengthen it"
        kills += 1
        check_cluster(api, spec)
    assert run_child(api, str(store.root), None) is False
    check_cluster(api, spec)

    got = snapshot(api)
    assert got == expected
    assert kills == KILLS and PERIODS >= scenario.periods
    # Kills fell between two writes of one period: after the /scale or placeholder write, before the
    # status write — the period was decided again from the old status, with the same outcome.
    mid_period = [p for _, p in api.killed_after if not p.endswith("/status") and "/events" not in p]
    assert len(mid_period) >= 3, api.killed_after
    assert reference_writes > 0


def test_two_replicas(make_world: MakeWorld) -> None:
    scenario = BY_ID["two-replicas"]
    world: World = make_world()
    spec = world.parsed_spec
    second_service, second, _, _ = world.new_controller(seed=8)
    first_kube = world.service.kube
    second_decisions = []
    interleave = {"pending": False}
    real_get_scale = first_kube.get_scale

    def get_scale_then_other_replica(target: Any) -> Any:
        info = real_get_scale(target)
        if interleave["pending"]:
            # Replica 2 runs a whole reconcile between replica 1's observe and its apply.
            interleave["pending"] = False
            obj = world.scaler()
            meta = obj["metadata"]
            second.reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=obj["spec"],
                             status=obj.get("status") or {}, meta=meta)
            outcome = world._outcomes[-1]
            assert outcome.result is not None
            second_decisions.append(outcome.result.decision)
        return info

    first_kube.get_scale = get_scale_then_other_replica  # type: ignore[method-assign]

    def before(w: World, i: int) -> None:
        interleave["pending"] = True

    world.run(scenario.periods, before)
    assert len(second_decisions) == scenario.periods
    for d in second_decisions:
        assert spec.min_replicas <= d.desired_replicas <= spec.max_replicas
        assert d.speculative_gpus <= (spec.prewarm.budget.max_gpus or 0)
    conflicts = sum(p.api_statuses.count(409) for p in world.periods)
    assert conflicts >= 1, "the interleaving never produced a stale write"
    assert all(p.outcome == "ok" for p in world.periods)
    # Converged: the status the API holds describes the scale the API holds.
    final = world.step(scenario.periods)
    assert final.status["desiredReplicas"] == final.scale_replicas
    assert final.result is not None and final.result.decision.desired_replicas == final.scale_replicas
    del second_service
