"""The weekly retraining as an Indexed Job: one pod per shard, a failed shard retried alone.

Both installs render the CronJob's Job with `completionMode: Indexed`, `completions` =
`retrain.shards` and `JOB_COMPLETIONS` set to the same number; Kubernetes sets
`JOB_COMPLETION_INDEX` in each pod, and `predictive-scaler retrain` reads both
(predictive_scaler/retrain/sharding.py), so pod i retrains shard i of N and the shards cover
every scaler once. `backoffLimitPerIndex` is a Kubernetes 1.29+ field (alpha, off, in 1.28): it is
rendered only when `retrain.backoffLimitPerIndex` is set. The 1.20 API server of tests/e2e serves
no batch/v1 CronJob (and would drop unknown Job fields silently), so the Job is validated here,
offline and strictly, against every Kubernetes the docs claim (1.27, the chart's kubeVersion, up
to the newest schemas bundled with kubernetes-validate).
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from predictive_scaler import cli
from predictive_scaler.core.sharding import shard_of
from predictive_scaler.retrain.sharding import (
    SHARD_COUNT_ENV,
    SHARD_INDEX_ENV,
    shard_from_environment,
)

from .helm_support import helm_render, oldest_kubernetes
from .support import OVERLAYS, one, render


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


#: Every Kubernetes the docs claim (1.27 or newer) that kubernetes-validate has schemas for.
CLAIMED = sorted({v for v in all_versions() if _minor(v) >= _minor(oldest_kubernetes())}, key=_minor)
#: Where backoffLimitPerIndex is served on by default (beta in 1.29, GA in 1.33).
PER_INDEX_FROM = (1, 29)


def _job(cronjob: dict[str, Any]) -> dict[str, Any]:
    """The Job the CronJob creates, as an object of its own."""
    template = cronjob["spec"]["jobTemplate"]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "predictive-scaler-retrain-29000000", "namespace": cronjob["metadata"]["namespace"],
                         **({"labels": template["metadata"]["labels"]} if template.get("metadata") else {})},
            "spec": template["spec"]}


def _env(spec: dict[str, Any]) -> dict[str, str]:
    (container,) = spec["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_claimed_versions_span_the_docs() -> None:
    assert CLAIMED[0] == "1.27.0" and len(CLAIMED) >= 3, CLAIMED


@pytest.mark.parametrize("which", ["helm", pytest.param("kustomize", marks=pytest.mark.kubectl)])
def test_the_default_job_is_indexed_with_one_shard(which: str) -> None:
    objs = helm_render() if which == "helm" else render(OVERLAYS["default"])
    spec = one(objs, "CronJob")["spec"]["jobTemplate"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 1, 1)
    assert spec["backoffLimit"] == 2 and "backoffLimitPerIndex" not in spec
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert _env(spec)[SHARD_COUNT_ENV] == "1"


def test_shards_and_parallelism_land_in_the_job() -> None:
    spec = one(helm_render({"retrain": {"shards": 4, "parallelism": 2}}), "CronJob")["spec"]["jobTemplate"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 2)
    assert spec["backoffLimit"] == 2 and "backoffLimitPerIndex" not in spec
    assert _env(spec)[SHARD_COUNT_ENV] == str(spec["completions"])


def test_each_pod_retrains_its_own_shard_and_the_shards_cover_every_scaler() -> None:
    objs = helm_render({"retrain": {"shards": 3, "parallelism": 3}})
    spec = one(objs, "CronJob")["spec"]["jobTemplate"]["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    args = cli.build_parser().parse_args(container["args"])
    assert args.shard_index is None and args.shard_count is None  # from the environment, as Kubernetes sets it
    keys = [f"ns{i % 4}/scaler-{i}" for i in range(60)]
    seen: list[str] = []
    for index in range(spec["completions"]):
        env = {**_env(spec), SHARD_INDEX_ENV: str(index)}  # Kubernetes adds JOB_COMPLETION_INDEX per pod
        i, n = shard_from_environment(env)
        assert (i, n) == (index, 3)
        seen += [k for k in keys if shard_of(k, n) == i]
    assert sorted(seen) == sorted(keys)


@pytest.mark.parametrize("which", ["helm", pytest.param("kustomize", marks=pytest.mark.kubectl)])
@pytest.mark.parametrize("version", CLAIMED)
def test_the_job_validates_strictly_on_every_claimed_kubernetes(which: str, version: str) -> None:
    objs = helm_render({"retrain": {"shards": 4, "parallelism": 2}}) if which == "helm" else render(OVERLAYS["default"])
    cronjob = one(objs, "CronJob")
    kubernetes_validate.validate(_job(cronjob), version, strict=True)
    kubernetes_validate.validate(cronjob, version, strict=True)


@pytest.mark.parametrize("version", CLAIMED)
def test_backoff_limit_per_index_is_rendered_only_when_asked(version: str) -> None:
    cronjob = one(helm_render({"retrain": {"shards": 4, "parallelism": 4, "backoffLimitPerIndex": 1}}), "CronJob")
    spec = cronjob["spec"]["jobTemplate"]["spec"]
    assert spec["backoffLimitPerIndex"] == 1
    # No Job-wide cap beside it (its default is then unlimited): one failing shard cannot use up the others' retries.
    assert "backoffLimit" not in spec
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # the field requires it
    if _minor(version) >= PER_INDEX_FROM:
        kubernetes_validate.validate(_job(cronjob), version, strict=True)
        kubernetes_validate.validate(cronjob, version, strict=True)
    elif _minor(version) < (1, 28):  # 1.27 does not know the field: why it is opt-in
        with pytest.raises(kubernetes_validate.ValidationError, match="backoffLimitPerIndex"):
            kubernetes_validate.validate(_job(cronjob), version, strict=True)


@pytest.mark.parametrize("values, complaint", [
    ({"retrain": {"shards": 0}}, "shards"),
    ({"retrain": {"parallelism": 0}}, "parallelism"),
    ({"retrain": {"backoffLimitPerIndex": -1}}, "backoffLimitPerIndex"),
    ({"retrain": {"shards": "2"}}, "shards"),
], ids=["no-shards", "no-parallelism", "negative-retries", "shards-as-text"])
def test_the_values_schema_refuses_mistakes(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        helm_render(values)
    assert complaint in str(info.value)
