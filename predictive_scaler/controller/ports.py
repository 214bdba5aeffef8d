"""The real adapters behind the reconciler's ports, for one PredictiveScaler.

- :class:`KubeClusterPort` (ClusterPort) over :class:`~predictive_scaler.kube.client.KubeCluster`:
  observe the target's ``/scale``, its pods, its placeholder and the free GPUs;
  apply a decision by patching ``/scale`` and sizing the placeholder Deployment
  (one pod per would-be replica, so a real replica preempts exactly one);
  list other autoscalers on the same target; remove the placeholder.
- :class:`StoreModelPort` (ModelPort) over the model store: notices a new
  serving version without a restart (the pointer and the model file are checked
  on every :meth:`~StoreModelPort.refresh`), verifies before use, and keeps the
  model it already verified when a *new* version is refused. A serving file
  that changed under the same version is tampering: the model is dropped.
- :class:`PrometheusMetricsPort` (MetricsPort) over
  :class:`~predictive_scaler.sources.history.PrometheusMetrics`: a missing value
  (empty result, NaN, stale) becomes a :class:`SourceError` carrying the reason,
  never a number.

Nothing here imports ``kubernetes`` or ``kopf``: the adapters take the package's
own facades, so the fake API server and a real cluster exercise the same code.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from predictive_scaler.core.values import DemandSample, Forecast
from predictive_scaler.errors import ConfigError, DataError, ModelError, SourceError
from predictive_scaler.forecasting.base import FittedModel
from predictive_scaler.forecasting.store import (
    MODEL_FILE,
    LoadedModel,
    ModelStorage,
    ModelStore,
    check_model_name,
)
from predictive_scaler.kube import manifests
from predictive_scaler.kube.autoscalers import ConflictingAutoscaler
from predictive_scaler.kube.cache import HPAS, NODES, PODS, SCALED_OBJECTS, ClusterCache
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.kube.placeholders import PlaceholderInfo, PlaceholderSpec
from predictive_scaler.kube.workloads import ScaleInfo, WorkloadRef
from predictive_scaler.policy.planner import ClusterState, Decision
from predictive_scaler.policy.saturation import ServingHistory
from predictive_scaler.series import Series
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.demand import demand_history, pull_serving, serving_queries
from predictive_scaler.sources.history import PrometheusMetrics
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import MAX_RECENT_WINDOW_SECONDS, ScalerSpec, Toleration


@dataclass(frozen=True)
class ScalerRef:
    """Which PredictiveScaler a port works for (owner of its placeholder, subject of its Events)."""

    name: str
    namespace: str
    uid: str

    def involved_object(self) -> dict[str, Any]:
        return {"apiVersion": manifests.API_VERSION, "kind": manifests.KIND, "name": self.name,
                "namespace": self.namespace, "uid": self.uid}

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"


# -- cluster ----------------------------------------------------------------------------------

def toleration_dict(t: Toleration) -> dict[str, str]:
    """A spec toleration in the Pod API's shape (unset fields left out; empty effect = all)."""
    out: dict[str, str] = {"operator": t.operator}
    if t.key is not None:
        out["key"] = t.key
    if t.value is not None:
        out["value"] = t.value
    if t.effect:
        out["effect"] = t.effect
    return out


def label_selector(labels: Mapping[str, str]) -> str | None:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None


class KubeClusterPort:
    """ClusterPort for one scaler. Build one per reconcile: it remembers what :meth:`observe` read
    (the Scale's resourceVersion, the placeholder) so :meth:`apply` writes against it."""

    def __init__(self, kube: KubeCluster, scaler: ScalerRef, spec: ScalerSpec,
                 cache: ClusterCache | None = None) -> None:
        self.kube = kube
        self.scaler = scaler
        self.spec = spec
        #: The watch-fed cache (pods, nodes, HPAs, ScaledObjects); None: read the API directly.
        self.cache = cache
        #: Set by observe() when the cache was stale: apply() then never scales the target down.
        self.stale: tuple[str, ...] = ()
        #: What apply() kept because the cache was stale (replicas it did not scale down to), for the status.
        self.held_down: int | None = None
        self.scale: ScaleInfo | None = None
        self.placeholder: PlaceholderInfo | None = None
        self.observed: ClusterState | None = None

    @property
    def target(self) -> WorkloadRef:
        t = self.spec.target
        return WorkloadRef(api_version=t.api_version, kind=t.kind, name=t.name, namespace=self.scaler.namespace)

    @property
    def placeholder_spec(self) -> PlaceholderSpec:
        prewarm = self.spec.prewarm
        return PlaceholderSpec(
            scaler_name=self.scaler.name, namespace=self.scaler.namespace, owner_uid=self.scaler.uid,
            gpus_per_pod=self.spec.gpus_per_replica, priority_class=prewarm.priority_class_name,
            image=prewarm.image or manifests.PLACEHOLDER_IMAGE, node_selector=dict(prewarm.node_selector),
            tolerations=[toleration_dict(t) for t in prewarm.tolerations],
            affinity=self.spec.to_dict()["prewarm"].get("affinity"), node_pool=prewarm.node_pool,
            do_not_disrupt=prewarm.do_not_disrupt,
        )

    def conflicts(self) -> tuple[ConflictingAutoscaler, ...]:
        if self.cache is not None and self.cache.fresh(HPAS, SCALED_OBJECTS):
            return self.cache.conflicts(self.target)
        return self.kube.list_conflicting_autoscalers(self.target)  # no cache, or stale: ask the server

    def check_placeholder_priority(self) -> None:
        """Refuse (ConfigError) a placeholder PriorityClass that is missing or not negative: placeholder
        pods at priority ≥ 0 would preempt real workloads instead of yielding to them."""
        name = self.spec.prewarm.priority_class_name
        value = self.kube.priority_class_value(name)
        key = "spec.prewarm.priorityClassName"
        if value is None:
            raise ConfigError(
                f"{key}: PriorityClass {name!r} does not exist in the cluster; create it with a negative value "
                "(deploy/base/priorityclass.yaml creates predictive-scaler-placeholder at -10) or name an existing "
                "negative-priority class — no placeholder is created until then", field=key)
        if value >= 0:
            raise ConfigError(
                f"{key}: PriorityClass {name!r} has value {value}, not a negative one: placeholder pods under it "
                "would preempt real pods instead of yielding to them; use a negative-priority class such as "
                "predictive-scaler-placeholder (deploy/base/priorityclass.yaml)", field=key)

    def observe(self, now: datetime) -> ClusterState:
        target = self.target
        self.scale = self.kube.get_scale(target)
        cache = self.cache
        self.stale = () if cache is None else tuple(
            r for r in (PODS, NODES) if not cache.fresh(r))
        if self.scale.selector:
            if cache is not None and PODS not in self.stale:
                pods = cache.pod_counts(target.namespace, self.scale.selector)
            else:
                pods = self.kube.list_pods(target.namespace, self.scale.selector)
            ready, starting = pods.ready, pods.starting
        else:
            # A custom kind without labelSelectorPath: its /scale status is all we know.
            ready, starting = self.scale.status_replicas, max(0, self.scale.replicas - self.scale.status_replicas)
        self.placeholder = self.kube.get_placeholder(self.scaler.name, self.scaler.namespace)
        free = 0
        if self.spec.prewarm.enabled:
            if cache is None:
                free = self.kube.list_gpu_nodes(label_selector(self.spec.prewarm.node_selector)).free_gpus
            elif not self.stale:
                free = cache.gpu_capacity(self.spec.prewarm.node_selector).free_gpus
            # else: free GPUs unknown on a stale cache — none are granted to new placeholders
        self.observed = ClusterState(
            desired_replicas=self.scale.replicas, ready_replicas=ready, starting_replicas=starting,
            placeholder_gpus=self.placeholder.gpus if self.placeholder else 0, free_gpus=free,
            placeholder_bound_gpus=self._placeholder_bound_gpus(),
        )
        return self.observed

    def _placeholder_bound_gpus(self) -> int:
        """GPUs the placeholder's pods hold on nodes: its pods less those the scheduler could not place
        (the status says where the prewarmed capacity is, not only how much was asked for)."""
        held = self.placeholder
        if held is None or held.replicas <= 0:
            return 0
        selector = label_selector(manifests.placeholder_labels(self.scaler.name)) or ""
        if self.cache is not None and PODS not in self.stale:
            pods = self.cache.pod_counts(self.scaler.namespace, selector)
        else:
            pods = self.kube.list_pods(self.scaler.namespace, selector)
        bound = pods.ready + pods.starting - pods.unscheduled
        return max(0, min(held.replicas, bound)) * held.gpus_per_pod

    def apply(self, decision: Decision, now: datetime) -> None:
        """Scale the target, then size (or remove) the placeholder. Raises ClusterError."""
        target = self.target
        desired = decision.desired_replicas
        self.held_down = None
        if self.stale and self.scale is not None and desired < self.scale.replicas:
            # Decided on a stale cache: never scale down (the pods it counted may be gone or new).
            self.held_down, desired = desired, self.scale.replicas
        if self.scale is None or desired != self.scale.replicas:
            self.scale = self.kube.patch_scale(target, desired, current=self.scale)
        gpr = self.spec.gpus_per_replica
        pods = decision.placeholder_gpus // gpr if self.spec.prewarm.enabled else 0
        if pods > 0:
            self.placeholder = self.kube.ensure_placeholder(self.placeholder_spec, pods)
        elif self.placeholder is not None:
            if self.spec.prewarm.enabled:
                if self.placeholder.replicas:
                    # Kept at 0 rather than deleted: cheaper than delete/create churn at every peak.
                    self.placeholder = self.kube.ensure_placeholder(self.placeholder_spec, 0)
            else:
                self.remove_placeholder()

    def remove_placeholder(self) -> bool:
        """Delete the placeholder (forecast-only, prewarm off, refused); True when one was removed."""
        removed = self.kube.delete_placeholder(self.scaler.name, self.scaler.namespace)
        self.placeholder = None
        return removed


# -- model ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Held:
    loaded: LoadedModel
    version: str
    sha256: str
    file_key: tuple[int, int]


class StoreModelPort:
    """ModelPort over one model name of the store (or a pinned version).

    Call :meth:`refresh` once per reconcile, before the step: it is cheap (one
    small pointer file and one ``stat``) and only re-verifies when something
    changed. The loaded model is a cache; the store is the record.
    """

    def __init__(self, store: ModelStorage, name: str, *, horizon_seconds: int, quantile: float,
                 pinned_version: str | None = None, expected_series: str | None = None) -> None:
        self.store = store
        self.name = name
        self.horizon_seconds = horizon_seconds
        self.quantiles = tuple(sorted({0.5, float(quantile)}))
        self.pinned_version = pinned_version
        self.expected_series = expected_series
        self._held: _Held | None = None
        #: Why the model in use is not the serving one, or why there is none (for the status).
        self.problem: str | None = None
        self.loads = 0

    @property
    def version(self) -> str | None:
        return None if self._held is None else self._held.version

    @property
    def step_seconds(self) -> int | None:
        return None if self._held is None else int(self._held.loaded.model.step_seconds)

    @property
    def model(self) -> FittedModel | None:
        return None if self._held is None else self._held.loaded.model

    @property
    def window_steps(self) -> int | None:
        """How many recent steps the reconciler pulls for the model: what it reads (``recent.tail(window_steps)``,
        one day for the two-stage ARIMA, more than a week for a combination whose online weights score its
        members over the last day), up to :data:`MAX_RECENT_WINDOW_SECONDS` — so the forecast is the one
        the backtest makes from all of history, from no more than the model reads. None (no model, or one
        that does not say how much it reads): the default window."""
        model = self.model
        steps = getattr(model, "window_steps", None)
        if model is None or not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            return None
        return min(steps, MAX_RECENT_WINDOW_SECONDS // int(model.step_seconds))

    @property
    def trained_until(self) -> datetime | None:
        if self._held is None:
            return None
        return self._held.loaded.manifest.window.end.to_pydatetime()

    def refresh(self) -> None:
        """Follow the serving pointer; verify a new or changed artifact before using it."""
        try:
            version, sha = self._wanted()
            file_key = self._file_key(version)
        except ModelError as exc:
            self._refused(None, str(exc))
            return
        held = self._held
        if held is not None and (held.version, held.sha256, held.file_key) == (version, sha, file_key):
            return
        try:
            loaded = self.store.load(self.name, version, expected_series=self.expected_series)
            if sha and loaded.manifest.sha256 != sha:
                raise ModelError(f"model {self.name!r}: version {version} differs from what was promoted "
                                 "(sha256 mismatch); roll back with `predictive-scaler models rollback`")
        except (ModelError, ConfigError) as exc:
            self._refused(version, str(exc))
            return
        self.loads += 1
        self._held = _Held(loaded, version, loaded.manifest.sha256, file_key)
        self.problem = None

    def _refused(self, version: str | None, why: str) -> None:
        held = self._held
        if held is not None and version is not None and version != held.version:
            # A bad new version: the one verified before is still trustworthy.
            self.problem = (f"model {self.name!r} version {version} was refused ({why}); still serving "
                            f"{held.version}")
            return
        self._held = None  # the version in use changed under us, or nothing is serving
        self.problem = why

    def _wanted(self) -> tuple[str, str]:
        if self.pinned_version is not None:
            check_model_name(self.pinned_version, what="pinned version")
            return self.pinned_version, ""
        pointer = self.store.pointer(self.name)
        if pointer is None:
            where = self.store.location
            raise ModelError(f"model {self.name!r} has no serving version in {where}; train one with "
                             f"`predictive-scaler train --out {where} --name {self.name}` (the scaler "
                             "scales reactively until then)")
        return pointer.version, pointer.sha256

    def _file_key(self, version: str) -> tuple[int, int]:
        if not isinstance(self.store, ModelStore):
            # An object store's versions are written once and never rewritten (conditional creates):
            # the version and the sha256 the pointer names say all there is to say.
            return (0, 0)
        path = self.store.version_dir(self.name, version) / MODEL_FILE
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ModelError(f"model {self.name!r} version {version}: {path} is missing ({exc.strerror}); "
                             "promote another version or retrain") from exc
        return st.st_mtime_ns, st.st_size

    def forecast(self, recent: Series, now: datetime) -> Forecast:
        held = self._held
        if held is None:
            raise ModelError(self.problem or f"model {self.name!r} is not loaded")
        model = held.loaded.model
        step = int(model.step_seconds)
        if self.horizon_seconds % step:
            raise ModelError(f"horizonSeconds {self.horizon_seconds} is not a multiple of the model's "
                             f"{step}s step; choose a multiple of {step}")
        return model.forecast(recent, self.horizon_seconds // step, self.quantiles)


# -- metrics ----------------------------------------------------------------------------------


class PrometheusMetricsPort:
    """MetricsPort for one scaler: its demand query (or the DCGM busy-GPU sum) on Prometheus."""

    def __init__(self, metrics: PrometheusMetrics, *, source: PrometheusSource | None = None,
                 spec: ScalerSpec | None = None, namespace: str | None = None,
                 labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS) -> None:
        self.metrics = metrics
        self.source, self.spec, self.namespace, self.labels = source, spec, namespace, labels
        self._serving: tuple[tuple[int, timedelta], ServingHistory] | None = None

    @classmethod
    def for_spec(cls, source: PrometheusSource, spec: ScalerSpec, namespace: str,
                 labels: dcgm.DcgmLabels = dcgm.DEFAULT_LABELS) -> PrometheusMetricsPort:
        # The one definition of the scaler's demand history, shared with the retraining job.
        history = demand_history(spec, namespace, labels)
        return cls(PrometheusMetrics(source, history.query, max_age=history.max_age,
                                     freshness_query=history.freshness_query, name=history.name),
                   source=source, spec=spec, namespace=namespace, labels=labels)

    def serving_history(self, now: datetime, window: timedelta) -> ServingHistory:
        """The workload's served rate, GPUs, mean GPU utilisation and mean latency over ``(now - window, now]``
        on the model grid (the serving queries of ``sources/demand.py`` and DCGM's GPUs), pulled once per model
        step: the check it feeds changes no faster than that. SourceError when it cannot be had."""
        if self.source is None or self.spec is None or self.namespace is None:
            raise SourceError("no serving history: this metrics port was built without its spec")
        spec = self.spec
        if serving_queries(spec, self.namespace, self.labels) is None:
            raise SourceError("no serving history: set demand.preset, or demand.servedQuery and latencyQuery")
        step = spec.model.step_seconds
        key = (int(now.timestamp()) // step, window)
        if self._serving is not None and self._serving[0] == key:
            return self._serving[1]
        try:
            got = pull_serving(self.source, spec, self.namespace, now - window, now, labels=self.labels,
                               step_seconds=step)
        except (ConfigError, DataError) as exc:
            raise SourceError(f"serving history unavailable ({exc})") from exc
        if got.gpu_util is None:
            raise SourceError("serving history unavailable: DCGM reported no GPU utilisation for the workload")
        gpus = got.replicas.values * spec.gpus_per_replica
        history = ServingHistory(
            throughput=dataclasses.replace(got.served, values=got.served.values * got.replicas.values),
            gpus=dataclasses.replace(got.replicas, values=gpus), utilisation=got.gpu_util, latency=got.mean_latency)
        self._serving = (key, history)
        return history

    def demand_now(self, now: datetime) -> DemandSample:
        sample = self.metrics.demand_now(now)
        if not math.isfinite(sample.value):
            # Missing is never 0: the planner holds on a SourceError and says why.
            raise SourceError(sample.missing_reason or f"query {self.metrics.demand_query!r} returned no number")
        return DemandSample(value=float(sample.value), observed_at=sample.observed_at)

    def recent(self, now: datetime, window: timedelta, step_seconds: int) -> Series:
        """The model-step history, pulled at one minute and averaged into model steps.

        A user's demand query has a short range (``[2m]``) chosen for *now*; evaluated
        once per 5-minute step it would sample 2 of every 5 minutes. Pulled every
        minute and averaged (``sources/demand.py``), each model step is the mean
        demand over the step, exactly as the retraining job pulls what the model
        learns from (and as the backtest replays it).
        """
        return self.metrics.recent(now, window, step_seconds)
