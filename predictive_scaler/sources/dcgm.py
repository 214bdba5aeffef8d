"""PromQL for NVIDIA DCGM exporter metrics of one workload's pods.

The exporter labels each GPU's series with the pod holding it (``namespace``,
``pod``, ``container``). When Prometheus scrapes the exporter without
``honorLabels``, those become ``exported_namespace``/``exported_pod``: pass
:class:`DcgmLabels` to say which names your setup uses.

Every label value that comes from a spec is escaped: a workload name is user
input, and pasting it into PromQL unescaped would let ``"} or vector(1e9) #``
rewrite the query (PromQL injection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from predictive_scaler.errors import ConfigError
from predictive_scaler.series import format_duration

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # % of time a kernel ran
FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"  # ratio 0–1
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0–1

#: Allocated GPUs below this utilisation for the whole idle window count as idle (waste).
IDLE_UTIL_PERCENT = 5.0
IDLE_WINDOW = timedelta(minutes=10)

# Kubernetes object names (RFC 1123 subdomain / label): what a namespace or Deployment name may be.
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class DcgmLabels:
    """Names of the labels that carry the pod's namespace and name on DCGM series."""

    namespace: str = "namespace"
    pod: str = "pod"

    def __post_init__(self) -> None:
        for value in (self.namespace, self.pod):
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", value):
                raise ConfigError(f"DCGM label name {value!r} is not a Prometheus label name",
                                  field="dcgmLabels")


DEFAULT_LABELS = DcgmLabels()
EXPORTED_LABELS = DcgmLabels(namespace="exported_namespace", pod="exported_pod")


def escape_label_value(value: str) -> str:
    """Escape a string for a double-quoted PromQL label value (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_regex(value: str) -> str:
    """Escape a literal for a RE2 regex matcher (before quoting it with :func:`escape_label_value`)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", value)


#: What follows ``<workload>-`` in a pod name: a Deployment's ``<template-hash>-<suffix>`` or a
#: StatefulSet's ``<ordinal>``. Narrower than ``-.*`` so that Deployment ``llm`` does not
#: claim the pods of ``llm-canary`` (``llm-canary-5d6f7b8c9-zzzzz``).
POD_SUFFIX_REGEX = "([a-z0-9]+-)?[a-z0-9]+"


def pod_selector(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS) -> str:
    """``{namespace="ns",pod=~"name-<suffix>"}`` — the GPUs held by the pods of ``workload``."""
    _check_name(namespace, "namespace")
    _check_name(workload, "workload")
    pod_regex = escape_label_value(escape_regex(workload) + "-" + POD_SUFFIX_REGEX)
    return f'{{{labels.namespace}="{escape_label_value(namespace)}",{labels.pod}=~"{pod_regex}"}}'


def busy_gpus(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS) -> str:
    """GPUs' worth of busy time: Σ utilisation/100 (4 GPUs at 50 % → 2 busy GPUs)."""
    return f"sum({GPU_UTIL}{pod_selector(namespace, workload, labels)}) / 100"


def mean_utilisation(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS) -> str:
    """Mean GPU utilisation (%) across the workload's GPUs."""
    return f"avg({GPU_UTIL}{pod_selector(namespace, workload, labels)})"


def allocated_gpus(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS) -> str:
    """Number of GPUs reporting for the workload."""
    return f"count({GPU_UTIL}{pod_selector(namespace, workload, labels)})"


def idle_allocated_gpus(
    namespace: str,
    workload: str,
    labels: DcgmLabels = DEFAULT_LABELS,
    *,
    threshold_percent: float = IDLE_UTIL_PERCENT,
    window: timedelta = IDLE_WINDOW,
) -> str:
    """GPUs whose utilisation stayed below ``threshold_percent`` for the whole ``window``.

    ``< bool`` makes a GPU that is busy count 0 rather than vanish, so the sum
    is 0 when none is idle and empty only when no GPU reports at all — no data
    must stay distinguishable from no waste.
    """
    if not 0 < threshold_percent <= 100:
        raise ConfigError(f"idle threshold {threshold_percent}% must be in (0, 100]", field="idleThreshold")
    rng = _range(window)
    sel = pod_selector(namespace, workload, labels)
    return f"sum(max_over_time({GPU_UTIL}{sel}[{rng}]) < bool {threshold_percent:g})"


def mean_sm_active(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS,
                   *, window: timedelta = IDLE_WINDOW) -> str:
    """Mean SM activity (0–1) over ``window``; below 0.2 is a waste signal."""
    return f"avg(avg_over_time({SM_ACTIVE}{pod_selector(namespace, workload, labels)}[{_range(window)}]))"


def freshness(namespace: str, workload: str, labels: DcgmLabels = DEFAULT_LABELS,
              metric: str = GPU_UTIL) -> str:
    """Time of the *oldest* latest sample among the workload's GPUs: stale if any GPU stopped reporting."""
    return f"min(timestamp({metric}{pod_selector(namespace, workload, labels)}))"


def _range(window: timedelta) -> str:
    secs = window.total_seconds()
    if secs < 1 or secs != int(secs):
        raise ConfigError(f"window {window} must be a whole number of seconds ≥ 1", field="window")
    return format_duration(window)


def _check_name(value: str, what: str) -> None:
    # Escaping makes any string safe; refusing non-Kubernetes names as well catches typos early.
    if not value or len(value) > 253 or not _K8S_NAME.match(value):
        raise ConfigError(
            f"{what} {value!r} is not a Kubernetes object name (lower-case letters, digits, '-' and "
            "'.', starting and ending with a letter or digit)", field=what)
