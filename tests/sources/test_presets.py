"""Server presets against a real Prometheus holding the series vLLM and TGI export.

Two pods of a target ``llm`` (and a decoy ``llm-canary``) export, per pod: vLLM's
``vllm:prompt_tokens_total`` / ``vllm:generation_tokens_total`` counters and its
``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` gauges; TGI's histogram sums
``tgi_request_input_length_sum`` / ``tgi_request_generated_tokens_sum`` and its
``tgi_batch_current_size`` / ``tgi_queue_size`` gauges. The preset's demand query must read
the target's tokens/s and requests in flight, and nothing of the decoy's.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from predictive_scaler.errors import ConfigError
from predictive_scaler.series import Series
from predictive_scaler.sources.demand import demand_history, serving_queries
from predictive_scaler.sources.history import pull_history
from predictive_scaler.sources.prometheus import PrometheusSource
from predictive_scaler.spec import ScalerSpec
from tests.support.openmetrics import CounterFamily, GaugeFamily
from tests.support.prometheus import PrometheusServer

START = pd.Timestamp("2025-03-03T00:00:00Z")
STEP = 60
STEPS = 60
PODS = ("llm-5d6f7b8c9-aaaaa", "llm-5d6f7b8c9-bbbbb")
DECOY = "llm-canary-5d6f7b8c9-zzzzz"
PROMPT, GENERATED = 1200.0, 800.0  # tokens/s of the whole target
RUNNING, WAITING = 24.0, 6.0  # per pod


def _const(value: float) -> Series:
    return Series(np.full(STEPS, value), START, STEP)


def _counter(name: str, per_target: float) -> list[CounterFamily]:
    return [CounterFamily(name, _const(per_target), PODS, labels={"namespace": "ml"}, reset_every=None),
            ]


def _gauge(name: str, per_pod: float) -> GaugeFamily:
    pods = [({"namespace": "ml", "pod": p}, _const(per_pod)) for p in PODS]
    return GaugeFamily(name, pods + [({"namespace": "ml", "pod": DECOY}, _const(1000.0))])


def _sum_as_gauge(name: str, per_target: float) -> GaugeFamily:
    # A histogram's _sum is a counter without _total: written as the cumulative samples a scrape shows.
    t = np.arange(STEPS) * STEP
    cum = Series(per_target / len(PODS) * t.astype(float), START, STEP)
    return GaugeFamily(name, [({"namespace": "ml", "pod": p}, cum) for p in PODS])


@pytest.fixture(scope="module")
def server(prometheus_factory: object) -> PrometheusServer:
    counters = [
        *_counter("vllm:prompt_tokens_total", PROMPT), *_counter("vllm:generation_tokens_total", GENERATED),
        CounterFamily("vllm:request_success_total", _const(9999.0), (DECOY,), labels={"namespace": "ml"},
                      reset_every=None),
    ]
    gauges = [_gauge("vllm:num_requests_running", RUNNING), _gauge("vllm:num_requests_waiting", WAITING),
              _gauge("tgi_batch_current_size", RUNNING), _gauge("tgi_queue_size", WAITING),
              _sum_as_gauge("tgi_request_input_length_sum", PROMPT),
              _sum_as_gauge("tgi_request_generated_tokens_sum", GENERATED)]
    return prometheus_factory(counters=counters, gauges=gauges, sample_step=15)  # type: ignore[operator]


def _spec(kind: str, preset: str) -> ScalerSpec:
    return ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {"kind": kind, "preset": preset},
                                 "capacity": {"requestsPerReplica": 10}})


@pytest.mark.parametrize(("kind", "preset", "want"), [
    ("tokens", "vllm", PROMPT + GENERATED), ("tokens", "tgi", PROMPT + GENERATED),
    ("concurrency", "vllm", len(PODS) * (RUNNING + WAITING)), ("concurrency", "tgi", len(PODS) * (RUNNING + WAITING)),
])
def test_preset_query_reads_the_servers_own_series(server: PrometheusServer, kind: str, preset: str,
                                                   want: float) -> None:
    source = PrometheusSource(server.url, retries=0, timeout=20)
    query = demand_history(_spec(kind, preset), "ml").query
    got = pull_history(source, query, START + timedelta(minutes=10), START + timedelta(minutes=50), 60,
                       min_history=None)
    assert np.isfinite(got.values).all(), query
    np.testing.assert_allclose(got.values, want, rtol=0.02, err_msg=query)


def test_concurrency_preset_is_fresh_only_while_the_gauges_are() -> None:
    history = demand_history(_spec("concurrency", "vllm"), "ml")
    assert history.freshness_query is not None and "vllm:num_requests_running" in history.freshness_query


def test_label_values_are_escaped_and_bad_names_refused() -> None:
    spec = ScalerSpec.from_dict({"target": {"name": 'x"} or vector(1e9) #'}, "demand": {"kind": "tokens",
                                 "preset": "vllm"}, "capacity": {"requestsPerReplica": 10}})
    with pytest.raises(ConfigError):
        demand_history(spec, "ml")


def test_triton_has_no_tokens_and_concurrency_is_littles_law() -> None:
    with pytest.raises(ConfigError, match="token"):
        ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {"kind": "tokens", "preset": "triton"},
                              "capacity": {"requestsPerReplica": 10}})
    assert "nv_inference_request_duration_us" in demand_history(_spec("concurrency", "triton"), "ml").query


def test_given_serving_queries_win_and_take_the_window() -> None:
    spec = ScalerSpec.from_dict({"target": {"name": "llm"}, "demand": {
        "kind": "requests", "query": "sum(rate(r_total[2m]))", "servedQuery": "sum(rate(r_total[$window]))",
        "latencyQuery": "sum(rate(l_sum[$window])) / sum(rate(l_count[$window]))"},
        "capacity": {"requestsPerReplica": 10, "slo": {"noWaiting": True, "windowSeconds": 30}}})
    q = serving_queries(spec, "ml")
    assert q is not None and q.served == "sum(rate(r_total[30s]))" and "[30s]" in q.mean_latency
    assert q.replicas is None and q.running is None
