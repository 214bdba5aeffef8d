"""The PredictiveScaler spec the process-level tests run (reliability, e2e): one builder, with the
numbers each suite varies as arguments and any other field overridden by keyword."""

from __future__ import annotations

from typing import Any

MODEL = "llm"
QUERY = "sum(rate(requests_total[2m]))"


def scaler_spec(
    *,
    model: str = MODEL,
    query: str = QUERY,
    requests_per_replica: float = 100,
    max_replicas: int = 10,
    node_start_seconds: int = 1500,
    gpus_per_node: int = 2,
    max_gpus: int = 4,
    target: dict[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A scale-mode spec of ``model`` (a Deployment of that name) with prewarm on at $2.50/GPU-hour;
    ``fields`` replace whole top-level fields (``mode``, ``prewarm``, …)."""
    spec: dict[str, Any] = {
        "mode": "scale",
        "target": target or {"apiVersion": "apps/v1", "kind": "Deployment", "name": model},
        "demand": {"kind": "requests", "query": query},
        "capacity": {"requestsPerReplica": requests_per_replica},
        "minReplicas": 1, "maxReplicas": max_replicas,
        "leadTimes": {"podStartSeconds": 120, "nodeStartSeconds": node_start_seconds},
        "prewarm": {"enabled": True, "gpusPerNode": gpus_per_node,
                    "budget": {"maxGpus": max_gpus, "pricePerGpuHour": 2.5, "currency": "USD"}},
        "model": {"name": model},
    }
    spec.update(fields)
    return spec
