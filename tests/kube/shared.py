"""What the Kubernetes adapter tests share: the namespace and target, custom resource types, and
helpers that set up the fake API server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from predictive_scaler.kube import manifests
from predictive_scaler.kube.placeholders import PlaceholderSpec
from predictive_scaler.kube.workloads import WorkloadRef
from tests.support.fakes.apiserver import ResourceType

NS = "ml"
DEPLOYMENT = WorkloadRef("apps/v1", "Deployment", "llm", NS)
SCALE_PATH = "/apis/apps/v1/namespaces/ml/deployments/llm/scale"
INFERENCE_CR = ResourceType(
    "serving.example.com",
    "v1",
    "InferenceService",
    "inferenceservices",
    scale=True,
    status=True,
    builtin=False,
)
NO_SCALE_CR = ResourceType("serving.example.com", "v1", "Model", "models", builtin=False)
NOW = datetime(2025, 1, 6, 8, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def placeholder_spec(fake_api, **overrides):
    """The placeholder spec of scaler ``llm`` (created in the fake server if missing), 4 GPUs a pod."""
    scaler = fake_api.get(manifests.API_VERSION, manifests.KIND, NS, "llm") or fake_api.add_scaler(
        NS, "llm"
    )
    args = dict(
        scaler_name="llm", namespace=NS, owner_uid=scaler["metadata"]["uid"], gpus_per_pod=4
    )
    args.update(overrides)
    return PlaceholderSpec(**args)


def add_target(fake_api, kind):
    """A scalable ``llm`` of ``kind`` (Deployment, StatefulSet, ReplicationController, InferenceService)."""
    if kind == "Deployment":
        fake_api.add_deployment(NS, "llm", replicas=3)
    elif kind == "StatefulSet":
        fake_api.put(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {
                    "replicas": 3,
                    "selector": {"matchLabels": {"app": "llm"}},
                    "serviceName": "llm",
                    "template": {
                        "metadata": {"labels": {"app": "llm"}},
                        "spec": {"containers": [{"name": "s", "image": "i"}]},
                    },
                },
                "status": {"replicas": 3},
            }
        )
    elif kind == "ReplicationController":
        fake_api.put(
            {
                "apiVersion": "v1",
                "kind": "ReplicationController",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {"replicas": 3, "selector": {"app": "llm"}},
                "status": {"replicas": 3},
            }
        )
    else:
        fake_api.register_type(INFERENCE_CR)
        fake_api.put(
            {
                "apiVersion": "serving.example.com/v1",
                "kind": "InferenceService",
                "metadata": {"name": "llm", "namespace": NS},
                "spec": {"replicas": 3},
                "status": {"replicas": 3, "selector": "app=llm"},
            }
        )


HPA_V2BETA2 = ResourceType(
    "autoscaling", "v2beta2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", status=True
)


def serve_hpa_versions(fake_api, versions):
    """Make the stand-in serve exactly these HorizontalPodAutoscaler versions (e.g. Kubernetes 1.20)."""
    if "v2beta2" in versions:
        fake_api.register_type(HPA_V2BETA2)
    if "v2" not in versions:
        fake_api.unregister_type("autoscaling", "v2", "horizontalpodautoscalers")
