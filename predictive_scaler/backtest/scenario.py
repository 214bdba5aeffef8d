"""Backtest scenarios: one YAML file = one cluster, one protocol, one scaler spec.

A scenario names a node-autoscaler preset (``karpenter`` or
``cluster-autoscaler``, see ``simulator.PRESETS``) and may override any lead time; the
``spec`` section is the PredictiveScaler spec (camelCase, as in the CRD) the
predictive policy runs with. Every field is validated when the file is read,
and errors name the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from predictive_scaler.backtest.simulator import PRESETS, ClusterConfig
from predictive_scaler.errors import ConfigError, DataError, did_you_mean
from predictive_scaler.forecasting import registry
from predictive_scaler.series import format_duration, parse_duration
from predictive_scaler.spec import (
    DEFAULT_MODEL_STEP,
    MAX_COST_PER_HOUR,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_PRICE_PER_GPU_HOUR,
    MAX_REPLICAS,
    MAX_REQUESTS_PER_REPLICA,
    MIN_REQUESTS_PER_REPLICA,
    LeadTimes,
    ScalerSpec,
    field_bounds,
    number_text,
)
from predictive_scaler.yaml_input import excerpt

#: Every policy the harness knows, in the order reports list them.
POLICIES: tuple[str, ...] = ("predictive", "reactive", "static", "holt-winters", "oracle")
#: Shortest evaluated span a backtest reports on (``evaluation``, ``--evaluation``).
MIN_EVALUATION = timedelta(hours=1)
#: Longest span a demand value may be "per" (``demand_unit_seconds``): a count per week.
MAX_DEMAND_UNIT_SECONDS = 7 * 86400
#: Longest a simulated node may take to start: the spec's longest node lead time.
MAX_NODE_START_S = field_bounds(LeadTimes, "node_start_seconds")[1]

_DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "backtests" / "default.yaml"


@dataclass(frozen=True)
class MeasurementChain:
    """How demand reaches every policy but the oracle: as the controller's demand query returns it.

    The controller does not see each minute's demand: it reads ``rate(counter[window])`` of counters
    scraped every ``scrape_interval_s``, evaluated ``delay`` after its reconcile time (the cluster's
    ``metrics_delay_s``; the reconcile interval is the scenario's ``control_period``). So at reconcile
    time ``t`` it sees the mean demand over the window ending at the last scrape at or before
    ``t − delay`` (:meth:`signal`). A trace coarser than the window holds no detail inside its steps:
    the window is widened to one trace step (:meth:`window_for`), so a value is never finer than the
    trace and never reads past the scrape. ``exact`` hands each trace step's value over ``delay`` late
    instead — a signal no controller gets, kept only to compare with.
    """

    #: Seconds between two scrapes of the demand counters (Prometheus' common 30 s).
    scrape_interval_s: int = 30
    #: The query's range, e.g. 120 for ``rate(...[2m])`` as the shipped examples use.
    rate_window_s: int = 120
    #: Hand the policies each trace step's exact value instead (comparison only).
    exact: bool = False

    def __post_init__(self) -> None:
        for name in ("scrape_interval_s", "rate_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
                raise ConfigError(f"measurement.{name.removesuffix('_s')} must be whole seconds, got {excerpt(value)}",
                                  field=f"measurement.{name.removesuffix('_s')}")
        if not 1 <= self.scrape_interval_s <= 600:
            raise ConfigError(f"measurement.scrape_interval must be in 1s..10m, got {self.scrape_interval_s}s",
                              field="measurement.scrape_interval")
        if not 2 * self.scrape_interval_s <= self.rate_window_s <= 3600:
            # rate() needs two samples inside its range, else Prometheus answers an empty result.
            raise ConfigError(
                f"measurement.rate_window {self.rate_window_s}s must cover at least two scrapes "
                f"({2 * self.scrape_interval_s}s) and at most 1h", field="measurement.rate_window")

    def window_for(self, trace_step_s: int) -> int:
        """The window the chain averages over on a trace of this step: at least one trace step."""
        return max(int(self.rate_window_s), int(trace_step_s))

    def lag_for(self, trace_step_s: int) -> int:
        """Seconds after a change in demand until a value stamped ``t − delay`` shows it in full:
        the window, plus the scrape the value may be behind its stamp."""
        return self.window_for(trace_step_s) + int(self.scrape_interval_s)

    def signal(self, values: np.ndarray, start_s: float, step_s: int, times_s: np.ndarray,
               delay_s: float) -> np.ndarray:
        """Per time in ``times_s`` (epoch seconds), the demand the policies see (NaN = none).

        ``values`` hold during their trace step (``step_s`` from ``start_s``; NaN = a gap). The chain's
        value is the mean of the known demand over ``[s − window, s]``, ``s`` the last scrape at or
        before ``t − delay`` (scrapes on the epoch's ``scrape_interval`` grid); NaN when the step the
        scrape closes is a gap (a series that stopped is absent, not 0) or nothing is known yet.
        """
        return self.sampler(values, start_s, step_s, delay_s)(times_s)

    def sampler(self, values: np.ndarray, start_s: float, step_s: int,
                delay_s: float) -> Callable[[np.ndarray], np.ndarray]:
        """:meth:`signal` for one trace, its running sums computed once (for one call per reconcile)."""
        v = np.asarray(values, dtype=float)
        n = v.size
        known = np.isfinite(v)
        rate = np.where(known, v, 0.0)
        cover = known.astype(float)
        sums = np.concatenate([[0.0], np.cumsum(rate * step_s)])
        covered = np.concatenate([[0.0], np.cumsum(cover * step_s)])
        window, scrape = self.window_for(step_s), self.scrape_interval_s

        def integral(cum: np.ndarray, per_second: np.ndarray, at: np.ndarray) -> np.ndarray:
            clipped = np.clip(at, 0.0, n * step_s)
            i = np.minimum((clipped // step_s).astype(np.int64), n - 1)
            return cum[i] + per_second[i] * (clipped - i * step_s)

        def at(times_s: np.ndarray) -> np.ndarray:
            t = np.asarray(times_s, dtype=float) - float(delay_s)
            out = np.full(t.shape, np.nan)
            if n == 0:
                return out
            if self.exact:
                idx = np.floor((t - start_s) / step_s).astype(np.int64)
                ok = (idx >= 0) & (idx < n)
                out[ok] = v[idx[ok]]
                return out
            end = np.floor(t / scrape) * scrape - start_s
            begin = end - window
            total = integral(sums, rate, end) - integral(sums, rate, begin)
            seen = integral(covered, cover, end) - integral(covered, cover, begin)
            last = np.clip(np.ceil(end / step_s - 1e-9).astype(np.int64) - 1, 0, n - 1)  # the step the scrape closes
            ok = (end > 0) & (end <= n * step_s) & (seen > 0) & known[last]
            out[ok] = total[ok] / seen[ok]
            return out

        return at

    def to_dict(self) -> dict[str, Any]:
        return {"scrape_interval": format_duration(timedelta(seconds=self.scrape_interval_s)),
                "rate_window": format_duration(timedelta(seconds=self.rate_window_s)), "exact": self.exact}

    @classmethod
    def from_dict(cls, data: Any) -> MeasurementChain:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError("measurement must be a mapping of scrape_interval, rate_window, exact",
                              field="measurement")
        _names(data, "measurement")
        bad = sorted(set(data) - {"scrape_interval", "rate_window", "exact"})
        if bad:
            raise ConfigError(f"measurement: unknown setting(s) {', '.join(bad)}; known: scrape_interval, "
                              "rate_window, exact (the delay is cluster.metrics_delay_s, the reconcile interval "
                              "control_period)", field=f"measurement.{bad[0]}")
        kw: dict[str, Any] = {}
        for key in ("scrape_interval", "rate_window"):
            if key in data:
                seconds = _duration(data[key], f"measurement.{key}").total_seconds()
                if seconds != int(seconds):
                    raise ConfigError(f"measurement.{key} must be whole seconds, got {seconds}s",
                                      field=f"measurement.{key}")
                kw[f"{key}_s"] = int(seconds)
        if "exact" in data:
            if not isinstance(data["exact"], bool):
                raise ConfigError(f"measurement.exact must be true or false, got {excerpt(data['exact'])}",
                                  field="measurement.exact")
            kw["exact"] = data["exact"]
        return cls(**kw)


@dataclass(frozen=True)
class Scenario:
    """Everything a backtest run depends on besides the trace."""

    #: Short name printed in reports.
    name: str = "default"
    #: Node autoscaler preset the lead times come from.
    preset: str = "karpenter"
    #: The simulated cluster (preset values with the file's overrides applied).
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig.preset("karpenter"))
    #: How often every policy acts (the controller's reconcile period).
    control_period: timedelta = timedelta(seconds=60)
    #: How demand reaches every policy but the oracle (scrape interval, rate() window; the delay is
    #: ``cluster.metrics_delay_s``, the reconcile interval ``control_period``).
    measurement: MeasurementChain = field(default_factory=MeasurementChain)
    #: Size demand so the P95 of the training window needs this many replicas.
    peak_replicas: int | None = 10
    #: Or give the capacity of one replica in the trace's unit (wins over peak_replicas).
    capacity_per_replica: float | None = None
    #: Upper clamp of every autoscaling policy; default 2 × peak replicas.
    max_replicas: int | None = None
    #: Lower clamp of every autoscaling policy.
    min_replicas: int = 1
    #: Training window; None = 14 days (7 days for traces shorter than 21 days).
    training: timedelta | None = None
    #: Retrain (and maybe promote) this often during the walk-forward.
    retrain_every: timedelta = timedelta(days=7)
    #: Cap on the evaluated span after the training window (None = to the end of the trace).
    evaluation: timedelta | None = None
    #: Forecast quantile the planner provisions for.
    quantile: float = 0.95
    #: Horizons reported per forecaster.
    horizons: tuple[timedelta, ...] = (timedelta(minutes=10), timedelta(minutes=20), timedelta(minutes=30))
    #: Candidate model kinds the weekly training chooses from (default: the retraining job's).
    forecasters: tuple[str, ...] = registry.DEFAULT_CANDIDATES
    #: HPA target: the share of a replica's capacity the reactive policy aims at.
    target_utilization: float = 0.8
    #: The predictive policy's own planning target (share of a replica's capacity it plans on, its
    #: counterfactual HPA rule included); None = ``target_utilization``. Its frontier knob.
    predictive_target_utilization: float | None = None
    #: Seconds a demand value is "per" (60 = requests per minute) — for unserved requests.
    demand_unit_seconds: float = 60.0
    #: Policies to run side by side.
    policies: tuple[str, ...] = POLICIES
    #: PredictiveScaler spec (camelCase CRD shape) for the predictive policy.
    spec: dict[str, Any] = field(default_factory=dict)
    #: Several predictive scalers sharing one cluster budget (backtest/fleet.py): each a mapping with a
    #: ``name`` and optionally ``peak_replicas`` and a ``spec`` laid over the scenario's. Empty: one scaler.
    scalers: tuple[dict[str, Any], ...] = ()
    #: The cluster-wide speculative budget the scalers share: ``maxGpus`` and/or ``maxCostPerHour``.
    cluster_budget: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {excerpt(self.preset)}; {did_you_mean(self.preset, PRESETS)}choose one of "
                              f"{', '.join(sorted(PRESETS))}", field="preset")
        cp = self.control_period.total_seconds()
        if cp < 1 or cp != int(cp) or cp > 600:
            raise ConfigError(f"control_period must be whole seconds in 1s..10m, got {cp}s", field="control_period")
        # In this order, so that a scenario with several faults always names the same one first.
        self._check_replicas()
        self._check_windows()
        self._check_planning()
        self._check_names()

    def _check_replicas(self) -> None:
        if self.capacity_per_replica is None and self.peak_replicas is None:
            raise ConfigError("give peak_replicas or capacity_per_replica to turn demand into replicas", field="peak_replicas")
        if self.capacity_per_replica is not None and not (math.isfinite(self.capacity_per_replica) and self.capacity_per_replica > 0):
            raise ConfigError(f"capacity_per_replica must be > 0, got {self.capacity_per_replica}", field="capacity_per_replica")
        if self.capacity_per_replica is not None and not (
                MIN_REQUESTS_PER_REPLICA <= self.capacity_per_replica <= MAX_REQUESTS_PER_REPLICA):
            # The spec's own bounds on requestsPerReplica, which this becomes.
            raise ConfigError(f"capacity_per_replica must be in [{MIN_REQUESTS_PER_REPLICA:g}, "
                              f"{MAX_REQUESTS_PER_REPLICA:g}] (demand one replica serves, in the trace's unit), got "
                              f"{self.capacity_per_replica:g}; check the trace's unit", field="capacity_per_replica")
        if self.peak_replicas is not None and self.peak_replicas < 1:
            raise ConfigError(f"peak_replicas must be ≥ 1, got {self.peak_replicas}", field="peak_replicas")
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas):
            raise ConfigError(f"max_replicas ({self.max_replicas}) must be ≥ min_replicas ({self.min_replicas}) and ≥ 1", field="max_replicas")
        if self.min_replicas < 0:
            raise ConfigError(f"min_replicas must be ≥ 0, got {self.min_replicas}", field="min_replicas")

    def _check_windows(self) -> None:
        if self.evaluation is not None and self.evaluation < MIN_EVALUATION:
            raise ConfigError(
                f"evaluation {_span(self.evaluation)} is too short to report on; give at least "
                f"{format_duration(MIN_EVALUATION)} (e.g. 7d), or null to walk forward to the end of the trace",
                field="evaluation")
        if self.training is not None and self.training < timedelta(days=1):
            raise ConfigError(f"training window {_span(self.training)} is too short; give at least 7d (14d "
                              "recommended)", field="training")
        if self.retrain_every < timedelta(hours=1):
            raise ConfigError(f"retrain_every {self.retrain_every} is too short; weekly (7d) is the default", field="retrain_every")

    def _check_planning(self) -> None:
        if not 0.5 <= self.quantile < 1:
            raise ConfigError(f"quantile must be in [0.5, 1), got {self.quantile}", field="quantile")
        if not 0.1 <= self.target_utilization <= 1:
            raise ConfigError(f"target_utilization must be in [0.1, 1], got {self.target_utilization}", field="target_utilization")
        if self.predictive_target_utilization is not None and not 0.1 <= self.predictive_target_utilization <= 1:
            raise ConfigError(f"predictive_target_utilization must be in [0.1, 1], got "
                              f"{self.predictive_target_utilization}", field="predictive_target_utilization")
        if self.capacity_per_replica is not None:
            planned = self.capacity_per_replica * min(self.planning_utilization, self.target_utilization)
            if planned < MIN_REQUESTS_PER_REPLICA:  # what spec.capacity.requestsPerReplica becomes
                raise ConfigError(
                    f"capacity_per_replica {self.capacity_per_replica:g} planned at a target utilisation of "
                    f"{min(self.planning_utilization, self.target_utilization):g} is {planned:g} per replica, below "
                    f"the {MIN_REQUESTS_PER_REPLICA:g} a replica may serve (spec.capacity.requestsPerReplica); check "
                    "the trace's unit", field="capacity_per_replica")
        if self.demand_unit_seconds <= 0:
            raise ConfigError("demand_unit_seconds must be > 0 (60 for a per-minute rate)", field="demand_unit_seconds")
        if self.demand_unit_seconds > MAX_DEMAND_UNIT_SECONDS:
            raise ConfigError(f"demand_unit_seconds {self.demand_unit_seconds:g} is more than a week "
                              f"({MAX_DEMAND_UNIT_SECONDS}); give the seconds a value is per (60 for a per-minute rate)",
                              field="demand_unit_seconds")

    def _check_names(self) -> None:
        """The policies, forecasters and horizons: known ones, and at least one of each list."""
        for p in self.policies:
            if p not in POLICIES:
                raise ConfigError(f"unknown policy {excerpt(p)}; {did_you_mean(p, POLICIES)}choose from "
                                  f"{', '.join(POLICIES)}", field="policies")
        kinds = registry.FORECASTER_KINDS
        for k in self.forecasters:
            if k not in kinds:
                raise ConfigError(f"forecasters: unknown forecaster {excerpt(k)}; {did_you_mean(k, kinds)}"
                                  f"choose from {', '.join(kinds)}", field="forecasters")
        if not self.forecasters:
            raise ConfigError(f"forecasters: none given; choose from {', '.join(kinds)}",
                              field="forecasters")
        if not self.policies:
            raise ConfigError(f"no policies; choose from {', '.join(POLICIES)}", field="policies")
        for h in self.horizons:
            if not timedelta(minutes=5) <= h <= timedelta(minutes=60):
                raise ConfigError(f"horizon {format_duration(h)} is outside 5m..60m", field="horizons")

    @property
    def control_period_s(self) -> int:
        return int(self.control_period.total_seconds())

    @property
    def planning_utilization(self) -> float:
        """The predictive policy's planning target (its own, else the reactive peer's)."""
        if self.predictive_target_utilization is not None:
            return self.predictive_target_utilization
        return self.target_utilization

    def resolved_max_replicas(self, peak_replicas: int) -> int:
        return self.max_replicas if self.max_replicas is not None else max(2 * peak_replicas, self.min_replicas, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "preset": self.preset,
            "cluster": self.cluster.to_dict(),
            "control_period": format_duration(self.control_period),
            "measurement": self.measurement.to_dict(),
            "peak_replicas": self.peak_replicas,
            "capacity_per_replica": self.capacity_per_replica,
            "max_replicas": self.max_replicas,
            "min_replicas": self.min_replicas,
            "training": format_duration(self.training) if self.training else None,
            "retrain_every": format_duration(self.retrain_every),
            "evaluation": format_duration(self.evaluation) if self.evaluation else None,
            "quantile": self.quantile,
            "horizons": [format_duration(h) for h in self.horizons],
            "forecasters": list(self.forecasters),
            "target_utilization": self.target_utilization,
            "predictive_target_utilization": self.predictive_target_utilization,
            "demand_unit_seconds": self.demand_unit_seconds,
            "policies": list(self.policies),
            "spec": self.spec,
            # Only a fleet scenario says so (a one-scaler scenario's JSON stays as it was).
            **({"scalers": list(self.scalers), "cluster_budget": self.cluster_budget} if self.scalers else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, name: str = "scenario") -> Scenario:
        if not isinstance(data, dict):
            raise ConfigError(f"scenario {name}: expected a mapping of settings, got {type(data).__name__}")
        _names(data, f"scenario {name}")
        data = _events_into_spec(data)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"scenario {name}: unknown setting(s) {', '.join(unknown)}; {did_you_mean(unknown[0], known)}"
                f"known: {', '.join(sorted(known))}",
                field=unknown[0],
            )
        kw: dict[str, Any] = {"name": str(data.get("name", name))}
        preset = str(data.get("preset", "karpenter"))
        kw["preset"] = preset
        kw["cluster"] = _cluster_config(data.get("cluster") or {}, preset)
        kw.update(_typed_settings(data))
        if "spec" in data:
            if not isinstance(data["spec"], dict):
                raise ConfigError("spec must be a mapping (the PredictiveScaler spec, camelCase)", field="spec")
            kw["spec"] = dict(data["spec"])
        if data.get("scalers"):
            kw["scalers"] = tuple(_scaler(x, i) for i, x in enumerate(_list(data["scalers"], "scalers")))
            names = [x["name"] for x in kw["scalers"]]
            if len(set(names)) != len(names):
                raise ConfigError(f"scalers: names must differ, got {', '.join(names)}", field="scalers")
        if data.get("cluster_budget") is not None:
            kw["cluster_budget"] = _cluster_budget(data["cluster_budget"])
        return cls(**kw)


def _cluster_config(cluster: Any, preset: str) -> ClusterConfig:
    """The scenario's ``cluster`` section: the preset's simulator with the settings it overrides."""
    if not isinstance(cluster, dict):
        raise ConfigError("cluster must be a mapping of simulator settings", field="cluster")
    _names(cluster, "cluster")
    bad = sorted(set(cluster) - set(ClusterConfig.__dataclass_fields__))
    if bad:
        raise ConfigError(
            f"cluster: unknown setting(s) {', '.join(bad)}; {did_you_mean(bad[0], ClusterConfig.__dataclass_fields__)}"
            f"known: {', '.join(ClusterConfig.__dataclass_fields__)}",
            field=f"cluster.{bad[0]}",
        )
    overrides = {k: (_seconds(v, f"cluster.{k}") if k.endswith("_s") else v) for k, v in cluster.items()}
    try:
        config = ClusterConfig.preset(preset, **overrides)
    except TypeError as exc:
        raise ConfigError(f"cluster: {exc}", field="cluster") from exc
    check_cluster(config)
    return config


def check_cluster(config: ClusterConfig) -> None:
    """The simulated cluster within what the spec it becomes allows (each setting named as the scenario
    writes it, not as the spec field it turns into)."""
    for key in ("gpus_per_node", "gpus_per_replica"):
        if getattr(config, key) > MAX_GPUS_PER_NODE:
            raise ConfigError(f"cluster.{key} {getattr(config, key)} is more than the {MAX_GPUS_PER_NODE} GPUs a node "
                              "may have; give the GPUs of one node of the pool", field=f"cluster.{key}")
    if config.price_per_gpu_hour > MAX_PRICE_PER_GPU_HOUR:
        raise ConfigError(f"cluster.price_per_gpu_hour {config.price_per_gpu_hour:g} is more than the "
                          f"{MAX_PRICE_PER_GPU_HOUR:g} a GPU-hour may cost in any currency; give the price of one "
                          "GPU-hour", field="cluster.price_per_gpu_hour")
    if config.cold_start_s > MAX_NODE_START_S:
        parts = ("node_provision_s", "image_pull_s", "pod_start_s", "model_load_s")
        raise ConfigError(
            f"cluster: a cold start ({' + '.join(parts)}) takes {config.cold_start_s:g} s, more than the "
            f"{MAX_NODE_START_S:g} s (2h) a node may take to start (spec.leadTimes.nodeStartSeconds); check their "
            "units (seconds) and give each its real length", field="cluster.image_pull_s")


def _typed_settings(data: dict[str, Any]) -> dict[str, Any]:
    """The scalar and list settings ``data`` gives, each read as its type (durations, numbers, names)."""
    kw: dict[str, Any] = {}
    if "measurement" in data:
        kw["measurement"] = MeasurementChain.from_dict(data["measurement"])
    for key in ("control_period", "retrain_every"):
        if key in data:
            kw[key] = _duration(data[key], key)
    for key in ("training", "evaluation"):
        if data.get(key) not in (None, "auto"):
            kw[key] = _duration(data[key], key)
    for key in ("peak_replicas", "max_replicas", "min_replicas"):
        if key in data:
            kw[key] = None if data[key] is None else _int(data[key], key)
    for key in ("capacity_per_replica", "quantile", "target_utilization", "predictive_target_utilization",
                "demand_unit_seconds"):
        if key in data:
            kw[key] = None if data[key] is None else _float(data[key], key)
    if "horizons" in data:
        kw["horizons"] = tuple(_duration(h, "horizons") for h in _list(data["horizons"], "horizons"))
    for key in ("forecasters", "policies"):
        if key in data:
            kw[key] = tuple(str(x) for x in _list(data[key], key))
    return kw


def build_spec(scenario: Scenario, *, capacity: float, max_replicas: int, model_step: int,
               peak_factor: float = 1.0, trace_step: int = 60) -> ScalerSpec:
    """The scenario's ``spec`` section laid over what the simulated cluster implies.

    The planning capacity of a replica is ``capacity × target_utilization`` (the
    HPA target); lead times are the simulator's warm and cold start times; the
    intra-step peak factor is estimated from the training window
    (:func:`intra_step_peak_factor`).
    """
    cfg = scenario.cluster
    base: dict[str, Any] = {
        "target": {"name": "backtest"},
        # The scenario's spec may set its own intraStepPeakFactor; else the training window's.
        "demand": {"kind": "requests", "query": "trace replay", "intraStepPeakFactor": peak_factor},
        "capacity": {"requestsPerReplica": capacity * scenario.planning_utilization},
        # The predictive policy's reactive rule (fallback, counterfactual) at the peers' HPA target.
        "reactive": {"targetUtilization": min(1.0, scenario.target_utilization / scenario.planning_utilization)},
        "gpusPerReplica": cfg.gpus_per_replica,
        "minReplicas": scenario.min_replicas,
        "maxReplicas": max_replicas,
        "quantile": scenario.quantile,
        # At least two model steps: a forecast starts after the last step the metrics show, and
        # for the metrics delay after a step ends it is still the newest one, by then reaching
        # into its second step (a one-step horizon would be stale there).
        "horizonSeconds": min(3600, max(1800, 2 * model_step)),
        "controlPeriodSeconds": scenario.control_period_s,
        "leadTimes": {"podStartSeconds": int(math.ceil(cfg.warm_start_s)),
                      "nodeStartSeconds": int(math.ceil(cfg.cold_start_s))},
        "prewarm": {"enabled": True, "gpusPerNode": cfg.gpus_per_node,
                    "budget": {"pricePerGpuHour": cfg.price_per_gpu_hour}},
        "model": {"stepSeconds": model_step},
        "mode": "scale",
        # How long the chain's values take to show a change in full (they are stamped t − delay).
        "drift": {"signalLagSeconds": 0 if scenario.measurement.exact else min(7200, scenario.measurement.lag_for(trace_step))},
    }
    if scenario.max_replicas is None and max_replicas > MAX_REPLICAS:
        sized = ("peak_replicas" if scenario.capacity_per_replica is None else
                 f"the replicas the training window's P95 needs at capacity_per_replica {capacity:.4g} (with "
                 "--scaler, spec.capacity.requestsPerReplica)")
        raise ConfigError(
            f"spec.maxReplicas: must be at most {MAX_REPLICAS}, got {number_text(max_replicas)}: max_replicas is unset, so "
            f"it is 2 × {sized}; give a larger capacity per replica (is it in the trace's unit?) or a smaller "
            "peak_replicas, or set max_replicas", field="max_replicas")
    spec = ScalerSpec.from_dict(deep_merge(base, scenario.spec))
    check_delay(scenario, spec)
    return spec


def check_delay(scenario: Scenario, spec: ScalerSpec) -> None:
    """Refuse a metrics delay the spec cannot work with: demand that old is stale to the planner
    (``maxAgeSeconds``), and a forecast from it ends before the reconcile time."""
    delay = scenario.cluster.metrics_delay_s
    if delay > spec.demand.max_age_seconds:
        raise ConfigError(
            f"cluster.metrics_delay_s ({format_duration(timedelta(seconds=delay))}) is longer than "
            f"spec.demand.maxAgeSeconds ({spec.demand.max_age_seconds} s): every demand value the policies see would "
            "be stale, so the predictive policy could only hold; give the metric's real delay (30–90 s is common), "
            "or raise spec.demand.maxAgeSeconds if your metrics really arrive that late", field="cluster.metrics_delay_s")
    if delay >= spec.horizon_seconds:
        raise ConfigError(
            f"cluster.metrics_delay_s ({format_duration(timedelta(seconds=delay))}) is not shorter than "
            f"spec.horizonSeconds ({spec.horizon_seconds} s): a forecast from data that old ends before the time it "
            "is made; give the metric's real delay or a longer horizon", field="cluster.metrics_delay_s")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` laid on top, nested mappings merged key by key (``over`` wins)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _scaler(value: Any, i: int) -> dict[str, Any]:
    where = f"scalers[{i}]"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ConfigError(f"{where} must be a mapping with a name (and optionally peak_replicas, spec)", field=where)
    _names(value, where)
    bad = sorted(set(value) - {"name", "peak_replicas", "spec"})
    if bad:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(bad)}; known: name, peak_replicas, spec",
                          field=f"{where}.{bad[0]}")
    out: dict[str, Any] = {"name": value["name"], "spec": value.get("spec") or {}}
    if not isinstance(out["spec"], dict):
        raise ConfigError(f"{where}.spec must be a mapping (the PredictiveScaler spec, camelCase)", field=f"{where}.spec")
    if value.get("peak_replicas") is not None:
        out["peak_replicas"] = _int(value["peak_replicas"], f"{where}.peak_replicas")
    return out


def _cluster_budget(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not value or set(value) - {"maxGpus", "maxCostPerHour"}:
        raise ConfigError("cluster_budget must be a mapping of maxGpus and/or maxCostPerHour", field="cluster_budget")
    out: dict[str, Any] = {}
    if value.get("maxGpus") is not None:
        out["maxGpus"] = _int(value["maxGpus"], "cluster_budget.maxGpus")
    if value.get("maxCostPerHour") is not None:
        out["maxCostPerHour"] = _float(value["maxCostPerHour"], "cluster_budget.maxCostPerHour")
    for key, number in out.items():
        if number < 0:
            raise ConfigError(f"cluster_budget.{key} must be ≥ 0, got {excerpt(number)}", field=f"cluster_budget.{key}")
    # The spec's budget bounds: what every scaler's own budget may allow, at most.
    highest = {"maxGpus": MAX_GPUS, "maxCostPerHour": MAX_COST_PER_HOUR}
    for key, number in out.items():
        if number > highest[key]:
            raise ConfigError(f"cluster_budget.{key} must be at most {highest[key]:g}, got {number:g}",
                              field=f"cluster_budget.{key}")
    return out


def _events_into_spec(data: dict[str, Any]) -> dict[str, Any]:
    """A scenario's top-level ``events:`` is the spec's ``events`` (the same list the CRD takes)."""
    if "events" not in data:
        return data
    out = dict(data)
    events = out.pop("events")
    spec = out.get("spec") or {}
    if not isinstance(spec, dict):
        return out  # from_dict reports the bad spec section
    if "events" in spec:
        raise ConfigError("events: given both at the top of the scenario and in spec.events; keep one list",
                          field="events")
    out["spec"] = {**spec, "events": events}
    return out


def default_scenario_path() -> Path:
    """The scenario a backtest runs when none is given (``backtests/default.yaml``)."""
    return _DEFAULT_SCENARIO


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Read a scenario YAML file (default: ``backtests/default.yaml``)."""
    p = Path(path) if path is not None else _DEFAULT_SCENARIO
    if not p.exists():
        raise ConfigError(f"{p}: no such scenario file; give a YAML file such as backtests/default.yaml", field="scenario")
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory, not a scenario file; give a YAML file such as "
                          "backtests/default.yaml", field="scenario")
    from predictive_scaler.yaml_input import check_size, read_yaml_text

    try:
        text = read_yaml_text(p, what="a scenario", remedy="give a YAML file such as backtests/default.yaml",
                              field="scenario")  # a FIFO or a device is refused, never read
        data = check_size(yaml.safe_load(text), str(p), field="scenario") or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc}); fix the syntax", field="scenario") from exc
    except RecursionError as exc:
        raise ConfigError(f"{p}: nested too deeply to read; check that it is a scenario file", field="scenario") from exc
    except (UnicodeDecodeError, OSError) as exc:
        raise ConfigError(f"{p}: cannot be read as UTF-8 text ({exc}); give a YAML file such as "
                          "backtests/default.yaml", field="scenario") from exc
    except ValueError as exc:  # PyYAML's int() of a number longer than Python reads from text (4,300 digits)
        raise ConfigError(f"{p}: holds a number too long to read ({exc}); no setting needs more than a few digits — "
                          "check the file", field="scenario") from exc
    # Validate the spec section now (capacity and step are placeholders until a trace is read).
    try:
        scenario = Scenario.from_dict(data, name=p.stem)
        build_spec(scenario, capacity=1.0, max_replicas=scenario.resolved_max_replicas(scenario.peak_replicas or 1),
                   model_step=DEFAULT_MODEL_STEP)
    except ConfigError as exc:
        # Where (the file) and what to do, once, whatever setting refused.
        raise type(exc)(f"{p}: {exc}; fix it in the scenario file (backtests/default.yaml lists every setting "
                        "with its default)", field=exc.field) from exc
    return scenario


def _duration(value: Any, key: str, *, allow_zero: bool = False) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{key}: a duration must be a number of seconds or text such as 30s, 10m, 7d; got "
                          f"{excerpt(value)}", field=key)
    try:
        out = parse_duration(value)
    except (DataError, OverflowError) as exc:
        raise ConfigError(f"{key}: {exc}", field=key) from exc
    if out < timedelta(0) or (out == timedelta(0) and not allow_zero):
        raise ConfigError(f"{key}: {excerpt(value)} is not a positive duration; give one such as 30s, 10m or 7d",
                          field=key)
    return out


def _span(delta: timedelta) -> str:
    return format_duration(delta) if delta > timedelta(0) else f"{delta.total_seconds():g}s"


def _seconds(value: Any, key: str) -> float:
    return _duration(value, key, allow_zero=True).total_seconds()


def _int(value: Any, key: str) -> int:
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ConfigError(f"{key} must be a whole number, got {excerpt(value)}", field=key)
    return int(value)


def _float(value: Any, key: str) -> float:
    try:  # a whole number too large for a float overflows here
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be a finite number, got {number_text(value)}", field=key)
    return number + 0.0  # a negative zero is zero


def _names(data: Mapping[Any, Any], where: str) -> None:
    """Every key of a settings mapping is a name: YAML also reads ``1:``, ``true:`` and ``~:`` as keys."""
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: {excerpt(key)} ({type(key).__name__}) is not a setting name; setting names are "
                              "text such as control_period (quote a key that YAML reads as a number or a boolean)",
                              field=where)


def _list(value: Any, key: str) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list, got {excerpt(value)}", field=key)
    return value
