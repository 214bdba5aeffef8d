"""Placeholder pods on the nodes the inference pods use: node affinity, the Karpenter NodePool
shortcut and the do-not-disrupt annotation, from the spec down to the Deployment written."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from predictive_scaler import spec as spec_module
from predictive_scaler.errors import ConfigError
from predictive_scaler.kube import manifests
from predictive_scaler.spec import ScalerSpec
from tests.kube.shared import NS, placeholder_spec

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
H100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
POOL = {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-h100"]}
AFFINITY = {
    REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [H100]},
                                     {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]},
    PREFERRED: [{"weight": 50, "preference": {"matchExpressions": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}}],
}


def _deployment(**overrides):
    args = dict(scaler_name="llm", namespace="ml", owner_uid="u-1", replicas=2, gpus_per_pod=8)
    args.update(overrides)
    return manifests.placeholder_deployment(**args)


def _pod(deployment):
    return deployment["spec"]["template"]


def test_without_affinity_or_karpenter_options_the_pod_is_unchanged():
    pod = _pod(_deployment())
    assert "affinity" not in pod["spec"] and "annotations" not in pod["metadata"]
    assert manifests.placeholder_node_affinity(None) is None
    assert manifests.placeholder_node_affinity({PREFERRED: []}) is None


def test_node_pool_alone_becomes_one_required_term():
    assert manifests.placeholder_node_affinity(None, "gpu-h100") == {
        REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [POOL]}]}}


def test_node_pool_is_anded_into_every_required_term_and_the_input_is_not_changed():
    given = copy.deepcopy(AFFINITY)
    built = manifests.placeholder_node_affinity(given, "gpu-h100")
    assert given == AFFINITY
    terms = built[REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [H100, POOL]},
                     {"matchExpressions": [{"key": "gpu", "operator": "Exists"}, POOL]}]
    assert built[PREFERRED] == AFFINITY[PREFERRED]


def test_the_deployment_carries_the_affinity_and_the_do_not_disrupt_annotation():
    deployment = _deployment(affinity=AFFINITY, node_pool="gpu-h100", do_not_disrupt=True)
    pod = _pod(deployment)
    assert pod["spec"]["affinity"] == {"nodeAffinity": manifests.placeholder_node_affinity(AFFINITY, "gpu-h100")}
    assert pod["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    assert pod["metadata"]["labels"] == manifests.placeholder_labels("llm")  # the selector still matches
    kubernetes_validate.validate(deployment, "1.33", strict=True)


@pytest.mark.parametrize("change", [
    {"affinity": AFFINITY}, {"node_pool": "gpu-h100"}, {"do_not_disrupt": True}], ids=lambda c: next(iter(c)))
def test_each_option_changes_the_template_hash_so_the_placeholder_is_re_templated(change):
    before = _deployment()["metadata"]["annotations"][manifests.TEMPLATE_HASH_ANNOTATION]
    after = _deployment(**change)["metadata"]["annotations"][manifests.TEMPLATE_HASH_ANNOTATION]
    assert before != after


def test_an_empty_preferred_list_hashes_like_no_affinity():
    assert _deployment(affinity={PREFERRED: []}) == _deployment()


@pytest.mark.parametrize(("affinity", "node_pool", "field"), [
    ({"podAffinity": {}}, None, "spec.prewarm.affinity.podAffinity"),
    ({REQUIRED: {"nodeSelectorTerms": []}}, None, f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms"),
    ({REQUIRED: {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In"}]}]}}, None,
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions"),
    ({REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": ["gpu"]}]}}, None,
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0]"),
    ({PREFERRED: [{"weight": 0, "preference": {"matchExpressions": [H100]}}]}, None,
     f"spec.prewarm.affinity.{PREFERRED}[0].weight"),
    ({REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [POOL]}]}}, "gpu-h100", "spec.prewarm.nodePool"),
    (None, "GPU_Pool", "spec.prewarm.nodePool"),
    ("node-affinity", None, "spec.prewarm.affinity"),
], ids=["unknown-key", "no-terms", "match-fields-only", "expression-not-an-object", "weight-zero",
        "node-pool-twice", "node-pool-not-a-name", "not-an-object"])
def test_a_bad_affinity_is_refused_naming_the_field(affinity, node_pool, field):
    with pytest.raises(ConfigError) as info:
        manifests.placeholder_node_affinity(affinity, node_pool)
    assert info.value.field == field


def test_do_not_disrupt_must_be_a_bool():
    with pytest.raises(ConfigError) as info:
        _deployment(do_not_disrupt="yes")
    assert info.value.field == "spec.prewarm.doNotDisrupt"


def test_spec_and_manifests_name_the_same_karpenter_label():
    assert spec_module.KARPENTER_NODEPOOL_LABEL == manifests.KARPENTER_NODEPOOL_LABEL


BASE = {"target": {"name": "llm"}, "demand": {"kind": "dcgm-busy-gpus"}, "mode": "scale"}


def test_the_spec_defaults_to_no_affinity_and_no_do_not_disrupt():
    prewarm = ScalerSpec.from_dict(BASE).prewarm
    assert (prewarm.affinity, prewarm.node_pool, prewarm.do_not_disrupt) == (None, None, False)


def test_the_spec_round_trips_the_affinity_into_the_manifest_builder():
    scaler = ScalerSpec.from_dict({**BASE, "prewarm": {"enabled": True, "affinity": AFFINITY,
                                                       "nodePool": "gpu-h100", "doNotDisrupt": True}})
    assert ScalerSpec.from_dict(scaler.to_dict()) == scaler
    affinity = scaler.to_dict()["prewarm"]["affinity"]
    assert manifests.placeholder_node_affinity(affinity, scaler.prewarm.node_pool) == (
        manifests.placeholder_node_affinity(AFFINITY, "gpu-h100"))


@pytest.mark.parametrize(("prewarm", "field"), [
    ({"affinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]}]}}},
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].key"),
    ({"affinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [{**H100, "operator": "Near"}]}]}}},
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].operator"),
    ({"affinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [{**H100, "values": ["a b"]}]}]}}},
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].values"),
    ({"affinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists",
                                                                          "values": ["x"]}]}]}}},
     f"spec.prewarm.affinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].values"),
    ({"affinity": {PREFERRED: [{"weight": 101, "preference": {"matchExpressions": [H100]}}]}},
     f"spec.prewarm.affinity.{PREFERRED}[0].weight"),
    ({"affinity": {"nodeSelectorTerms": []}}, "spec.prewarm.affinity.nodeSelectorTerms"),
    ({"nodePool": "Gpu"}, "spec.prewarm.nodePool"),
    ({"doNotDisrupt": "true"}, "spec.prewarm.doNotDisrupt"),
], ids=["key", "operator", "value", "exists-with-values", "weight", "not-a-node-affinity", "node-pool", "do-not-disrupt"])
def test_the_spec_refuses_a_bad_affinity_naming_the_field(prewarm, field):
    with pytest.raises(ConfigError) as info:
        ScalerSpec.from_dict({**BASE, "prewarm": prewarm})
    assert info.value.field == field


def test_the_adapter_writes_the_affinity_and_re_templates_when_it_changes(fake_api, cluster):
    plain = placeholder_spec(fake_api)
    cluster.ensure_placeholder(plain, 1)
    karpenter = placeholder_spec(fake_api, affinity=AFFINITY, node_pool="gpu-h100", do_not_disrupt=True)
    cluster.ensure_placeholder(karpenter, 1)
    stored = fake_api.get("apps/v1", "Deployment", NS, "llm-prewarm")["spec"]["template"]
    assert stored["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"][0]["matchExpressions"] == [
        H100, POOL]
    assert stored["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}


def test_the_controller_port_builds_the_placeholder_from_the_spec():
    from predictive_scaler.controller.ports import KubeClusterPort, ScalerRef

    scaler = ScalerSpec.from_dict({**BASE, "prewarm": {"enabled": True, "affinity": AFFINITY,
                                                       "nodePool": "gpu-h100", "doNotDisrupt": True}})
    port = KubeClusterPort(None, ScalerRef("llm", NS, "u-1"), scaler)  # type: ignore[arg-type]
    pod = _pod(port.placeholder_spec.manifest(1))
    assert pod["spec"]["affinity"]["nodeAffinity"] == manifests.placeholder_node_affinity(AFFINITY, "gpu-h100")
    assert pod["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
