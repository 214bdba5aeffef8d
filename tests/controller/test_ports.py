"""The controller's adapters on their own: cluster port on the fake API, model-store port, budget ledger."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from predictive_scaler.controller.budget import ClusterBudget
from predictive_scaler.controller.ports import KubeClusterPort, ScalerRef, StoreModelPort
from predictive_scaler.controller.settings import ClusterBudgetLimits, ControllerSettings
from predictive_scaler.errors import ConfigError, ModelError
from predictive_scaler.forecasting.store import MODEL_FILE, ModelStore
from predictive_scaler.kube import manifests
from predictive_scaler.kube.client import KubeCluster
from predictive_scaler.policy.budget import ClusterShare
from predictive_scaler.policy.planner import Decision
from predictive_scaler.spec import ScalerSpec
from tests.controller.conftest import (
    NS,
    TARGET,
    install,
    publish_model,
    scaler,
    scaler_spec,
    synthetic_history,
)
from tests.support.fakes.apiserver import FakeApiServer


def decision(replicas: int, placeholder_gpus: int) -> Decision:
    return Decision(desired_replicas=replicas, placeholder_gpus=placeholder_gpus, strategy="predictive",
                    speculative_gpus=placeholder_gpus, speculative_cost_per_hour=None, limits=(), reasons=())


def port(fake_api: FakeApiServer, kube: KubeCluster, spec: dict[str, Any] | None = None) -> KubeClusterPort:
    obj = scaler(fake_api)
    return KubeClusterPort(kube, ScalerRef(TARGET, NS, obj["metadata"]["uid"]), ScalerSpec.from_dict(spec or obj["spec"]))


def test_observe_reads_scale_pods_placeholder_and_free_gpus(fake_api: FakeApiServer, kube: KubeCluster) -> None:
    install(fake_api, replicas=4, ready=3, gpu_nodes=2)
    state = port(fake_api, kube).observe(None)  # type: ignore[arg-type]
    assert (state.desired_replicas, state.ready_replicas, state.starting_replicas) == (4, 3, 1)
    assert state.placeholder_gpus == 0
    assert state.free_gpus == 16 - 4  # two 8-GPU nodes, four 1-GPU pods


@pytest.mark.parametrize("gpus_per_replica, placeholder_gpus, pods", [(1, 3, 3), (2, 4, 2), (4, 8, 2)],
                         ids=["1-gpu", "2-gpu", "4-gpu"])
def test_apply_sizes_the_placeholder_one_pod_per_replica(fake_api: FakeApiServer, kube: KubeCluster,
                                                        gpus_per_replica: int, placeholder_gpus: int,
                                                        pods: int) -> None:
    install(fake_api, replicas=2, spec=scaler_spec(gpusPerReplica=gpus_per_replica))
    p = port(fake_api, kube)
    p.observe(None)  # type: ignore[arg-type]
    p.apply(decision(3, placeholder_gpus), None)  # type: ignore[arg-type]
    created = fake_api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(TARGET))
    assert created is not None and created["spec"]["replicas"] == pods
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == str(gpus_per_replica)
    assert created["metadata"]["ownerReferences"][0]["uid"] == scaler(fake_api)["metadata"]["uid"]
    assert fake_api.get("apps/v1", "Deployment", NS, TARGET)["spec"]["replicas"] == 3


def test_apply_keeps_an_idle_placeholder_at_zero_and_resizes(fake_api: FakeApiServer, kube: KubeCluster) -> None:
    install(fake_api, replicas=2)
    for gpus, expected in [(2, 2), (0, 0), (5, 5)]:
        p = port(fake_api, kube)
        p.observe(None)  # type: ignore[arg-type]
        p.apply(decision(2, gpus), None)  # type: ignore[arg-type]
        ph = fake_api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(TARGET))
        assert ph is not None and ph["spec"]["replicas"] == expected


def test_placeholder_template_follows_the_spec(fake_api: FakeApiServer, kube: KubeCluster) -> None:
    spec = scaler_spec(prewarm={"enabled": True, "image": "vllm/vllm-openai:v0.6.3",
                                "nodeSelector": {"pool": "gpu"},
                                "tolerations": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                                "budget": {"maxGpus": 8}})
    install(fake_api, spec=spec)
    p = port(fake_api, kube)
    p.observe(None)  # type: ignore[arg-type]
    p.apply(decision(4, 2), None)  # type: ignore[arg-type]
    pod = fake_api.get("apps/v1", "Deployment", NS, manifests.placeholder_name(TARGET))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [{"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert pod["containers"][0]["image"] == "vllm/vllm-openai:v0.6.3"
    assert any(r.path == "/api/v1/nodes" and r.query.get("labelSelector") == "pool=gpu" for r in fake_api.requests)


# -- model store port -------------------------------------------------------------------------------

def model_port(store: ModelStore, **kw: Any) -> StoreModelPort:
    return StoreModelPort(store, TARGET, horizon_seconds=1800, quantile=0.95, expected_series=TARGET, **kw)


def tamper(store: ModelStore, version: str) -> None:
    path = store.version_dir(TARGET, version) / MODEL_FILE
    path.write_bytes(path.read_bytes().replace(b'"step_seconds":300', b'"step_seconds":600'))


def test_model_port_forecasts_with_the_serving_version(store: ModelStore) -> None:
    p = model_port(store)
    p.refresh()
    assert p.version == store.pointer(TARGET).version and p.problem is None
    f = p.forecast(synthetic_history(days=1), None)  # type: ignore[arg-type]
    assert f.quantiles == (0.5, 0.95) and f.horizon_steps == 6


def _model_ports(store: ModelStore) -> dict[str, object]:
    """Every ModelPort there is: the controller's (before and after it loads a model), the backtest's, the tests' fake."""
    from predictive_scaler.backtest.adapters import ServedModel
    from predictive_scaler.forecasting.baselines import PersistenceForecaster
    from tests.support.fakes.ports import FakeModel

    loaded = model_port(store)
    loaded.refresh()
    served = ServedModel(PersistenceForecaster().fit(synthetic_history()), "v", horizon_steps=6, quantiles=(0.5, 0.95))
    return {"store-empty": model_port(store), "store-loaded": loaded, "backtest": served,
            "fake": FakeModel(lambda t: 1.0)}


def test_every_model_port_answers_what_the_step_reads(store: ModelStore) -> None:
    from predictive_scaler.reconcile import ModelPort, Reconciler

    declared = {name for name in vars(ModelPort) if not name.startswith("_")}
    assert {"forecast", "version", "step_seconds", "window_steps"} <= declared
    for label, impl in _model_ports(store).items():
        for name in sorted(declared):
            value = getattr(impl, name)  # a missing member raises here, not deep inside a reconcile
            if name in {"step_seconds", "window_steps"}:
                assert value is None or (isinstance(value, int) and value > 0), (label, name, value)
        step = Reconciler(ScalerSpec.from_dict(scaler_spec()), None, impl, None, None).model_step_seconds  # type: ignore[arg-type]
        assert step == (getattr(impl, "step_seconds", None) or 300), label


def _port_then_a_new_version(store: ModelStore, clock: Any) -> tuple[StoreModelPort, str | None, str]:
    """A model port that has loaded the serving version, and a newer version published an hour later."""
    p = model_port(store)
    p.refresh()
    first = p.version
    store.clock = clock
    clock.advance(3600)
    return p, first, publish_model(store, level=80.0)


def test_a_new_serving_version_is_noticed_without_restart(store: ModelStore, clock: Any) -> None:
    p, first, second = _port_then_a_new_version(store, clock)
    p.refresh()
    assert p.version == second != first and p.loads == 2
    p.refresh()
    assert p.loads == 2  # nothing changed: nothing re-verified


def test_a_refused_new_version_keeps_the_previous_one(store: ModelStore, clock: Any) -> None:
    p, first, second = _port_then_a_new_version(store, clock)
    tamper(store, second)
    p.refresh()
    assert p.version == first
    assert p.problem is not None and second in p.problem and "sha256" in p.problem


@pytest.mark.parametrize("damage", ["tampered", "deleted", "no-model"])
def test_a_damaged_serving_model_is_dropped(store: ModelStore, tmp_path: Path, damage: str) -> None:
    p = model_port(store) if damage != "no-model" else StoreModelPort(
        ModelStore(tmp_path / "empty"), TARGET, horizon_seconds=1800, quantile=0.95)
    p.refresh()
    if damage == "tampered":
        tamper(store, p.version)  # type: ignore[arg-type]
    elif damage == "deleted":
        (store.version_dir(TARGET, p.version) / MODEL_FILE).unlink()  # type: ignore[arg-type]
    p.refresh()
    assert p.version is None and p.problem
    with pytest.raises(ModelError, match="retrain|train|sha256|missing|promote"):
        p.forecast(synthetic_history(days=1), None)  # type: ignore[arg-type]


def test_a_horizon_off_the_model_grid_is_a_model_error(store: ModelStore) -> None:
    p = StoreModelPort(store, TARGET, horizon_seconds=1500 + 120, quantile=0.95)
    p.refresh()
    with pytest.raises(ModelError, match="multiple"):
        p.forecast(synthetic_history(days=1), None)  # type: ignore[arg-type]


# -- the cluster budget --------------------------------------------------------------------------------

def test_reservations_never_let_concurrent_scalers_overrun_the_cap() -> None:
    ledger = ClusterBudget(ClusterBudgetLimits(max_gpus=10))
    with ledger.reserve("a", 1.0, 0.0) as a:
        assert a.allowed_gpus == 10
        with ledger.reserve("b", 1.0, 0.0) as b:
            assert b.allowed_gpus == 0  # a is booked at its maximum while it decides
            b.settle(0, 0.0)
        a.settle(6, 0.0)
    with ledger.reserve("b", 1.0, 1.0) as b:
        assert b.allowed_gpus == 4
        b.settle(9, 1.0)  # more than allowed is clipped
    assert ledger.total()[0] == 10


def test_a_failed_step_keeps_the_previous_booking() -> None:
    ledger = ClusterBudget(ClusterBudgetLimits(max_gpus=10))
    ledger.seed("a", 3, 3.0, 0.0)
    with pytest.raises(RuntimeError), ledger.reserve("a", 1.0, 1.0):
        raise RuntimeError("API down")
    assert ledger.total() == (3, 3.0)


@pytest.mark.parametrize("limits, price, others, expected", [
    (ClusterBudgetLimits(), 2.0, 0, None),
    (ClusterBudgetLimits(max_cost_per_hour=10.0), 2.5, 0, 4),
    (ClusterBudgetLimits(max_cost_per_hour=10.0), None, 0, 0),
    (ClusterBudgetLimits(max_gpus=6, max_cost_per_hour=100.0), 1.0, 4, 2),
    (ClusterBudgetLimits(max_gpus=3), 1.0, 5, 0),
], ids=["no-cap", "cost-cap", "cost-cap-without-price", "both", "already-over"])
def test_allowance(limits: ClusterBudgetLimits, price: float | None, others: int, expected: int | None) -> None:
    ledger = ClusterBudget(limits)
    ledger.seed("other", others, others * 1.0, 0.0)
    with ledger.reserve("me", price, 0.0) as r:
        assert r.allowed_gpus == expected


def test_the_reservation_is_the_share_the_step_takes() -> None:
    ledger = ClusterBudget(ClusterBudgetLimits(max_gpus=10))
    ledger.seed("other", 7, 7.0, 0.0)
    with ledger.reserve("me", 1.0, 0.0) as r:
        assert r.share == ClusterShare(3, r.reason) and r.reason and "3 left" in r.reason


# -- settings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("env, field", [
    ({}, "prometheusUrl"),
    ({"PREDICTIVE_SCALER_PROMETHEUS_URL": "prometheus:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/m"},
     "prometheusUrl"),
    ({"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://p:9090"}, "modelStore"),
    ({"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://p:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/m",
      "PREDICTIVE_SCALER_RECONCILE_INTERVAL_SECONDS": "1"}, "interval"),
    ({"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://p:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/m",
      "PREDICTIVE_SCALER_CLUSTER_BUDGET_GPUS": "2.5"}, "PREDICTIVE_SCALER_CLUSTER_BUDGET_GPUS"),
], ids=["no-url", "url-without-scheme", "no-store", "interval-too-short", "fractional-gpus"])
def test_settings_refuse_bad_values_naming_them(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ControllerSettings.from_env(env)
    assert info.value.field == field


def test_settings_from_the_deploy_configmap() -> None:
    env = {"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://p:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/m",
           "PREDICTIVE_SCALER_RECONCILE_INTERVAL_SECONDS": "60", "PREDICTIVE_SCALER_CLUSTER_BUDGET_GPUS": "8",
           "PREDICTIVE_SCALER_CLUSTER_BUDGET_COST_PER_HOUR": ""}
    s = ControllerSettings.from_env(env, interval_seconds=30.0, namespace=None)
    assert (s.interval_seconds, s.cluster_budget.max_gpus, s.cluster_budget.max_cost_per_hour) == (30.0, 8, None)
    assert s.liveness_timeout_seconds == 150.0 and timedelta(seconds=s.interval_seconds)


# -- the watch-fed cluster cache ------------------------------------------------------------

def _cached_port(fake_api: FakeApiServer, kube: KubeCluster, cache: Any) -> KubeClusterPort:
    obj = scaler(fake_api)
    return KubeClusterPort(kube, ScalerRef(TARGET, NS, obj["metadata"]["uid"]), ScalerSpec.from_dict(obj["spec"]),
                           cache)


def test_a_fresh_cache_replaces_the_pod_node_and_autoscaler_lists(fake_api: FakeApiServer, kube: KubeCluster) -> None:
    from predictive_scaler.kube.cache import ClusterCache

    install(fake_api, replicas=4, ready=3, gpu_nodes=2)
    cache = ClusterCache(kube, watch_timeout_seconds=1, resync_seconds=300.0).start()
    try:
        assert cache.wait_synced(10)

        def own_lists() -> int:  # the cache's own LISTs, its re-asks of the absent KEDA API included
            return sum(r.lists + r.absent_checks for r in cache.reflectors.values())

        before, cached_before = len(fake_api.requests), own_lists()
        p = _cached_port(fake_api, kube, cache)
        assert p.conflicts() == ()
        state = p.observe(None)  # type: ignore[arg-type]
        assert (state.desired_replicas, state.ready_replicas, state.starting_replicas) == (4, 3, 1)
        assert state.free_gpus == 16 - 4 and p.stale == ()
        lists = [r for r in fake_api.requests[before:] if r.query.get("watch") != "true"
                 and (r.path.endswith("/pods") or r.path.endswith("/nodes") or "autoscalers" in r.path
                      or "scaledobjects" in r.path)]
        # With a 1-s watch timeout the cache re-asks for KEDA's absent API about once a second, in
        # its own thread (its counter moves just after the request is answered); everything else
        # listed in this window would be the reconcile's.
        deadline = time.monotonic() + 0.5
        while own_lists() - cached_before < len(lists) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(lists) <= own_lists() - cached_before, f"a reconcile on a fresh cache lists nothing: {lists}"
    finally:
        cache.stop(join_seconds=10)


@pytest.mark.parametrize("decided, kept", [(2, 5), (7, 7)], ids=["scale-down-held", "scale-up-allowed"])
def test_a_stale_cache_never_scales_down_and_grants_no_free_gpus(fake_api: FakeApiServer, kube: KubeCluster,
                                                                 decided: int, kept: int) -> None:
    from predictive_scaler.kube.cache import ClusterCache

    install(fake_api, replicas=5, ready=5, gpu_nodes=2)
    cache = ClusterCache(kube)  # never started: nothing listed, stale
    p = _cached_port(fake_api, kube, cache)
    state = p.observe(None)  # type: ignore[arg-type]
    assert p.stale == ("pods", "nodes")
    assert state.ready_replicas == 5, "pods are read directly instead"
    assert state.free_gpus == 0, "free GPUs unknown on a stale cache: none granted"
    assert p.conflicts() == (), "conflicts are read directly"
    p.apply(decision(decided, 0), None)  # type: ignore[arg-type]
    assert fake_api.get("apps/v1", "Deployment", NS, TARGET)["spec"]["replicas"] == kept
    assert p.held_down == (decided if decided < 5 else None)
