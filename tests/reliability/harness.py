"""Run control periods through the controller exactly as kopf would, and check the invariants.

:class:`World` wires the controller's real pieces — :class:`ControllerService` with
:class:`KubeCluster` on the stateful fake API server, :class:`PrometheusSource` on a
real Prometheus (through the fault proxy), the model store on disk, the kopf
handler from :func:`build_registry` — to one injected :class:`FakeClock`. Retry
sleeps advance that clock; nothing sleeps for real. Each period the harness
reads the PredictiveScaler as the API server holds it (what kopf's watch would
hand the timer), calls the handler, records what happened, and lets a tiny
"kubelet" make the target's pods match its replicas (ready at once).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import kopf

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.api_activity import ApiActivity
from predictive_scaler.controller.handlers import Handlers, build_registry
from predictive_scaler.controller.service import ControllerService, Outcome
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.controller.telemetry import Telemetry
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.kube import manifests
from predictive_scaler.kube.api_calls import api_call_for
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.retry import RetryPolicy
from predictive_scaler.reconcile import ReconcileResult
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.fakes.apiserver import FakeApiServer

NS = "ml"
SCALER_API = "autoscaling.predictive-scaler.io/v1alpha1"
INTERVAL = 60.0
GPUS_PER_NODE = 4


@dataclass(frozen=True)
class PostedEvent:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Period:
    index: int
    at: datetime
    outcome: str  # "ok" | "retry" (kopf.TemporaryError) | "refused"
    retry_delay: float | None
    result: ReconcileResult | None
    status: Mapping[str, Any]
    events: tuple[PostedEvent, ...]
    scale_replicas: int
    placeholder_replicas: int | None  # None: no placeholder Deployment
    replicas_before: int
    wall_seconds: float
    api_statuses: tuple[int, ...]
    #: Every telemetry sample of this scaler after the period, keyed ``name{label="v",…}``.
    samples: Mapping[str, float]

    @property
    def strategy(self) -> str | None:
        return None if self.result is None else self.result.decision.strategy

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return next((c for c in self.status.get("conditions", ()) if c.get("type") == kind), None)


@dataclass
class World:
    """One controller process (or several, sharing the API and the store) under an injected clock."""

    fake_api: FakeApiServer
    store: ModelStore
    prometheus_url: str
    start: datetime
    spec: dict[str, Any]
    name: str = "llm"
    replicas: int = 4
    prometheus_timeout: float = 2.0
    clock: FakeClock = field(init=False)
    kube_sleeps: list[float] = field(default_factory=list)
    periods: list[Period] = field(default_factory=list)
    #: Controller-clock offset from the world's clock (clock-skew scenarios).
    skew: timedelta = timedelta(0)
    checked_requests: int = 0
    #: A MetricsPort to use instead of Prometheus (state-machine and process tests).
    metrics: Any = None

    def __post_init__(self) -> None:
        self.clock = FakeClock(self.start)
        self.service, self.handlers, self.telemetry, self.source = self.new_controller()
        self._outcomes: list[Outcome] = []
        self._install()

    # -- wiring --------------------------------------------------------------------------------
    def new_controller(self, seed: int = 7) -> tuple[ControllerService, Handlers, Telemetry, PrometheusSource]:
        """A fresh controller process: new caches, new budget ledger, same cluster, store and clock."""
        activity = ApiActivity()  # as run.py wires it: retries absorbed inside a call are counted
        kube = KubeCluster(activity.wrap(self.fake_api.api_client), retry=RetryPolicy(), clock=self.clock,
                           sleep=activity.sleep(self._kube_sleep), rng=random.Random(seed), request_timeout=5.0)
        source = PrometheusSource(self.prometheus_url, timeout=self.prometheus_timeout, retries=1,
                                  backoff_seconds=0.5, clock=self.clock, sleep=self.clock.advance)
        settings = ControllerSettings(prometheus_url=self.prometheus_url, model_store=self.store.root,
                                      interval_seconds=INTERVAL)
        telemetry = Telemetry()
        factory = None if self.metrics is None else (lambda spec, ref: self.metrics)
        service = ControllerService(settings, kube, source, self.store, self.clock, telemetry=telemetry,
                                    metrics_factory=factory, api_activity=activity)
        original = service.reconcile

        def capturing(**kwargs: Any) -> Outcome:
            outcome = original(**kwargs)
            self._outcomes.append(outcome)
            return outcome

        service.reconcile = capturing  # type: ignore[method-assign]
        _, handlers = build_registry(service)
        return service, handlers, telemetry, source

    def restart(self) -> None:
        """The controller process restarts: everything in memory is gone; the status remains."""
        self.service, self.handlers, self.telemetry, self.source = self.new_controller()

    def _kube_sleep(self, seconds: float) -> None:
        self.kube_sleeps.append(seconds)
        self.clock.advance(seconds)

    def _install(self) -> None:
        labels = {"app": self.name}
        self.fake_api.add_deployment(NS, self.name, replicas=self.replicas, labels=labels)
        self.fake_api.add_gpu_node(f"gpu-{self.name}-0", GPUS_PER_NODE)
        self.fake_api.add_scaler(NS, self.name, self.spec)
        self.sync_pods()

    @property
    def parsed_spec(self) -> ScalerSpec:
        return ScalerSpec.from_dict(self.scaler()["spec"])

    # -- the cluster ---------------------------------------------------------------------------
    def scaler(self) -> dict[str, Any]:
        obj = self.fake_api.get(SCALER_API, "PredictiveScaler", NS, self.name)
        assert obj is not None
        return obj

    def set_spec(self, **changes: Any) -> None:
        obj = self.scaler()
        obj["spec"] = {**obj["spec"], **changes}
        obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
        self.fake_api.put(obj)

    def target_replicas(self) -> int:
        dep = self.fake_api.get("apps/v1", "Deployment", NS, self.name)
        assert dep is not None
        return int(dep["spec"]["replicas"])

    def placeholder(self) -> dict[str, Any] | None:
        return self.fake_api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(self.name))

    def placeholder_replicas(self) -> int | None:
        ph = self.placeholder()
        return None if ph is None else int(ph["spec"].get("replicas") or 0)

    def sync_pods(self) -> None:
        """The kubelet: the target's pods follow its replicas and are ready at once."""
        want = self.target_replicas()
        pods = [p for p in self.fake_api.objects("v1", "Pod", NS)
                if (p["metadata"].get("labels") or {}).get("app") == self.name]
        names = sorted(p["metadata"]["name"] for p in pods)
        for i in range(len(names), want):
            self.fake_api.add_pod(NS, f"{self.name}-pod-{i:03d}", {"app": self.name}, ready=True,
                                  node=f"gpu-{self.name}-0", gpus=1)
        for extra in names[want:]:
            self.fake_api.delete("v1", "Pod", NS, extra)

    # -- periods -------------------------------------------------------------------------------
    def at(self, index: int) -> datetime:
        return self.start + timedelta(seconds=INTERVAL * index)

    def run(self, periods: int, before: Callable[[World, int], None] | None = None,
            service: Callable[[int], Handlers] | None = None) -> list[Period]:
        for i in range(len(self.periods), len(self.periods) + periods):
            if before is not None:
                before(self, i)
            self.step(i, handlers=None if service is None else service(i))
        return self.periods

    def step(self, index: int, handlers: Handlers | None = None) -> Period:
        self.clock.set(self.at(index) + self.skew)
        obj = self.scaler()
        meta = obj["metadata"]
        replicas_before = self.target_replicas()
        seen = len(self.fake_api.requests)
        self._outcomes.clear()
        delay: float | None = None
        t0 = time.perf_counter()
        try:
            (handlers or self.handlers).reconcile(
                name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=obj["spec"],
                status=obj.get("status") or {}, meta=meta)
            outcome = "ok"
        except kopf.TemporaryError as exc:
            outcome, delay = "retry", float(exc.delay or 0.0)
        wall = time.perf_counter() - t0
        new = self.fake_api.requests[seen:]
        result = self._outcomes[-1].result if self._outcomes else None
        if self._outcomes and self._outcomes[-1].refused:
            outcome = "refused"
        events = tuple(PostedEvent(r.body.get("type", ""), r.body.get("reason", ""), r.body.get("message", ""))
                       for r in new if r.method == "POST" and r.path.endswith("/events") and r.status < 300
                       and isinstance(r.body, dict))
        period = Period(index=index, at=self.at(index), outcome=outcome, retry_delay=delay, result=result,
                        status=dict(self.scaler().get("status") or {}), events=events,
                        scale_replicas=self.target_replicas(), placeholder_replicas=self.placeholder_replicas(),
                        replicas_before=replicas_before, wall_seconds=wall,
                        api_statuses=tuple(r.status for r in new), samples=self.samples())
        self.periods.append(period)
        check_invariants(self, period)
        self.sync_pods()
        return period

    # -- telemetry -----------------------------------------------------------------------------
    def metric(self, name: str, **labels: str) -> float | None:
        full = {"namespace": NS, "scaler": self.name, **labels}
        return self.telemetry.registry.get_sample_value(name, full)

    def errors(self, kind: str) -> float:
        return self.metric("predictive_scaler_reconcile_errors_total", kind=kind) or 0.0

    def samples(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in self.telemetry.registry.collect():
            for s in family.samples:
                if s.labels.get("namespace") != NS or s.labels.get("scaler") != self.name:
                    continue
                rest = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k not in ("namespace", "scaler"))
                out[f"{s.name}{{{rest}}}" if rest else s.name] = float(s.value)
        return out


def check_invariants(world: World, period: Period) -> None:
    """The promises every scenario keeps, checked on every period."""
    spec = world.parsed_spec
    budget = spec.prewarm.budget
    where = f"period {period.index} ({period.at:%H:%M})"
    assert period.scale_replicas <= spec.max_replicas, f"{where}: target scaled above max"
    ph = period.placeholder_replicas or 0
    if budget.max_gpus is not None:
        assert ph * spec.gpus_per_replica <= budget.max_gpus, f"{where}: placeholder above the GPU budget"
    d = None if period.result is None else period.result.decision
    if d is not None:
        assert spec.min_replicas <= d.desired_replicas <= spec.max_replicas, f"{where}: {d.desired_replicas}"
        if budget.max_gpus is not None:
            assert d.speculative_gpus <= budget.max_gpus, f"{where}: speculative {d.speculative_gpus} GPUs"
        if budget.max_cost_per_hour is not None and d.speculative_cost_per_hour is not None:
            assert d.speculative_cost_per_hour <= budget.max_cost_per_hour + 1e-9, where
        if d.demand is None:  # missing data never scales down
            assert d.desired_replicas >= period.replicas_before, f"{where}: scaled down on missing data"
            assert period.scale_replicas >= period.replicas_before, f"{where}: /scale lowered on missing data"
        if period.result is not None and period.result.applied:
            assert period.scale_replicas == d.desired_replicas, f"{where}: /scale differs from the decision"
            held = d.placeholder_gpus // spec.gpus_per_replica
            assert ph == held, f"{where}: placeholder holds {ph} pods, the decision {held}"
            if d.strategy == "reactive":
                assert ph == 0, f"{where}: placeholder kept while reactive"
    elif period.outcome == "retry":
        assert period.scale_replicas >= period.replicas_before, f"{where}: scaled down by a failed reconcile"
    requests = world.fake_api.requests
    undocumented = {(r.method, r.path) for r in requests[world.checked_requests:]
                    if api_call_for(r.method, r.path) is None}
    world.checked_requests = len(requests)
    assert not undocumented, f"requests missing from API_CALLS: {sorted(undocumented)}"


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
