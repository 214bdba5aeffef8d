from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from predictive_scaler.errors import DataError, InsufficientHistoryError, SourceError
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.history import PrometheusMetrics, pull_history
from predictive_scaler.sources.prometheus import DuplicateSeriesError, PrometheusSource
from tests.support.prometheus import BackfilledPrometheus

RATE_5M = 'sum(rate(requests_total{namespace="ml"}[5m]))'
FRESHNESS = 'min(timestamp(requests_total{namespace="ml"}))'


def window(prom: BackfilledPrometheus) -> tuple[datetime, datetime]:
    return prom.history.trace.start.to_pydatetime(), prom.history.trace.end.to_pydatetime()


def test_sum_rate_reproduces_the_trace_across_counter_resets(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    src = PrometheusSource(prometheus_server.url)
    start, end = window(prometheus_server)
    pulled = pull_history(src, RATE_5M, start, end, 300)
    expected = h.trace.resample(300)
    assert pulled.start == expected.start and len(pulled) == len(expected) == 14 * 288
    assert pulled.step_seconds == 300
    # the resets really are in the data: every pod restarted several times
    [restarts] = src.instant(f'sum(resets(requests_total{{namespace="ml"}}[{14 * 24}h]))', end)
    assert restarts.value >= len(h.pods) * 6
    # gaps stay gaps
    gap = np.isnan(expected.values)
    assert gap.sum() == 12
    np.testing.assert_array_equal(np.isnan(pulled.values), gap)
    rel = np.abs(pulled.values[~gap] - expected.values[~gap]) / np.maximum(expected.values[~gap], 1.0)
    assert np.median(rel) < 1e-9  # exact wherever no pod restarted
    # a restart loses half a scrape interval of one pod's share: ≤ 1/3 · 30 s / 300 s ≈ 3.3 %,
    # more when that minute was busier than the 5-minute mean
    assert rel.max() < 0.06
    # only the steps with a restart differ, and the first step after the gap (4 of its 5
    # minutes were scraped; rate() extrapolates from them)
    differ = np.flatnonzero(np.abs(pulled.values - expected.values) > 1e-6 * np.maximum(expected.values, 1.0))
    assert len(differ) <= restarts.value + 1
    assert np.flatnonzero(gap)[-1] + 1 in differ


@pytest.mark.parametrize(
    ("offset_start", "min_history", "error"),
    [
        (timedelta(days=4), timedelta(days=14), InsufficientHistoryError),
        (timedelta(days=-3), timedelta(days=14), None),
        (timedelta(days=-3), timedelta(days=15), InsufficientHistoryError),
        (timedelta(days=4), None, None),
    ],
    ids=["10-days-is-too-short", "leading-nan-trimmed", "trimmed-still-14-days", "no-check"],
)
def test_history_length_counts_only_observed_days(prometheus_server: BackfilledPrometheus,
                                                  offset_start: timedelta, min_history: timedelta | None,
                                                  error: type[Exception] | None) -> None:
    start, end = window(prometheus_server)
    src = PrometheusSource(prometheus_server.url)
    with pytest.warns(UserWarning) if min_history is not None and min_history < timedelta(days=14) else _nothing():
        if error is not None:
            with pytest.raises(error, match="insufficient history"):
                pull_history(src, RATE_5M, start + offset_start, end, 300, min_history=min_history)
            return
        pulled = pull_history(src, RATE_5M, start + offset_start, end, 300, min_history=min_history)
    assert pulled.start == prometheus_server.history.trace.start + max(offset_start, timedelta(0))
    assert np.isfinite(pulled.values[0])


@pytest.mark.parametrize(("allowed", "ok"), [(0.001, False), (0.01, True)], ids=["strict", "tolerant"])
def test_too_many_gaps_is_refused(prometheus_server: BackfilledPrometheus, allowed: float, ok: bool) -> None:
    start, end = window(prometheus_server)
    src = PrometheusSource(prometheus_server.url)
    if ok:
        assert pull_history(src, RATE_5M, start, end, 300, max_missing_fraction=allowed).missing_fraction > 0
    else:
        with pytest.raises(DataError, match="missing"):
            pull_history(src, RATE_5M, start, end, 300, max_missing_fraction=allowed)


def test_duplicated_series_are_refused_or_summed_on_request(prometheus_server: BackfilledPrometheus) -> None:
    start, _ = window(prometheus_server)
    src = PrometheusSource(prometheus_server.url)
    query = 'queue_depth{namespace="dup"}'
    with pytest.raises(DuplicateSeriesError, match="sum"):
        pull_history(src, query, start, start + timedelta(hours=2), 300, min_history=None)
    summed = pull_history(src, query, start, start + timedelta(hours=2), 300, min_history=None, combine="sum")
    assert np.all(summed.values == sum(prometheus_server.history.dup_values))


def test_no_data_is_an_error_for_history_and_nan_for_recent(prometheus_server: BackfilledPrometheus) -> None:
    start, end = window(prometheus_server)
    src = PrometheusSource(prometheus_server.url)
    query = 'sum(rate(requests_total{namespace="nosuch"}[5m]))'
    with pytest.raises(DataError, match="no data"):
        pull_history(src, query, start, end, 300)
    recent = PrometheusMetrics(src, query).recent(end, timedelta(hours=1), 300)
    assert len(recent) == 12 and np.isnan(recent.values).all()


def test_metrics_port_matches_the_history_pull(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    src = PrometheusSource(prometheus_server.url)
    metrics = PrometheusMetrics(src, RATE_5M, freshness_query=FRESHNESS, max_age=timedelta(minutes=2))
    now = h.trace.start.to_pydatetime() + timedelta(days=9, hours=16, minutes=2, seconds=17)
    recent = metrics.recent(now, timedelta(hours=6), 300)
    assert len(recent) == 72
    # the last step is the last complete one: it ends at or before now
    assert recent.end.to_pydatetime() <= now < recent.end.to_pydatetime() + timedelta(minutes=5)
    expected = h.trace.resample(300)
    i0 = expected.index_at(recent.start)
    np.testing.assert_allclose(recent.values, expected.values[i0:i0 + 72], rtol=0.06)
    demand = metrics.demand_now(now)
    assert not demand.missing
    assert demand.observed_at is not None and timedelta(0) <= now - demand.observed_at < timedelta(minutes=1)
    last5 = h.trace.slice(h.trace.index_at(now) - 5, h.trace.index_at(now)).values
    assert demand.value == pytest.approx(float(np.mean(last5)), rel=0.06)


def test_metrics_port_holds_on_the_trace_gap(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    metrics = PrometheusMetrics(PrometheusSource(prometheus_server.url), RATE_5M,
                                freshness_query=FRESHNESS, max_age=timedelta(minutes=2))
    during = metrics.demand_now(h.gap[0] + timedelta(minutes=20))
    assert during.missing and during.value != 0
    just_after_start = metrics.demand_now(h.gap[0] + timedelta(minutes=3))
    assert just_after_start.missing and "old" in just_after_start.missing_reason


# (clock moves, window, step) → full (F) or incremental (I) pull each time; every result must equal a full pull.
_WALKS = {
    "minute-by-minute": ([60] * 12, 6 * 3600, 300, "F" + "I" * 12),
    "one-step-at-a-time": ([300] * 6, 6 * 3600, 300, "F" + "I" * 6),
    "odd-phases": ([37, 421, 1999, 5, 3605], 6 * 3600, 300, "FIIIII"),
    "a-jump-of-a-window-repulls": ([300, 6 * 3600, 300], 6 * 3600, 300, "FIFI"),
    "clock-back-repulls": ([600, -1200, 300], 6 * 3600, 300, "FIFI"),
    "window-not-a-step-multiple": ([300, 300], 6 * 3600 + 100, 300, "FII"),
    "across-the-trace-gap": ([300] * 30, 4 * 3600, 300, "F" + "I" * 30),
    "fifteen-minute-steps": ([300, 900, 60], 12 * 3600, 900, "FIII"),
}


@pytest.mark.parametrize(("moves", "window_s", "step", "kinds"), list(_WALKS.values()), ids=list(_WALKS))
def test_incremental_recent_equals_a_full_pull(prometheus_server: BackfilledPrometheus, moves: list[int],
                                               window_s: int, step: int, kinds: str) -> None:
    h = prometheus_server.history
    src = PrometheusSource(prometheus_server.url)
    kept = PrometheusMetrics(src, RATE_5M, name="llm")
    now = (h.gap[0] - timedelta(hours=1, seconds=13) if "I" * 30 in kinds
           else h.trace.start.to_pydatetime() + timedelta(days=9, hours=3, minutes=1, seconds=7))
    seen = ""
    for move in [0, *moves]:
        now += timedelta(seconds=move)
        full_before = kept.full_pulls
        got = kept.recent(now, timedelta(seconds=window_s), step)
        seen += "F" if kept.full_pulls > full_before else "I"
        want = PrometheusMetrics(src, RATE_5M, name="llm").recent(now, timedelta(seconds=window_s), step)
        assert (got.start, got.step_seconds, got.name, got.source) == (want.start, want.step_seconds, want.name,
                                                                         want.source)
        np.testing.assert_array_equal(got.values, want.values)  # exact, NaN where NaN
    assert seen == kinds
    if "I" * 30 in kinds:
        assert np.isnan(got.values).any()  # the walk did cross the gap: missing stays missing


def test_an_incremental_pull_asks_for_the_new_steps_only(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    src = PrometheusSource(prometheus_server.url)
    metrics = PrometheusMetrics(src, RATE_5M)
    now = h.trace.start.to_pydatetime() + timedelta(days=9, hours=3, seconds=30)
    asked: list[tuple[float, float]] = []
    original = src._range_once

    def spy(query: str, start: float, end: float, step_s: int) -> object:
        asked.append((start, end))
        return original(query, start, end, step_s)

    src._range_once = spy  # type: ignore[method-assign]
    metrics.recent(now, timedelta(days=7), 300)
    metrics.recent(now + timedelta(minutes=5), timedelta(days=7), 300)
    (full_start, full_end), (tail_start, tail_end) = asked
    assert full_end - full_start == 7 * 86400 - 60
    # the new step and the two before it (late samples), at one minute: 15 evaluations
    assert tail_end - tail_start == 3 * 300 - 60 and tail_end == full_end + 300


def test_busy_gpus_history(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    start, end = window(prometheus_server)
    src = PrometheusSource(prometheus_server.url)
    busy = pull_history(src, dcgm.busy_gpus("ml", "llm"), start, start + timedelta(days=1), 300, min_history=None)
    # a gauge at the end of each step: the util of the step's last minute, for each of the pods
    minute_util = np.clip(h.trace.values / len(h.pods) / h.capacity_per_gpu * 100, 0, 100)
    last_minute = minute_util[4 : 5 * len(busy) : 5]
    np.testing.assert_allclose(busy.values, last_minute * len(h.pods) / 100.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda src: pull_history(src, "up", datetime(2024, 1, 1, tzinfo=UTC),
                                 datetime(2024, 1, 1, 0, 4, tzinfo=UTC), 300),
        lambda src: pull_history(src, "up", datetime(2024, 1, 1), datetime(2024, 1, 2), 300),
        lambda src: pull_history(src, "up", datetime(2024, 1, 1, tzinfo=UTC),
                                 datetime(2024, 1, 2, tzinfo=UTC), 0),
        lambda src: PrometheusMetrics(src, "  "),
        lambda src: PrometheusMetrics(src, "up").recent(datetime(2024, 1, 1, tzinfo=UTC), timedelta(0), 300),
    ],
    ids=["window-shorter-than-a-step", "naive-times", "zero-step", "empty-query", "empty-window"],
)
def test_bad_arguments(call) -> None:
    with pytest.raises((DataError, SourceError)):
        call(PrometheusSource("http://127.0.0.1:9", retries=0))


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
