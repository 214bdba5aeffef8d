"""One controller process: reconcile one PredictiveScaler with the real adapters. No kopf here.

:meth:`ControllerService.reconcile` is what the kopf timer calls (see
:mod:`handlers`), and what tests and the benchmark call directly:

1. paused (annotation ``predictive-scaler.io/paused: "true"``) → no action, condition ``Paused``;
2. the spec is parsed by the one spec type → an invalid spec is a condition and an
   Event that say exactly what to fix, and no action;
3. another autoscaler (HPA, KEDA ScaledObject) on the target → in ``scale`` (and ``keda``)
   mode the scaler refuses to act and removes its placeholder; in ``forecast-only`` it only
   reports (trying predictive-scaler beside an HPA is the point of that mode). In ``keda``
   mode the ScaledObject whose external trigger names this scaler, and the HPA it owns,
   are how it acts, not conflicts;
4. the planner state comes from ``status.plannerState`` (the in-memory copy is used
   only when it is newer, i.e. our own last write has not come back through the watch yet);
5. :meth:`Reconciler.step` runs — the code path the backtest runs — inside a
   reservation of the cluster-wide speculative budget;
6. ``forecast-only`` and ``keda`` leave no placeholder behind; the status, Events and metrics are
   written; in ``keda`` mode the decision is published for the KEDA gRPC server (``keda_board``).

API faults raise :class:`ClusterError` (the kopf handler turns a retryable one into
``kopf.TemporaryError``); they never reach the planner, so they never change the strategy.
They are reported all the same: the condition ``ApiDegraded`` (True while calls
needed retries or reconciles failed since the last status write — attempted in the
failing reconcile too, since only ``/scale`` may be failing, and written at the
latest by the first reconcile whose status write succeeds), a deduplicated Warning
Event ``ClusterApiErrors``, and ``predictive_scaler_api_retries_total{kind}``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from predictive_scaler.clock import Clock
from predictive_scaler.controller.api_activity import ApiActivity, ApiTally, failure_kind
from predictive_scaler.controller.budget import ClusterBudget, Reservation
from predictive_scaler.controller.demand_guard import GuardedDemand, ServingHistoryPort
from predictive_scaler.controller.health import LoopMonitor
from predictive_scaler.controller.lifecycle import Shutdown
from predictive_scaler.controller.ports import (
    KubeClusterPort,
    PrometheusMetricsPort,
    ScalerRef,
    StoreModelPort,
)
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.controller.shards import ShardedBudget, ShardMembership
from predictive_scaler.controller.status import (
    API_EVENT,
    DEMAND_SIGNAL,
    ApiReport,
    CapacityInUse,
    Extra,
    WasteKind,
    api_conditions_patch,
    capacity_in_use,
    planned_spec,
    reconciled_status,
    refused_status,
    waste_report,
)
from predictive_scaler.controller.telemetry import Telemetry
from predictive_scaler.core.sharding import shard_of
from predictive_scaler.crd import PAUSE_ANNOTATION
from predictive_scaler.errors import (
    ClusterError,
    ConfigError,
    DataError,
    NotFoundError,
    ShuttingDown,
    SourceError,
)
from predictive_scaler.forecasting.store import ModelStorage
from predictive_scaler.keda.answer import STATUS_FIELD as KEDA_STATUS
from predictive_scaler.keda.answer import answer_for
from predictive_scaler.keda.board import KedaBoard
from predictive_scaler.keda.ownership import foreign
from predictive_scaler.kube.cache import ClusterCache
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.scalers import NAMESPACE_LABELS_TTL
from predictive_scaler.policy import explain
from predictive_scaler.policy.explain import Event, Held
from predictive_scaler.policy.reasons import Limit
from predictive_scaler.policy.state import PlannerState
from predictive_scaler.reconcile import MetricsPort, Reconciler, ReconcileResult
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec

log = logging.getLogger("predictive_scaler.controller")

#: The dedup window: a repeat of an Event (type, reason and message) within this long of its last
#: occurrence raises the posted Event's count and lastTimestamp, as client-go's recorder does;
#: after it, a new Event is posted.
EVENT_REPEAT_SECONDS = 600.0


@dataclass
class Posted:
    """An Event this process posted: its name, how often it occurred, and when last (for the dedup)."""

    name: str
    count: int
    last_s: float


@dataclass
class ScalerRuntime:
    """Per-scaler memory. Only caches: everything here can be rebuilt from the resource and the store."""

    spec: ScalerSpec | None = None
    reconciler: Reconciler | None = None
    model: StoreModelPort | None = None
    #: The dcgm-busy-gpus guard around the metrics port (None: not a dcgm-busy-gpus scaler, or no serving history).
    guard: GuardedDemand | None = None
    state: PlannerState | None = None
    #: The Events posted, by (type, reason, message): a repeat raises the count of the one posted.
    events: dict[tuple[str, str, str], Posted] = field(default_factory=dict)
    ref: ScalerRef | None = None
    #: Kubernetes API trouble not yet written to the status (ApiDegraded).
    api_retries: ApiTally = field(default_factory=ApiTally)
    api_failed: int = 0
    api_failing_since: datetime | None = None
    api_last_error: str | None = None
    api_failed_kinds: tuple[str, ...] = ()
    #: The failing call of this reconcile was the status write itself (no point trying it again).
    status_write_failed: bool = False
    #: (kind, name) of the other autoscalers on the target at the last reconcile: in forecast-only, the live
    #: autoscaler whose decisions the shadow metrics set beside this scaler's (docs/shadow.md).
    live: tuple[tuple[str, str], ...] = ()
    #: The capacity per replica planned on this reconcile (from the status: a restart changes nothing).
    capacity: CapacityInUse | None = None

    def api_report(self, retries: ApiTally) -> ApiReport:
        return ApiReport(self.api_retries + retries, self.api_failed, self.api_failing_since, self.api_last_error,
                         self.api_failed_kinds)

    def api_reported(self) -> None:
        self.api_retries, self.api_failed, self.api_failing_since = ApiTally(), 0, None
        self.api_last_error, self.api_failed_kinds = None, ()


@dataclass(frozen=True)
class Outcome:
    """What one reconcile did: the status it wrote, and the step's result when a step ran."""

    status: dict[str, Any]
    result: ReconcileResult | None = None
    refused: str | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a gate stops the reconcile before (or instead of) the step: the condition's and the Event's
    reason, the message that says what to do, and what the refused status shows besides."""

    reason: str
    message: str
    paused: bool = False
    conflict: bool = False
    mode: str | None = None
    #: The budget the status reports held (None: the previous status's stands).
    budget: dict[str, Any] | None = None
    event_type: str = "Warning"


@dataclass(frozen=True)
class Stepped:
    """The step ran: its result, and the reservation of the cluster budget it ran in."""

    result: ReconcileResult
    reservation: Reservation


@dataclass(frozen=True)
class Period:
    """One reconcile of one scaler: whom, what its status said before, and when."""

    ref: ScalerRef
    runtime: ScalerRuntime
    previous: dict[str, Any]
    generation: int | None
    now: datetime
    #: ``time.perf_counter()`` when the reconcile began (its duration is a metric).
    started: float

    @property
    def now_s(self) -> float:
        return self.now.timestamp()


def is_paused(annotations: Mapping[str, str] | None) -> bool:
    return str((annotations or {}).get(PAUSE_ANNOTATION, "")).strip().lower() == "true"


class ControllerService:
    def __init__(self, settings: ControllerSettings, kube: KubeCluster, source: PrometheusSource,
                 store: ModelStorage, clock: Clock, *, telemetry: Telemetry | None = None,
                 budget: ClusterBudget | None = None,
                 metrics_factory: Callable[[ScalerSpec, ScalerRef], MetricsPort] | None = None,
                 api_activity: ApiActivity | None = None, loop: LoopMonitor | None = None,
                 shutdown: Shutdown | None = None, cache: ClusterCache | None = None,
                 shards: ShardMembership | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.source = source
        self.store = store
        self.clock = clock
        self.telemetry = telemetry or Telemetry()
        self.budget = budget or ClusterBudget(settings.cluster_budget)
        #: Builds a scaler's MetricsPort; default: its PromQL on ``source`` (tests inject fakes).
        self.metrics_factory = metrics_factory or (
            lambda spec, ref: PrometheusMetricsPort.for_spec(self.source, spec, ref.namespace))
        #: Wired around ``kube``'s API client and retry sleep at the edge; without it, retries go uncounted.
        self.api_activity = api_activity or ApiActivity()
        #: Liveness: when reconciles start and return (whatever their outcome).
        self.loop = loop
        #: Set on SIGTERM: no new period starts (see lifecycle.py).
        self.shutdown = shutdown
        #: The watch-fed cluster cache (kube/cache.py) every reconcile reads; None: direct reads.
        self.cache = cache
        #: Sharding: this replica acts only on the scalers of its shard, while its Lease fence holds.
        self.shards = shards
        self.sharded_budget = (ShardedBudget(settings.cluster_budget, shards.index, shards.count)
                               if shards is not None and shards.count > 1 else None)
        if self.sharded_budget is not None:
            self.budget.limits = self.sharded_budget.limits_now()
        #: FinOps team per namespace (``settings.team_label``'s value), and when its last read failed.
        self._teams: dict[str, str] = {}
        self._team_failed: dict[str, float] = {}
        self._runtimes: dict[str, ScalerRuntime] = {}
        self._lock = threading.Lock()
        #: The latest decision of each scaler in mode keda, for the KEDA gRPC server (keda/server.py).
        assert settings.liveness_timeout_seconds is not None
        self.keda_board = KedaBoard(clock, settings.liveness_timeout_seconds)

    # -- process-wide ---------------------------------------------------------------------------
    def seed_budget(self) -> int:
        """Book what every scaler's status says it holds (start-up), before any reconcile."""
        now_s = self.clock.now().timestamp()
        scalers = self.kube.list_scalers(self.settings.namespace)
        if self.sharded_budget is not None:
            self.observe_shards(scalers)
        for obj in scalers:
            if self.shards is not None and shard_of(
                    f"{(obj.get('metadata') or {}).get('namespace', '')}/{(obj.get('metadata') or {}).get('name', '')}",
                    self.shards.count) != self.shards.index:
                continue  # another shard books it
            meta = obj.get("metadata") or {}
            held = ((obj.get("status") or {}).get("budgetInUse")) or {}
            self.budget.seed(str(meta.get("uid", "")), _int(held.get("gpus")), _float(held.get("costPerHour")), now_s)
        self.telemetry.scalers = len(scalers)
        return len(scalers)

    def observe_shards(self, scalers: list[dict[str, Any]] | None = None) -> None:
        """Re-read what the other shards' scalers hold (one paginated list), and this shard's budget."""
        if self.sharded_budget is None:
            return
        self.sharded_budget.observe(scalers if scalers is not None else self.kube.list_scalers(self.settings.namespace))
        self.budget.limits = self.sharded_budget.limits_now()

    def forget(self, uid: str, namespace: str, name: str) -> None:
        """The scaler was deleted: its placeholder goes with it (ownerReferences), so do its bookings."""
        with self._lock:
            self._runtimes.pop(uid, None)
            self.telemetry.scalers = len(self._runtimes)
        self.budget.release(uid)
        self.telemetry.forget(namespace, name)
        self.keda_board.withdraw(namespace, name, None)

    def _runtime(self, uid: str) -> ScalerRuntime:
        with self._lock:
            runtime = self._runtimes.setdefault(uid, ScalerRuntime())
            self.telemetry.scalers = len(self._runtimes)
            # A scaler deleted while we were away never calls forget(): its booking expires.
            self.budget.forget_older_than(self.clock.now().timestamp() - 5 * self.settings.interval_seconds)
            return runtime

    # -- one reconcile --------------------------------------------------------------------------
    def reconcile(self, *, name: str, namespace: str, uid: str, spec: Mapping[str, Any] | None,
                  status: Mapping[str, Any] | None = None, annotations: Mapping[str, str] | None = None,
                  generation: int | None = None) -> Outcome:
        if self.shutdown is not None and self.shutdown.requested.is_set():
            raise ShuttingDown(f"stopping ({self.shutdown.reason}): no new period starts")
        if self.shards is not None and not self.shards.owns(namespace, name):
            # Another shard's scaler, or the fence does not hold now: nothing is read or written.
            return Outcome({}, None, "OtherShard")
        token = self.loop.begin() if self.loop is not None else None
        try:
            return self._reconcile_period(name=name, namespace=namespace, uid=uid, spec=spec, status=status,
                                          annotations=annotations, generation=generation)
        finally:
            if token is not None and self.loop is not None:
                self.loop.end(token)

    def _reconcile_period(self, *, name: str, namespace: str, uid: str, spec: Mapping[str, Any] | None,
                          status: Mapping[str, Any] | None, annotations: Mapping[str, str] | None,
                          generation: int | None) -> Outcome:
        started = time.perf_counter()
        now = self.clock.now()
        ref = ScalerRef(name, namespace, uid)
        runtime = self._runtime(uid)
        runtime.ref = ref
        runtime.status_write_failed = False
        previous = dict(status or {})
        self.api_activity.begin()
        try:
            return self._reconcile(ref, runtime, spec, previous, annotations, generation, now, started)
        except ClusterError as exc:
            self._api_failed(ref, runtime, exc, previous, generation, now)
            raise

    def _reconcile(self, ref: ScalerRef, runtime: ScalerRuntime, spec: Mapping[str, Any] | None,
                   previous: dict[str, Any], annotations: Mapping[str, str] | None, generation: int | None,
                   now: datetime, started: float) -> Outcome:
        """The gates in order (each may refuse, and nothing after it runs), the step, the report."""
        period = Period(ref, runtime, previous, generation, now, started)
        refusal = self._gate_paused(period, annotations)
        if refusal is not None:
            return self._refuse(period, refusal)
        parsed = self._gate_spec(period, spec)
        if isinstance(parsed, Refusal):
            return self._refuse(period, parsed)
        # From here on the spec carries the capacity per replica in use (capacity.learned: serve).
        runtime.capacity = capacity_in_use(parsed, previous, now)
        parsed = planned_spec(parsed, runtime.capacity)
        cluster = KubeClusterPort(self.kube, ref, parsed, self.cache)
        conflicts = self._gate_conflicts(period, parsed, cluster)
        if isinstance(conflicts, Refusal):
            return self._refuse(period, conflicts)
        refusal = self._gate_placeholder_priority(period, parsed, cluster)
        if refusal is not None:
            return self._refuse(period, refusal)
        stepped = self._step(period, parsed, cluster)
        if isinstance(stepped, Refusal):
            return self._refuse(period, stepped)
        return self._report(period, parsed, cluster, stepped, conflicts)

    # -- the gates: each either lets the reconcile go on or says why it must not ------------------
    def _gate_paused(self, period: Period, annotations: Mapping[str, str] | None) -> Refusal | None:
        if not is_paused(annotations):
            return None
        # Paused keeps what it holds: nothing is touched, so its booking stands.
        self._keep_booking(period)
        return Refusal("Paused", f"paused by the annotation {PAUSE_ANNOTATION}=\"true\": nothing is read or "
                                 "changed; remove the annotation to resume", paused=True, event_type="Normal")

    def _gate_spec(self, period: Period, spec: Mapping[str, Any] | None) -> ScalerSpec | Refusal:
        try:
            return ScalerSpec.from_dict(spec or {})
        except ConfigError as exc:
            self.telemetry.error(period.ref.namespace, period.ref.name, "config")
            self._keep_booking(period)
            return Refusal("InvalidSpec", _fix_message(exc))

    def _gate_conflicts(self, period: Period, parsed: ScalerSpec,
                        cluster: KubeClusterPort) -> tuple[str, ...] | Refusal:
        """The other autoscalers on the target (described), or the refusal to fight them."""
        ref = period.ref
        try:
            found = cluster.conflicts()
        except ClusterError:
            self.telemetry.error(ref.namespace, ref.name, "cluster")
            raise
        if parsed.mode == "keda":  # the ScaledObject using this scaler, and its HPA, are how it acts
            found = foreign(found, ref.name)
        period.runtime.live = tuple((c.kind, c.name) for c in found)
        conflicts = tuple(c.describe() for c in found)
        if not conflicts or parsed.mode == "forecast-only":
            return conflicts
        removed = self._release_placeholder(cluster, ref.uid, period.now_s)
        message = conflict_message(parsed, conflicts, removed)
        return Refusal("ConflictingAutoscaler", message, conflict=True, mode=parsed.mode, budget=_no_budget(parsed))

    def _gate_placeholder_priority(self, period: Period, parsed: ScalerSpec,
                                   cluster: KubeClusterPort) -> Refusal | None:
        if parsed.mode != "scale" or not parsed.prewarm.enabled:
            return None
        ref = period.ref
        try:
            cluster.check_placeholder_priority()
        except ConfigError as exc:
            self.telemetry.error(ref.namespace, ref.name, "config")
            self._release_placeholder(cluster, ref.uid, period.now_s)
            return Refusal("InvalidSpec", _fix_message(exc), mode=parsed.mode, budget=_no_budget(parsed))
        except ClusterError:
            self.telemetry.error(ref.namespace, ref.name, "cluster")
            raise
        return None

    # -- the step: the code path the backtest runs, inside a reservation of the cluster budget ----
    def _step(self, period: Period, parsed: ScalerSpec, cluster: KubeClusterPort) -> Stepped | Refusal:
        ref, runtime, now_s = period.ref, period.runtime, period.now_s
        reconciler = self._reconciler(runtime, parsed, ref, cluster)
        assert runtime.model is not None
        runtime.model.refresh()
        self.telemetry.model_trained(ref.namespace, ref.name, _ts(runtime.model.trained_until))
        state = self._state(runtime, period.previous, ref, period.now)
        try:
            with self.budget.reserve(ref.uid, parsed.prewarm.budget.price_per_gpu_hour, now_s) as reservation:
                result = reconciler.step(state, cluster_share=reservation.share, cluster=cluster)
                # In mode keda the speculative replicas exist too: KEDA's HPA runs them.
                held = result.decision.speculative_gpus if result.applied or parsed.mode == "keda" else 0
                reservation.settle(held, now_s)
        except ConfigError as exc:  # e.g. the target's kind has no /scale
            self.telemetry.error(ref.namespace, ref.name, "config")
            return Refusal("InvalidSpec", _fix_message(exc))
        except NotFoundError as exc:  # the target (or the API serving its kind) does not exist
            self.telemetry.error(ref.namespace, ref.name, "cluster")
            return Refusal("TargetNotFound", str(exc), mode=parsed.mode)
        except ClusterError:
            self.telemetry.error(ref.namespace, ref.name, "cluster")
            raise
        if parsed.mode != "scale" and cluster.placeholder is not None:
            # Switched from scale to forecast-only or keda: it must leave nothing behind.
            cluster.remove_placeholder()
        runtime.state = result.state
        return Stepped(result, reservation)

    # -- the report: status, Events, the KEDA board, metrics and the log line ---------------------
    def _report(self, period: Period, parsed: ScalerSpec, cluster: KubeClusterPort, stepped: Stepped,
                conflicts: tuple[str, ...]) -> Outcome:
        ref, runtime, result = period.ref, period.runtime, stepped.result
        model = runtime.model
        assert model is not None
        held_now = self.budget.held(ref.uid)
        budget_gpus = held_now.gpus if held_now else 0
        priced = parsed.prewarm.budget.price_per_gpu_hour is not None
        budget_cost = held_now.cost_per_hour if held_now and priced else None
        api = self._api_before_status(ref, runtime)
        extra = Extra(conflicts=conflicts, budget_gpus=budget_gpus, budget_cost_per_hour=budget_cost,
                      model_warning=model.problem if model.version else None,
                      savings=_savings(result, parsed) if parsed.mode == "forecast-only" else None, api=api,
                      demand_signal=runtime.guard.last if runtime.guard is not None else None,
                      capacity=runtime.capacity, waste=self._waste(period, parsed),
                      currency=parsed.prewarm.budget.currency)
        body = reconciled_status(result, parsed, extra, period.previous, period.now, period.generation)
        events = [*self._actions(parsed, cluster, result), *self._step_events(model, parsed, cluster, stepped, api)]
        before = period.previous.get("capacity")
        held = _float(before.get("serving")) if isinstance(before, Mapping) else parsed.capacity_per_replica
        if runtime.capacity is not None and runtime.capacity.source == "learned" and runtime.capacity.serving != held:
            events.append(Event("Normal", "CapacityLearned", runtime.capacity.reason))
        if runtime.guard is not None and runtime.guard.last is not None and runtime.guard.last.fired:
            events.append(Event("Warning", DEMAND_SIGNAL, runtime.guard.last.message))
        if parsed.mode == "keda":
            answer = answer_for(result.decision, parsed, namespace=ref.namespace, name=ref.name,
                                decided_at=result.now)
            self.keda_board.publish(answer)
            # In the status too: any replica (a standby, another shard) answers KEDA from it.
            body[KEDA_STATUS] = answer.to_status()
        else:
            self.keda_board.withdraw(ref.namespace, ref.name, f"its mode is {parsed.mode}, not keda")
            body[KEDA_STATUS] = None  # a merge patch: removes an answer left from mode keda
        self._write_status(ref, body)
        runtime.api_reported()
        self._post(ref, runtime, events, period.now_s)
        self._api_after_status(ref, runtime)
        self._record(period, parsed, stepped, budget_gpus, guarded=runtime.guard is not None
                     and runtime.guard.last is not None and runtime.guard.last.fired)
        self.telemetry.capacity_and_waste(ref.namespace, ref.name, runtime.capacity, extra.waste,
                                          parsed.prewarm.budget.currency)
        return Outcome(body, result)

    def _waste(self, period: Period, parsed: ScalerSpec) -> tuple[WasteKind, ...]:
        """The waste kinds this reconcile has evidence for: the guard's serving history (the port caches it
        per model step, so this is no second pull) and the retraining job's idle-GPU report."""
        guard, history = period.runtime.guard, None
        if guard is not None and guard.last is not None and guard.last.verdict != "unknown":
            try:
                history = guard.history.serving_history(period.now, guard.window)
            except (SourceError, DataError):
                history = None  # the check said it had one a moment ago; without it, fewer kinds
        budget = parsed.prewarm.budget
        return waste_report(history, period.previous, price_per_gpu_hour=budget.price_per_gpu_hour,
                            currency=budget.currency)

    @staticmethod
    def _actions(parsed: ScalerSpec, cluster: KubeClusterPort, result: ReconcileResult) -> tuple[Event, ...]:
        """The Events of what this reconcile changed: what was observed against what the port holds now."""
        seen = result.cluster
        before = Held(seen.desired_replicas, seen.placeholder_gpus // max(1, parsed.gpus_per_replica))
        after = Held(cluster.scale.replicas if cluster.scale is not None else seen.desired_replicas,
                     cluster.placeholder.replicas if cluster.placeholder is not None else 0)
        return explain.actions(result.decision, before, after, parsed)

    def _step_events(self, model: StoreModelPort, parsed: ScalerSpec, cluster: KubeClusterPort, stepped: Stepped,
                     api: ApiReport) -> list[Event]:
        result, reservation = stepped.result, stepped.reservation
        events = list(result.events)
        if api.degraded:
            events.append(Event("Warning", API_EVENT, api.event_message()))
        if reservation.allowed_gpus is not None and Limit.BUDGET in result.decision.limits and reservation.reason:
            events.append(Event("Normal", "ClusterBudgetLimited", reservation.reason))
        if model.problem and model.version:
            events.append(Event("Warning", "ModelVersionRefused", model.problem))
        if cluster.stale and self.cache is not None:
            events.append(self._stale_cache_event(parsed, cluster, self.cache))
        return events

    @staticmethod
    def _stale_cache_event(parsed: ScalerSpec, cluster: KubeClusterPort, cache: ClusterCache) -> Event:
        ages = cache.stale_for()
        kept = (f"; kept {parsed.target.kind}/{parsed.target.name} at {cluster.scale.replicas} replicas instead "
                f"of scaling down to {cluster.held_down}" if cluster.held_down is not None and cluster.scale
                else "")
        return Event("Warning", "ClusterCacheStale", (
            "the watch-fed cluster cache is stale (" + ", ".join(f"{r} {ages[r]:.0f} s" for r in cluster.stale)
            + f", bound {cache.max_staleness_seconds:.0f} s): no scale-down and no new placeholder GPUs "
            "until the watches catch up" + kept))

    def _record(self, period: Period, parsed: ScalerSpec, stepped: Stepped, budget_gpus: int, *,
                guarded: bool = False) -> None:
        """Metrics and the log line of a reconcile that stepped (``guarded``: the demand reading was withheld
        on purpose, which is no metrics error)."""
        ref, result = period.ref, stepped.result
        for kind, problem in (("metrics", result.decision.metrics_problem), ("model", result.decision.model_problem)):
            if problem and not (guarded and kind == "metrics"):
                self.telemetry.error(ref.namespace, ref.name, kind)
        if self.cache is not None:
            self.telemetry.cache_staleness(self.cache.stale_for())
        self.telemetry.record(ref.namespace, ref.name, parsed, result, budget_gpus, stepped.reservation.allowed_gpus,
                              time.perf_counter() - period.started, self.settings.interval_seconds,
                              live=period.runtime.live, team=self._team(ref.namespace, period.now_s))
        log.info("reconciled", extra={"scaler": ref.describe(), "strategy": result.decision.strategy,
                                      "desired": result.decision.desired_replicas,
                                      "placeholder_gpus": result.decision.placeholder_gpus,
                                      "applied": result.applied, "model_version": result.model_version})

    def _team(self, namespace: str, now_s: float) -> str:
        """The value of the namespace label ``settings.team_label`` ("" when unset or absent): the FinOps
        metrics' team. The adapter caches the labels (NAMESPACE_LABELS_TTL); a failed read keeps the last
        value known, is logged, and is not tried again for as long. It never fails the reconcile."""
        label = self.settings.team_label
        if not label:
            return ""
        failed = self._team_failed.get(namespace)
        if failed is not None and now_s - failed < NAMESPACE_LABELS_TTL:
            return self._teams.get(namespace, "")
        try:
            team = self.kube.namespace_labels(namespace).get(label, "")
        except ClusterError as exc:
            self._team_failed[namespace] = now_s
            log.warning("cannot read the team label of namespace %s (%s): FinOps metrics keep team=%r; grant the "
                        "controller get on namespaces", namespace, exc, self._teams.get(namespace, ""))
            return self._teams.get(namespace, "")
        self._team_failed.pop(namespace, None)
        self._teams[namespace] = team
        return team

    # -- pieces ---------------------------------------------------------------------------------
    def _reconciler(self, runtime: ScalerRuntime, spec: ScalerSpec, ref: ScalerRef,
                    cluster: KubeClusterPort) -> Reconciler:
        """The scaler's reconciler, built again when its spec changed (its forecast cache is per spec).
        ``cluster`` is only its default port: every period hands :meth:`Reconciler.step` a fresh one."""
        if runtime.reconciler is None or runtime.spec != spec:
            model_name = spec.model.name or ref.name
            runtime.model = StoreModelPort(self.store, model_name, horizon_seconds=spec.horizon_seconds,
                                           quantile=spec.quantile, pinned_version=spec.model.version,
                                           expected_series=model_name)
            metrics = self.metrics_factory(spec, ref)
            runtime.guard = None
            if spec.demand.kind == "dcgm-busy-gpus" and isinstance(metrics, ServingHistoryPort):
                # Utilisation as demand is trusted only while it tracks load (policy/saturation.py).
                metrics = runtime.guard = GuardedDemand(metrics, metrics)
            runtime.reconciler = Reconciler(spec, metrics, runtime.model, cluster, self.clock)
            runtime.spec = spec
        return runtime.reconciler

    def _state(self, runtime: ScalerRuntime, previous: Mapping[str, Any], ref: ScalerRef, now: Any) -> PlannerState:
        try:
            stored = PlannerState.from_dict(previous.get("plannerState"))
        except ConfigError as exc:
            self._post(ref, runtime, [Event("Warning", "PlannerStateReset", f"{exc}; starting afresh")],
                       now.timestamp())
            stored = PlannerState()
        mine = runtime.state
        if mine is not None and (mine.last_decided_at or -math.inf) > (stored.last_decided_at or -math.inf):
            return mine
        return stored

    def _release_placeholder(self, cluster: KubeClusterPort, uid: str, now_s: float) -> bool:
        """Delete the placeholder and release the scaler's booking; True when a placeholder was deleted."""
        removed = cluster.remove_placeholder()
        with self.budget.reserve(uid, None, now_s) as r:
            r.settle(0, now_s)
        return removed

    def _refuse(self, period: Period, refusal: Refusal) -> Outcome:
        ref, runtime, reason, message = period.ref, period.runtime, refusal.reason, refusal.message
        self.keda_board.withdraw(ref.namespace, ref.name, f"{reason}: {message}")
        api = self._api_before_status(ref, runtime)
        body = refused_status(reason, reason, message, period.previous, period.now, period.generation,
                              mode=refusal.mode, conflict=refusal.conflict, paused=refusal.paused,
                              budget=refusal.budget, api=api)
        body[KEDA_STATUS] = None  # refused: no replica may answer KEDA from an old decision
        self._write_status(ref, body)
        runtime.api_reported()
        events = [Event(refusal.event_type, reason, message)]
        if api.degraded:
            events.append(Event("Warning", API_EVENT, api.event_message()))
        self._post(ref, runtime, events, period.now_s)
        self._api_after_status(ref, runtime)
        self.telemetry.refused(ref.namespace, ref.name, period.now_s)
        log.warning("refused", extra={"scaler": ref.describe(), "reason": reason, "detail": message})
        return Outcome(body, None, reason)

    def _keep_booking(self, period: Period) -> None:
        """Book what the status says the scaler holds: a scaler that does not step keeps it."""
        held = period.previous.get("budgetInUse")
        held = held if isinstance(held, Mapping) else {}
        self.budget.seed(period.ref.uid, _int(held.get("gpus")), _float(held.get("costPerHour")), period.now_s)

    def _write_status(self, ref: ScalerRef, body: Mapping[str, Any]) -> None:
        try:
            self.kube.patch_status(ref.name, ref.namespace, body)
        except ClusterError:
            self.telemetry.error(ref.namespace, ref.name, "cluster")
            if ref.uid in self._runtimes:
                self._runtimes[ref.uid].status_write_failed = True
            raise

    # -- Kubernetes API trouble -----------------------------------------------------------------
    def _api_before_status(self, ref: ScalerRef, runtime: ScalerRuntime) -> ApiReport:
        """Count this reconcile's retries so far and report them with what is pending since the last write."""
        tally = self.api_activity.take()
        self.telemetry.api_retries(ref.namespace, ref.name, tally)
        return runtime.api_report(tally)

    def _api_after_status(self, ref: ScalerRef, runtime: ScalerRuntime) -> None:
        """Retries after the status was built (its own write, the Events) are reported next time."""
        tally = self.api_activity.take()
        self.telemetry.api_retries(ref.namespace, ref.name, tally)
        runtime.api_retries = runtime.api_retries + tally

    def _api_failed(self, ref: ScalerRef, runtime: ScalerRuntime, exc: ClusterError, previous: Mapping[str, Any],
                    generation: int | None, now: datetime) -> None:
        """A reconcile failed on the API: remember it for the status, and try to say so already."""
        tally = self.api_activity.take()
        self.telemetry.api_retries(ref.namespace, ref.name, tally)
        runtime.api_retries = runtime.api_retries + tally
        runtime.api_failed += 1
        runtime.api_failing_since = runtime.api_failing_since or now
        runtime.api_last_error = str(exc)
        kind = failure_kind(exc)
        if kind not in runtime.api_failed_kinds:
            runtime.api_failed_kinds = (*runtime.api_failed_kinds, kind)
        if runtime.status_write_failed or kind == "unreachable":
            return  # the status write itself failed, or nothing reaches the server: do not try again now
        report = runtime.api_report(ApiTally())
        try:
            # Only /scale (or the placeholder) may be failing: the status subresource often still works.
            self.kube.patch_status(ref.name, ref.namespace, api_conditions_patch(report, previous, now, generation))
        except ClusterError as again:
            log.warning("API trouble not recorded in the status",
                        extra={"scaler": ref.describe(), "detail": str(again)})
            return
        finally:
            late = self.api_activity.take()
            self.telemetry.api_retries(ref.namespace, ref.name, late)
            runtime.api_retries = runtime.api_retries + late
        self._post(ref, runtime, [Event("Warning", API_EVENT, report.event_message())], now.timestamp())
        self.telemetry.api_retries(ref.namespace, ref.name, self.api_activity.take())

    def _post(self, ref: ScalerRef, runtime: ScalerRuntime, events: list[Event], now_s: float) -> None:
        """Post Events, deduplicated as client-go's recorder does: a repeat of the same (type, reason,
        message) within EVENT_REPEAT_SECONDS of its last occurrence raises the posted Event's count and
        lastTimestamp instead of creating another. Best effort."""
        for key in [k for k, p in runtime.events.items() if now_s - p.last_s >= EVENT_REPEAT_SECONDS]:
            del runtime.events[key]  # past the window: the next occurrence is a new Event
        for ev in events:
            key = (ev.type, ev.reason, ev.message)
            posted = runtime.events.get(key)
            try:
                if posted is not None:
                    try:
                        self.kube.repeat_event(ref.namespace, posted.name, posted.count + 1, self.clock.now())
                        posted.count, posted.last_s = posted.count + 1, now_s
                        continue
                    except NotFoundError:
                        pass  # expired (the API server's event TTL) or deleted: post it afresh
                name = self.kube.create_event(ref.involved_object(), ev.reason, ev.message, ev.type,
                                              self.clock.now(), instance=None)
            except ClusterError as exc:
                # An Event lost is a report lost, not a reason to fail the reconcile.
                log.warning("event not recorded", extra={"scaler": ref.describe(), "reason": ev.reason,
                                                         "detail": str(exc)})
                continue
            runtime.events[key] = Posted(name, 1, now_s)


def conflict_message(spec: ScalerSpec, conflicts: tuple[str, ...], removed: bool) -> str:
    """The ConflictingAutoscaler refusal: who else scales the target, what to do, and — only when one
    was deleted — that the placeholder was removed."""
    return (f"refusing to scale {spec.target.kind}/{spec.target.name}: {', '.join(conflicts)} already scales it "
            "and two autoscalers would fight; delete it (or set mode: forecast-only to only report)"
            + (" — the placeholder was removed" if removed else ""))


def _fix_message(exc: ConfigError) -> str:
    where = f" (field {exc.field})" if exc.field else ""
    return f"invalid spec{where}: {exc}. Nothing is scaled until it is fixed."


def _no_budget(spec: ScalerSpec) -> dict[str, Any]:
    """The budget a refusal that removed the placeholder reports: nothing held."""
    return {"gpus": 0, "costPerHour": 0.0, "currency": spec.prewarm.budget.currency}


def _savings(result: ReconcileResult, spec: ScalerSpec) -> str | None:
    d, c = result.decision, result.cluster
    diff = (c.desired_replicas - d.desired_replicas) * spec.gpus_per_replica
    if diff == 0:
        return f"scaling would keep {c.desired_replicas} replicas"
    price = spec.prewarm.budget.price_per_gpu_hour
    money = "" if price is None else f", {abs(diff) * price:.2f} {d.currency}/h"
    verb = "saving" if diff > 0 else "adding"
    return (f"scaling would run {d.desired_replicas} replicas instead of {c.desired_replicas}: "
            f"{verb} {abs(diff)} GPUs{money}")


def _int(v: Any) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0
    return int(f) if math.isfinite(f) and f > 0 else 0


def _float(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) and f > 0 else 0.0


def _ts(when: Any) -> float | None:
    return None if when is None else float(when.timestamp())
