"""`backtest --scaler FILE.yaml`: a PredictiveScaler manifest laid over the backtest's scenario.

Every setting the manifest gives explicitly wins; settings it leaves to the CRD default come
from the scenario, and the printed scenario says which is which. Pure, except for reading the
manifest file. Used with either source of demand (a trace file or ``--prometheus``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from predictive_scaler.backtest.scenario import Scenario
    from predictive_scaler.backtest.simulator import ClusterConfig
    from predictive_scaler.retrain.settings import ScalerTarget
    from predictive_scaler.spec import ScalerSpec


@dataclass(frozen=True)
class ScalerScenario:
    """A scenario with a PredictiveScaler's spec laid over it, and where each setting came from."""

    scenario: Scenario
    #: Scenario setting → the manifest field it was taken from.
    from_manifest: Mapping[str, str]
    #: Scenario settings the manifest left to the scenario (the CRD default would otherwise apply).
    from_scenario: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"from_manifest": dict(self.from_manifest), "from_scenario": list(self.from_scenario),
                "notes": list(self.notes)}


#: Scenario settings a manifest can set; the others (preset, training, horizons, …) are the backtest's own.
_MAPPED = ("capacity_per_replica", "peak_replicas", "target_utilization", "demand_unit_seconds",
           "min_replicas", "max_replicas",
           "quantile", "control_period", "cluster.gpus_per_replica", "cluster.gpus_per_node",
           "cluster.price_per_gpu_hour", "cluster.pod_start_s", "cluster.model_load_s",
           "cluster.node_provision_s", "cluster.image_pull_s")


@dataclass
class _Overlay:
    """What the manifest changes, gathered setting by setting: ``taken`` keeps the order it is printed in."""

    #: Scenario field → its new value.
    changes: dict[str, Any] = field(default_factory=dict)
    #: Scenario setting → the manifest field it was taken from.
    taken: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Simulated-cluster setting → its new value.
    cluster: dict[str, Any] = field(default_factory=dict)


def scenario_for_scaler(base: Scenario, spec_doc: Mapping[str, Any], *, per_second: bool = False) -> ScalerScenario:
    """Lay a PredictiveScaler's camelCase ``spec`` over ``base``: what the manifest says explicitly wins.

    - Capacity always comes from the manifest (the CRD requires it): for ``requests`` demand a
      simulated replica serves ``requestsPerReplica`` and every policy plans on all of it
      (``target_utilization`` 1, as the controller does); for ``dcgm-busy-gpus`` a replica serves
      its GPUs fully busy and policies plan at ``gpuUtilizationTarget``. ``per_second``: request
      demand is per second (a Prometheus rate), so unserved requests count ``demand_unit_seconds`` 1.
    - ``minReplicas``, ``maxReplicas``, ``quantile``, ``controlPeriodSeconds``, ``gpusPerReplica``,
      ``prewarm.gpusPerNode`` and ``prewarm.budget.pricePerGpuHour`` replace the scenario's settings.
    - ``leadTimes`` reshape the simulated cluster so its warm and cold start times equal them,
      keeping the preset's proportions between their parts.
    - The whole spec is laid over the scenario's ``spec`` section for the predictive policy
      (``prewarm.budget`` as one setting: the manifest's budget replaces the scenario's), except
      ``mode``: the backtest simulates ``scale`` — ``forecast-only`` would do nothing to measure.
    """
    from predictive_scaler.backtest.scenario import build_spec
    from predictive_scaler.errors import ConfigError
    from predictive_scaler.spec import DEFAULT_MODEL_STEP, ScalerSpec

    spec = ScalerSpec.from_dict(spec_doc)
    laid = _Overlay()
    _lay_capacity(laid, spec, per_second=per_second)
    _lay_replica_settings(laid, spec, spec_doc)
    cfg = base.cluster
    _lay_lead_times(laid, spec, spec_doc, cfg)
    if laid.cluster:
        try:
            laid.changes["cluster"] = cfg.with_overrides(**laid.cluster)
        except ConfigError as exc:
            raise ConfigError(f"the manifest's spec does not fit the scenario's cluster: {exc}",
                              field=exc.field) from exc
    if spec_doc.get("mode", "forecast-only") != "scale":
        laid.notes.append(f"mode {spec.mode} in the manifest; the backtest simulates mode scale")
    laid.changes["spec"] = _planner_spec(base, spec, spec_doc)
    laid.changes["name"] = base.name
    scenario = replace(base, **laid.changes)
    # Validate now, as load_scenario does: errors name the field before any history is pulled.
    build_spec(scenario, capacity=scenario.capacity_per_replica or 1.0,
               max_replicas=scenario.resolved_max_replicas(scenario.peak_replicas or 1),
               model_step=max(DEFAULT_MODEL_STEP, spec.model.step_seconds))
    if spec.model.step_seconds < DEFAULT_MODEL_STEP:
        laid.notes.append(f"history pulled at the manifest's {spec.model.step_seconds}s model step; the backtest "
                          f"models at {DEFAULT_MODEL_STEP}s")
    from_scenario = tuple(k for k in _MAPPED if k not in laid.taken)
    return ScalerScenario(scenario=scenario, from_manifest=laid.taken, from_scenario=from_scenario,
                          notes=tuple(laid.notes))


def _given(spec_doc: Mapping[str, Any], *path: str) -> bool:
    """Whether the manifest sets ``path`` explicitly (rather than leaving it to the CRD default)."""
    node: Any = spec_doc
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def _lay_capacity(laid: _Overlay, spec: ScalerSpec, *, per_second: bool) -> None:
    """What one simulated replica serves, and the utilisation every policy plans at."""
    if spec.demand.kind == "dcgm-busy-gpus":
        laid.changes.update(capacity_per_replica=float(spec.gpus_per_replica), peak_replicas=None,
                            target_utilization=spec.capacity.gpu_utilization_target)
        laid.taken.update(capacity_per_replica="spec.gpusPerReplica", peak_replicas="spec.demand.kind",
                          target_utilization="spec.capacity.gpuUtilizationTarget")
        laid.notes.append("busy-GPU demand: a simulated replica serves its GPUs fully busy; every policy plans "
                          "at gpuUtilizationTarget")
        return
    assert spec.capacity.requests_per_replica is not None  # the spec requires it for requests
    laid.changes.update(capacity_per_replica=spec.capacity.requests_per_replica, peak_replicas=None,
                        target_utilization=1.0)
    laid.taken.update(capacity_per_replica="spec.capacity.requestsPerReplica",
                      peak_replicas="spec.capacity.requestsPerReplica",
                      target_utilization="spec.capacity.requestsPerReplica")
    laid.notes.append("request demand: a simulated replica serves requestsPerReplica and every policy plans on "
                      "all of it, as the controller does (target_utilization 1, no peak_replicas sizing)")
    if per_second:
        laid.changes["demand_unit_seconds"] = 1.0
        laid.taken["demand_unit_seconds"] = "spec.demand.query (a Prometheus rate is per second)"


def _lay_replica_settings(laid: _Overlay, spec: ScalerSpec, spec_doc: Mapping[str, Any]) -> None:
    """The scenario's and the simulated cluster's settings the manifest gives one for one."""
    for key, field_name, value in (
        (("minReplicas",), "min_replicas", spec.min_replicas),
        (("maxReplicas",), "max_replicas", spec.max_replicas),
        (("quantile",), "quantile", spec.quantile),
        (("controlPeriodSeconds",), "control_period", timedelta(seconds=spec.control_period_seconds)),
    ):
        if _given(spec_doc, *key):
            laid.changes[field_name] = value
            laid.taken[field_name] = "spec." + ".".join(key)
    cluster_settings: tuple[tuple[tuple[str, ...], str, float | None], ...] = (
        (("gpusPerReplica",), "gpus_per_replica", spec.gpus_per_replica),
        (("prewarm", "gpusPerNode"), "gpus_per_node", spec.prewarm.gpus_per_node),
        (("prewarm", "budget", "pricePerGpuHour"), "price_per_gpu_hour", spec.prewarm.budget.price_per_gpu_hour),
    )
    for path, setting, amount in cluster_settings:
        if _given(spec_doc, *path):
            laid.cluster[setting] = amount
            laid.taken[f"cluster.{setting}"] = "spec." + ".".join(path)


def _lay_lead_times(laid: _Overlay, spec: ScalerSpec, spec_doc: Mapping[str, Any], cfg: ClusterConfig) -> None:
    """``leadTimes`` reshape the simulated start times, keeping the preset's proportions between their parts."""
    from predictive_scaler.errors import ConfigError

    warm = cfg.warm_start_s
    if _given(spec_doc, "leadTimes", "podStartSeconds"):
        warm = float(spec.lead_times.pod_start_seconds)
        laid.cluster.update(_split(warm, ("pod_start_s", cfg.pod_start_s), ("model_load_s", cfg.model_load_s)))
        laid.taken.update({"cluster.pod_start_s": "spec.leadTimes.podStartSeconds",
                           "cluster.model_load_s": "spec.leadTimes.podStartSeconds"})
    if _given(spec_doc, "leadTimes", "nodeStartSeconds"):
        node = spec.lead_times.node_start_seconds - warm
        if node < 0:
            raise ConfigError(
                f"spec.leadTimes.nodeStartSeconds ({spec.lead_times.node_start_seconds}) is shorter than the "
                f"warm start ({warm:g}s) the scenario's cluster takes; give podStartSeconds too, or raise it",
                field="spec.leadTimes.nodeStartSeconds")
        laid.cluster.update(_split(node, ("node_provision_s", cfg.node_provision_s),
                                   ("image_pull_s", cfg.image_pull_s)))
        laid.taken.update({"cluster.node_provision_s": "spec.leadTimes.nodeStartSeconds",
                           "cluster.image_pull_s": "spec.leadTimes.nodeStartSeconds"})


def _planner_spec(base: Scenario, spec: ScalerSpec, spec_doc: Mapping[str, Any]) -> dict[str, Any]:
    """The predictive policy's spec: the manifest's (less ``mode``) laid over the scenario's spec section."""
    from predictive_scaler.backtest.scenario import deep_merge
    from predictive_scaler.spec import DEFAULT_MODEL_STEP

    overlay = {k: v for k, v in spec_doc.items() if k != "mode"}
    if spec.model.step_seconds < DEFAULT_MODEL_STEP and isinstance(overlay.get("model"), Mapping):
        # The harness models finer histories at its own 5-minute step; the spec must say the same.
        overlay["model"] = {k: v for k, v in overlay["model"].items() if k != "stepSeconds"}
    planner_spec = dict(base.spec)
    if _given(spec_doc, "prewarm", "budget") and isinstance(planner_spec.get("prewarm"), Mapping):
        planner_spec["prewarm"] = {k: v for k, v in planner_spec["prewarm"].items() if k != "budget"}
    return deep_merge(planner_spec, overlay)


def _split(total: float, *parts: tuple[str, float]) -> dict[str, float]:
    """``total`` seconds shared among ``parts`` in the proportions of their current values."""
    have = sum(v for _, v in parts)
    if have <= 0:
        return {parts[0][0]: total, **{k: 0.0 for k, _ in parts[1:]}}
    return {k: total * v / have for k, v in parts}


def pick_scaler(path: Path, name: str | None) -> ScalerTarget:
    """The one PredictiveScaler of ``path`` (or the one called ``name``), with a valid spec."""
    from predictive_scaler.errors import ConfigError, did_you_mean
    from predictive_scaler.retrain.settings import load_scalers_file

    every = load_scalers_file(path)
    targets = every
    if name is not None:
        targets = [t for t in every if name in (t.name, t.key)]
        if not targets:
            raise ConfigError(f"{path} holds no PredictiveScaler named {name!r}; "
                              f"{did_you_mean(name, [t.name for t in every])}it holds "
                              f"{', '.join(t.key for t in every)}", field="name")
    if len(targets) > 1:
        raise ConfigError(f"{path} holds {len(targets)} PredictiveScalers ({', '.join(t.key for t in targets)}); "
                          "choose one with --name", field="name")
    target = targets[0]
    if target.spec is None:
        raise ConfigError(f"{path}: PredictiveScaler {target.key} has an {target.problem}; fix the manifest "
                          "(`kubectl apply --dry-run=server -f` checks it against the CRD)", field="spec")
    return target


def spec_doc(path: Path, target: ScalerTarget) -> dict[str, Any]:
    """The raw camelCase spec of ``target`` in ``path`` (to know which settings it gives explicitly)."""
    import yaml

    from predictive_scaler.yaml_input import read_yaml_text

    text = read_yaml_text(path, what="a scalers file", remedy="give a YAML file of PredictiveScaler manifests",
                          field="scaler")  # read again: it must still be a regular file
    for doc in yaml.safe_load_all(text):
        items: list[Any] = doc["items"] if isinstance(doc, Mapping) and isinstance(doc.get("items"), list) else [doc]
        for item in items:
            if not isinstance(item, Mapping) or item.get("kind", "PredictiveScaler") != "PredictiveScaler":
                continue
            meta = item.get("metadata") or {}
            if meta.get("name") == target.name and str(meta.get("namespace") or "default") == target.namespace:
                return dict(item.get("spec") or {})
    raise AssertionError(f"{target.key} vanished from {path}")  # pragma: no cover - pick_scaler read it


def print_origins(key: str, manifest: Path, scenario: Scenario, mapped: ScalerScenario) -> None:
    """Say which scenario settings the manifest gave and which the scenario kept."""
    settings = scenario.to_dict()

    def value(setting: str) -> Any:
        group, _, name = setting.rpartition(".")
        found = settings[group][name] if group else settings[setting]
        return f"{found:g}" if isinstance(found, float) else found

    print(f"scaler: {key} ({manifest}) over scenario {scenario.name}: the manifest's explicit settings win")
    by_field: dict[str, list[str]] = {}
    for setting, source in mapped.from_manifest.items():
        by_field.setdefault(source, []).append(f"{setting}={value(setting)}")
    for source, taken in by_field.items():
        print(f"  {source} → {', '.join(taken)}")
    print(f"  from the scenario: {', '.join(f'{s}={value(s)}' for s in mapped.from_scenario) or 'nothing'}, "
          "and the rest (preset, training, horizons, forecasters, policies)")
    print("  the predictive policy runs the manifest's spec laid over the scenario's spec section")
    for note in mapped.notes:
        print(f"  note: {note}")
