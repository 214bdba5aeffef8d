"""kube/ by concern: ``KubeCluster`` only assembles; each call lives in the module of its
concern, so a newcomer finds a verb by the resource it acts on."""

from __future__ import annotations

import pytest

from predictive_scaler.kube.client import KubeCluster


@pytest.mark.parametrize(("method", "module"), [
    pytest.param("list_paginated", "transport", id="lists"),
    pytest.param("watch_stream", "transport", id="watches"),
    pytest.param("ping", "transport", id="ping"),
    pytest.param("scalable_plural", "discovery", id="kinds"),
    pytest.param("hpa_version", "discovery", id="hpa-version"),
    pytest.param("get_scale", "workloads", id="get-scale"),
    pytest.param("patch_scale", "workloads", id="patch-scale"),
    pytest.param("list_pods", "pods", id="pods"),
    pytest.param("list_gpu_nodes", "pods", id="nodes"),
    pytest.param("priority_class_value", "placeholders", id="priority-class"),
    pytest.param("ensure_placeholder", "placeholders", id="placeholder"),
    pytest.param("delete_placeholder", "placeholders", id="placeholder-delete"),
    pytest.param("list_conflicting_autoscalers", "autoscalers", id="autoscalers"),
    pytest.param("create_event", "scalers", id="events"),
    pytest.param("patch_status", "scalers", id="status"),
    pytest.param("list_scalers", "scalers", id="scalers"),
    pytest.param("write_lease", "leases", id="leases"),
])
def test_each_call_lives_with_its_concern(method: str, module: str) -> None:
    assert getattr(KubeCluster, method).__module__ == f"predictive_scaler.kube.{module}"


def test_the_facade_defines_nothing_but_its_constructor() -> None:
    own = {name for name in vars(KubeCluster) if not (name.startswith("__") and name.endswith("__"))}
    assert own == set(), f"KubeCluster grew its own calls {sorted(own)}; put them in the module of their concern"
