"""What the FinOps metrics are labelled with and counted at (docs/finops.md). Pure.

The node pool is read from the node labels the node autoscalers set, in the order a cluster
most likely has them; a scaler's prewarm ``nodeSelector`` names the pool its capacity is
bought in, so it is what the pool label says. The price is OpenCost's ``node_gpu_hourly_cost``
when the caller found one, else the spec's ``prewarm.budget.pricePerGpuHour``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from predictive_scaler.spec import ScalerSpec

#: Node labels naming a node pool: Karpenter, GKE, Cluster Autoscaler's node-group conventions (EKS, AKS).
NODE_POOL_LABELS: tuple[str, ...] = (
    "karpenter.sh/nodepool",
    "karpenter.sh/provisioner-name",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)


def node_pool(labels: Mapping[str, str]) -> str:
    """The node pool a node (or a node selector) names; "" when none of the known labels is there."""
    for key in NODE_POOL_LABELS:
        value = labels.get(key)
        if value:
            return str(value)
    return ""


@dataclass(frozen=True)
class Price:
    """One GPU-hour's price and where it came from ("opencost" or "spec"); None: nobody said."""

    per_gpu_hour: float | None
    source: str


def price_for(spec: ScalerSpec, opencost: float | None = None) -> Price:
    if opencost is not None and opencost >= 0:
        return Price(float(opencost), "opencost")
    return Price(spec.prewarm.budget.price_per_gpu_hour, "spec")


def billed_gpus(target_replicas: int, placeholder_gpus: int, gpus_per_replica: int) -> int:
    """GPUs held now: every replica the target's spec asks for, and the placeholders actually running."""
    return max(0, target_replicas) * gpus_per_replica + max(0, placeholder_gpus)
