"""``KubeCluster``: the Kubernetes API as the controller uses it, assembled from one part per concern.

kube/ is the only part that imports ``kubernetes``. Its modules, each owning one concern:

- :mod:`~predictive_scaler.kube.transport` — one JSON request, bounded retries
  (:mod:`~predictive_scaler.kube.retry`), paginated lists and watches; every failure becomes a typed
  ``ClusterError`` (``from exc``) by :mod:`~predictive_scaler.kube.api_errors`, the one mapping of
  HTTP statuses;
- :mod:`~predictive_scaler.kube.kubeconfig` — an ``ApiClient`` from the ServiceAccount or a kubeconfig;
- :mod:`~predictive_scaler.kube.discovery` — which groups, versions and kinds the server serves;
- one module per resource family: :mod:`~predictive_scaler.kube.workloads` (the target's ``/scale``),
  :mod:`~predictive_scaler.kube.pods` (pods and GPU nodes), :mod:`~predictive_scaler.kube.placeholders`
  (the prewarm Deployment), :mod:`~predictive_scaler.kube.autoscalers` (HPAs, KEDA ScaledObjects),
  :mod:`~predictive_scaler.kube.scalers` (the PredictiveScaler and its Events),
  :mod:`~predictive_scaler.kube.leases` (shard Leases);
- :mod:`~predictive_scaler.kube.api_calls` — every request those make (``API_CALLS``), from which
  the RBAC rules and docs/kube-api-calls.md are derived; :mod:`~predictive_scaler.kube.manifests`
  builds the objects written; :mod:`~predictive_scaler.kube.cache` keeps watched copies.
"""

from __future__ import annotations

from typing import Unpack

from kubernetes.client import ApiClient

from predictive_scaler.kube import manifests
from predictive_scaler.kube.autoscalers import AutoscalerCalls
from predictive_scaler.kube.leases import LeaseCalls
from predictive_scaler.kube.placeholders import PlaceholderCalls
from predictive_scaler.kube.pods import PodCalls
from predictive_scaler.kube.scalers import ScalerCalls
from predictive_scaler.kube.transport import TransportOptions
from predictive_scaler.kube.workloads import ScaleCalls


class KubeCluster(ScaleCalls, PodCalls, PlaceholderCalls, AutoscalerCalls, ScalerCalls, LeaseCalls):
    """Typed, small facade over the Kubernetes API for one controller process: the resource
    families' calls over one :class:`~predictive_scaler.kube.transport.Transport`.

    ``dry_run`` sends every write with ``dryRun=All``: the API server validates
    and admits it but persists nothing (the controller's ``--dry-run``). ``gpu_resource`` is the
    extended resource counted as GPUs on nodes and pods; the other options (retry policy, clock,
    sleep, randomness, request timeout) are the transport's.
    """

    def __init__(self, api_client: ApiClient, *, gpu_resource: str = manifests.GPU_RESOURCE,
                 **transport: Unpack[TransportOptions]) -> None:
        super().__init__(api_client, gpu_resource=gpu_resource, **transport)
