from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from predictive_scaler.errors import ConfigError
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.prometheus import PrometheusSource
from tests.support.prometheus import BackfilledPrometheus


def source(prom: BackfilledPrometheus) -> PrometheusSource:
    return PrometheusSource(prom.url, retries=0)


def util_at(prom: BackfilledPrometheus, offset: timedelta) -> float:
    """The latest reading at start + offset: it describes the minute before the sample."""
    h = prom.history
    step = h.sample_step
    sample_time = h.trace.start + timedelta(seconds=offset.total_seconds() // step * step)
    share = h.trace.values[h.trace.index_at(sample_time - timedelta(seconds=step))] / len(h.pods)
    return float(np.clip(share / h.capacity_per_gpu * 100.0, 0.0, 100.0))


# -- pure: escaping and builders -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "escaped"),
    [("plain", "plain"), ('a"b', 'a\\"b'), ("back\\slash", "back\\\\slash"), ("line\nbreak", "line\\nbreak")],
    ids=["plain", "quote", "backslash", "newline"],
)
def test_escape_label_value(raw: str, escaped: str) -> None:
    assert dcgm.escape_label_value(raw) == escaped


@pytest.mark.parametrize(
    ("namespace", "workload"),
    [("ml", 'x"} or vector(1e9) #'), ("ml", "Upper"), ('ml"}', "llm"), ("", "llm"), ("ml", "-llm")],
    ids=["injection-in-workload", "not-a-k8s-name", "injection-in-namespace", "empty", "leading-dash"],
)
def test_selector_refuses_names_kubernetes_would_refuse(namespace: str, workload: str) -> None:
    with pytest.raises(ConfigError) as err:
        dcgm.busy_gpus(namespace, workload)
    assert err.value.field in {"namespace", "workload"}


def test_dots_in_a_name_match_literally() -> None:
    sel = dcgm.pod_selector("ml", "llama.cpp")
    assert 'llama\\\\.cpp-' in sel  # RE2 escape \. written as \\. inside the PromQL string


def test_exported_label_names_are_used() -> None:
    sel = dcgm.pod_selector("ml", "llm", dcgm.EXPORTED_LABELS)
    assert sel.startswith('{exported_namespace="ml",exported_pod=~"llm-')


# -- against the real Prometheus ------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    ['quo"te', "back\\slash", "new\nline", "uni→code", 'x"} or vector(1e9) #'],
    ids=["quote", "backslash", "newline", "unicode", "injection"],
)
def test_escaped_values_round_trip_through_promql(prometheus_server: BackfilledPrometheus, raw: str) -> None:
    at = prometheus_server.history.trace.start.to_pydatetime() + timedelta(days=1)
    query = f'label_replace(vector(1), "probe", "{dcgm.escape_label_value(raw)}", "", "")'
    [sample] = source(prometheus_server).instant(query, at)
    assert sample.labels["probe"] == raw


@pytest.mark.parametrize("offset", [timedelta(days=1, hours=3), timedelta(days=5, hours=14, minutes=7),
                                    timedelta(days=12, hours=21)], ids=["night", "midday", "late"])
def test_busy_and_mean_utilisation_of_a_workload(prometheus_server: BackfilledPrometheus,
                                                 offset: timedelta) -> None:
    h = prometheus_server.history
    at = h.trace.start.to_pydatetime() + offset
    src = source(prometheus_server)
    expected_util = util_at(prometheus_server, offset)
    [busy] = src.instant(dcgm.busy_gpus("ml", "llm"), at)
    [mean] = src.instant(dcgm.mean_utilisation("ml", "llm"), at)
    [count] = src.instant(dcgm.allocated_gpus("ml", "llm"), at)
    # llm's three pods only: not llm-canary's pod (100 %), nor the idle or stuck workloads
    assert count.value == len(h.pods)
    assert busy.value == pytest.approx(len(h.pods) * expected_util / 100.0)
    assert mean.value == pytest.approx(expected_util)


def test_idle_allocated_gpus(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    at = h.trace.start.to_pydatetime() + timedelta(days=3)
    src = source(prometheus_server)
    [idle] = src.instant(dcgm.idle_allocated_gpus("ml", "idle"), at)
    assert idle.value == sum(u < dcgm.IDLE_UTIL_PERCENT for u in h.idle_utils)
    [none_idle] = src.instant(dcgm.idle_allocated_gpus("ml", "llm-canary"), at)
    assert none_idle.value == 0  # present and zero: GPUs report, none idle
    assert src.instant(dcgm.idle_allocated_gpus("ml", "nosuch"), at) == []  # no data is not "no waste"


def test_freshness_is_the_oldest_gpu_sample(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    at = h.stuck_stop + timedelta(minutes=3)
    [stamp] = source(prometheus_server).instant(dcgm.freshness("ml", "stuck"), at)
    age = at.timestamp() - stamp.value
    assert 120 < age <= 300
