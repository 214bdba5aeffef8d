"""Uninstalling never hangs: with the controller stopped, deleting a PredictiveScaler, and then the CRD
with scalers still in it, completes at once on a real API server — no finalizer waits for a controller
that is not there.

This module runs its own control plane: deleting the CRD would take the session's scalers with it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from predictive_scaler import crd
from predictive_scaler.forecasting.store import ModelStore
from predictive_scaler.kube.manifests import GROUP, PLURAL, VERSION
from tests.deploy.support import OVERLAYS, render
from tests.e2e.conftest import (
    CONTROLLER_SA,
    INTERVAL_SECONDS,
    RecentDemand,
    get_scaler,
    make_target,
    scaler_manifest,
    start_controller,
)
from tests.support.kubeapi import KubeApiServer, apply_deploy, running_control_plane

NS = "e2e-uninstall"
#: The finalizer kopf puts on the objects it handles unless told otherwise (its default name).
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
DEADLINE_SECONDS = 30.0


@pytest.fixture(scope="module")
def own_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    with running_control_plane(tmp_path_factory.mktemp("kubeapi-uninstall")) as server:
        apply_deploy(server, render(OVERLAYS["default"]))
        yield server


def gone_within(api: KubeApiServer, path: str, seconds: float) -> float:
    t0 = time.monotonic()
    api.wait_for(f"{path} gone", lambda: api.get(path) is None, timeout=seconds, interval=0.2)
    return time.monotonic() - t0


def test_deleting_a_scaler_and_the_crd_with_the_controller_stopped_completes(
        own_api: KubeApiServer, recent_demand: RecentDemand, model_store: ModelStore,
        tmp_path: Path) -> None:
    api = own_api
    make_target(api, NS, replicas=1)
    # One as a previous release left it, carrying kopf's finalizer: the controller must take it off.
    legacy = scaler_manifest(NS, mode="forecast-only", name="legacy")
    legacy["metadata"]["finalizers"] = [KOPF_FINALIZER]
    api.apply([scaler_manifest(NS, mode="forecast-only", name="one"),
               scaler_manifest(NS, mode="forecast-only", name="two"), legacy])
    kubeconfig = api.service_account_kubeconfig(crd.CONTROLLER_NAMESPACE, CONTROLLER_SA)
    proc = start_controller(kubeconfig, recent_demand.url, model_store, tmp_path / "controller.log")
    try:
        def handled() -> bool:
            objs = [get_scaler(api, NS, n) for n in ("one", "two", "legacy")]
            return all(((o or {}).get("status") or {}).get("lastReconcileTime") for o in objs) and \
                not (get_scaler(api, NS, "legacy") or {}).get("metadata", {}).get("finalizers")
        api.wait_for("every scaler reconciled, and the old finalizer removed", handled, timeout=120)
        for name in ("one", "two", "legacy"):
            assert not get_scaler(api, NS, name)["metadata"].get("finalizers"), name  # type: ignore[index]
        # Deleted while the controller runs: gone at once, and its reconcile timer stops with it.
        two = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/two"
        assert api.request("DELETE", two).status_code == 200
        gone_within(api, two, DEADLINE_SECONDS)
        time.sleep(2)  # the watch event reaches the controller
        mark = len(proc.log_text())
        time.sleep(3 * INTERVAL_SECONDS)
        after = proc.log_text()[mark:]
        assert f"{NS}/two" not in after, after[-3000:]
        assert f"{NS}/one" in after, "the other scalers' timers must go on"
    finally:
        assert proc.stop() == 0, proc.log_text()[-3000:]

    # The controller is stopped: nothing can remove a finalizer now.
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{PLURAL}/one"
    assert api.request("DELETE", path).status_code == 200
    took = gone_within(api, path, DEADLINE_SECONDS)
    # The CRD, with scalers still in it: the server deletes them, then the definition.
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}"
    assert api.request("DELETE", crd_path).status_code == 200
    took_crd = gone_within(api, crd_path, DEADLINE_SECONDS)
    print(f"scaler deleted in {took:.1f}s, the CRD with two scalers in it in {took_crd:.1f}s")
