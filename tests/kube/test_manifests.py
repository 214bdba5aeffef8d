from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import kubernetes_validate
import pytest

from predictive_scaler.errors import ConfigError, DataError
from predictive_scaler.kube import manifests

K8S = "1.33"
UID = "0b6a3d43-5f0e-4c55-9a55-2b8c1c0e9f10"
NOW = datetime(2025, 1, 6, 8, 0, 0, 123456, tzinfo=UTC)
SCALER_REF = {
    "apiVersion": manifests.API_VERSION,
    "kind": manifests.KIND,
    "name": "llm",
    "namespace": "ml",
    "uid": UID,
}


def _placeholder(**overrides):
    args = dict(
        scaler_name="llm",
        namespace="ml",
        owner_uid=UID,
        replicas=2,
        gpus_per_pod=4,
        priority_class=manifests.PLACEHOLDER_PRIORITY_CLASS,
        image=manifests.PLACEHOLDER_IMAGE,
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    args.update(overrides)
    return manifests.placeholder_deployment(**args)


def _container(deployment):
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "build",
    [
        _placeholder,
        lambda: _placeholder(image="vllm/vllm-openai:v0.6.3", node_selector=None, tolerations=()),
        lambda: _placeholder(replicas=0),
        manifests.placeholder_priority_class,
        lambda: manifests.event(SCALER_REF, "ScaledUp", "3 -> 5 replicas", "Normal", NOW),
        lambda: manifests.event(SCALER_REF, "BudgetLimited", "x" * 5000, "Warning", NOW),
    ],
    ids=[
        "placeholder",
        "placeholder-inference-image",
        "placeholder-zero",
        "priority-class",
        "event",
        "event-long-message",
    ],
)
def test_built_in_objects_validate_strictly(build):
    obj = build()
    kubernetes_validate.validate(obj, K8S, strict=True)


def test_placeholder_holds_gpus_under_the_negative_priority_class_owned_by_the_scaler():
    deployment = _placeholder()
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    assert deployment["metadata"]["name"] == "llm-prewarm"
    assert deployment["spec"]["replicas"] == 2
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert pod["priorityClassName"] == "predictive-scaler-placeholder"
    assert pod["terminationGracePeriodSeconds"] == 0
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    (owner,) = deployment["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "autoscaling.predictive-scaler.io/v1alpha1",
        "kind": "PredictiveScaler",
        "name": "llm",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "predictive-scaler"
    assert labels["predictive-scaler.io/scaler"] == "llm"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # A surge would exceed the prewarm budget during a template change.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_placeholder_pod_is_restricted():
    pod = _placeholder()["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


@pytest.mark.parametrize(
    ("image", "command"),
    [
        (manifests.PLACEHOLDER_IMAGE, None),
        ("vllm/vllm-openai:v0.6.3", ["sleep", "infinity"]),
    ],
    ids=["pause-runs-its-own-entrypoint", "inference-image-only-sleeps"],
)
def test_placeholder_command_depends_on_image(image, command):
    assert _container(_placeholder(image=image)).get("command") == command


@pytest.mark.parametrize(
    ("change", "same_hash"),
    [
        ({"replicas": 7}, True),
        ({"owner_uid": "another-uid"}, True),
        ({"gpus_per_pod": 8}, False),
        ({"image": "vllm/vllm-openai:v0.6.3"}, False),
        ({"node_selector": {"pool": "h100"}}, False),
        ({"tolerations": ()}, False),
        ({"priority_class": "other-class"}, False),
    ],
    ids=["replicas", "owner", "gpus", "image", "node-selector", "tolerations", "priority-class"],
)
def test_template_hash_tracks_only_the_pod_template(change, same_hash):
    key = manifests.TEMPLATE_HASH_ANNOTATION
    before = _placeholder()["metadata"]["annotations"][key]
    after = _placeholder(**change)["metadata"]["annotations"][key]
    assert (before == after) is same_hash


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"replicas": -1}, "spec.prewarm"),
        ({"replicas": 1.5}, "spec.prewarm"),
        ({"gpus_per_pod": 0}, "spec.prewarm.gpusPerNode"),
        ({"gpus_per_pod": True}, "spec.prewarm.gpusPerNode"),
        ({"owner_uid": ""}, "metadata.uid"),
        ({"namespace": "Bad_NS"}, "metadata.namespace"),
        ({"scaler_name": "x" * 64}, "metadata.name"),
        ({"scaler_name": "Upper"}, "metadata.name"),
        ({"priority_class": "not a name"}, "spec.prewarm.priorityClassName"),
        ({"image": ""}, "spec.prewarm.image"),
    ],
    ids=[
        "negative-replicas",
        "fractional-replicas",
        "zero-gpus",
        "bool-gpus",
        "no-owner-uid",
        "bad-namespace",
        "name-too-long-for-label",
        "upper-case-name",
        "bad-priority-class",
        "empty-image",
    ],
)
def test_placeholder_rejects_bad_input_naming_the_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        _placeholder(**overrides)
    assert info.value.field == field


def test_priority_class_is_negative_never_preempting_and_not_default():
    pc = manifests.placeholder_priority_class("prewarm", -5)
    assert pc["value"] == -5
    assert pc["preemptionPolicy"] == "Never"
    assert pc["globalDefault"] is False
    with pytest.raises(ConfigError):
        manifests.placeholder_priority_class("prewarm", 0)


@pytest.mark.parametrize(
    ("replicas", "resource_version", "expected"),
    [
        (3, None, {"spec": {"replicas": 3}}),
        (0, "42", {"spec": {"replicas": 0}, "metadata": {"resourceVersion": "42"}}),
    ],
    ids=["plain", "with-precondition"],
)
def test_scale_patch(replicas, resource_version, expected):
    assert manifests.scale_patch(replicas, resource_version) == expected


@pytest.mark.parametrize("replicas", [-1, 2.0, True], ids=["negative", "float", "bool"])
def test_scale_patch_rejects_non_counts(replicas):
    with pytest.raises(ConfigError):
        manifests.scale_patch(replicas)


def test_status_patch_wraps_status():
    status = {"desiredReplicas": 4, "forecast": {"p95": [1.0, 2.5]}, "conditions": []}
    assert manifests.status_patch(status) == {"status": status}


@pytest.mark.parametrize(
    ("status", "path"),
    [
        ({"forecast": {"p95": [1.0, math.nan]}}, "status.forecast.p95[1]"),
        ({"budgetInUse": math.inf}, "status.budgetInUse"),
        ({"lastReconcile": NOW}, "status.lastReconcile"),
        ({"x": {1: "a"}}, "status.x"),
    ],
    ids=["nan-in-list", "infinity", "datetime", "non-string-key"],
)
def test_status_patch_refuses_what_json_cannot_carry(status, path):
    with pytest.raises(DataError, match=path.replace("[", r"\[").replace("]", r"\]")):
        manifests.status_patch(status)


def test_event_shape():
    ev = manifests.event(SCALER_REF, "FallbackReactive", "drift", "Warning", NOW, instance="pod-1")
    assert ev["metadata"]["namespace"] == "ml"
    assert ev["metadata"]["name"].startswith("llm.")
    assert ev["involvedObject"] == SCALER_REF
    assert ev["type"] == "Warning"
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2025-01-06T08:00:00Z"
    assert ev["source"] == {"component": "predictive-scaler"}
    assert ev["reportingInstance"] == "pod-1"


def test_event_names_differ_per_call_time_and_normalise_to_utc():
    first = manifests.event(SCALER_REF, "ScaledUp", "m", "Normal", NOW)
    later = manifests.event(SCALER_REF, "ScaledUp", "m", "Normal", NOW + timedelta(microseconds=1))
    same_instant = manifests.event(
        SCALER_REF, "ScaledUp", "m", "Normal", NOW.astimezone(timezone(timedelta(hours=2)))
    )
    assert first["metadata"]["name"] != later["metadata"]["name"]
    assert first["metadata"]["name"] == same_instant["metadata"]["name"]
    assert same_instant["firstTimestamp"] == "2025-01-06T08:00:00Z"


def test_event_truncates_long_messages():
    ev = manifests.event(SCALER_REF, "ScaledUp", "y" * 5000, "Normal", NOW)
    assert len(ev["message"]) == 1024
    assert ev["message"].endswith("...")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((SCALER_REF, "ScaledUp", "m", "Info", NOW), "type"),
        ((SCALER_REF, "scaled up", "m", "Normal", NOW), "reason"),
        (
            ({**SCALER_REF, "namespace": ""}, "ScaledUp", "m", "Normal", NOW),
            "involvedObject.namespace",
        ),
        ((SCALER_REF, "ScaledUp", "m", "Normal", NOW.replace(tzinfo=None)), "now"),
    ],
    ids=["bad-type", "bad-reason", "no-namespace", "naive-time"],
)
def test_event_rejects_bad_input(args, field):
    with pytest.raises(ConfigError) as info:
        manifests.event(*args)
    assert info.value.field == field
