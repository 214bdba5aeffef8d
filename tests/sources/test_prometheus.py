from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from predictive_scaler.clock import FakeClock
from predictive_scaler.errors import InsufficientHistoryError, SourceError
from predictive_scaler.sources import dcgm
from predictive_scaler.sources.prometheus import (
    DuplicateSeriesError,
    PartialDataError,
    PrometheusSource,
)
from tests.support.prometheus import BackfilledPrometheus, free_port, running_prometheus

RATE = 'sum(rate(requests_total{namespace="ml"}[5m]))'


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def serve(httpserver: HTTPServer, path: str, responses: list[tuple[int, object]]) -> None:
    """Answer ``path`` with ``responses`` in order (a dict as JSON, anything else as text)."""
    for status, body in responses:
        handler = httpserver.expect_ordered_request(path)
        if isinstance(body, dict):
            handler.respond_with_json(body, status=status)
        else:
            handler.respond_with_data(str(body), status=status)


def start_of(prom: BackfilledPrometheus) -> datetime:
    return prom.history.trace.start.to_pydatetime()


# -- instant and scalar_now -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "combine", "expect"),
    [
        ('requests_total{namespace="nosuch"}', "error", "missing"),
        ("vector(0) / 0", "error", "missing"),
        ("vector(1) / 0", "error", "missing"),
        ('queue_depth{namespace="dup"}', "error", DuplicateSeriesError),
        ('queue_depth{namespace="dup"}', "sum", "dup-sum"),
        ("vector(0)", "error", 0.0),
        ("scalar(vector(2.5))", "error", 2.5),
        (RATE, "error", "trace"),
    ],
    ids=["empty-is-missing", "nan-is-missing", "inf-is-missing", "duplicates-refused",
         "duplicates-summed-on-request", "zero-stays-zero", "scalar-result", "request-rate"],
)
def test_scalar_now(prometheus_server: BackfilledPrometheus, query: str, combine: str,
                    expect: object) -> None:
    h = prometheus_server.history
    now = start_of(prometheus_server) + timedelta(days=2, hours=9, minutes=30)
    src = PrometheusSource(prometheus_server.url, retries=0)
    if isinstance(expect, type):
        with pytest.raises(expect, match="sum"):
            src.scalar_now(query, now, timedelta(minutes=2), combine=combine)  # type: ignore[arg-type]
        return
    got = src.scalar_now(query, now, timedelta(minutes=2), combine=combine)  # type: ignore[arg-type]
    if expect == "missing":
        assert got.missing and math.isnan(got.value) and got.missing_reason
        return
    assert not got.missing and got.observed_at == now
    if expect == "dup-sum":
        assert got.value == sum(h.dup_values)
    elif expect == "trace":
        last5 = h.trace.slice(h.trace.index_at(now) - 5, h.trace.index_at(now)).values
        assert got.value == pytest.approx(float(np.mean(last5)), rel=1e-6)
    else:
        assert got.value == expect


@pytest.mark.parametrize(
    ("after_stop", "max_age", "missing"),
    [(timedelta(minutes=-30), timedelta(minutes=2), False),
     (timedelta(minutes=3), timedelta(minutes=2), True),
     (timedelta(minutes=3), timedelta(minutes=4), False),
     (timedelta(minutes=10), timedelta(minutes=20), True)],
    ids=["fresh", "stale-beyond-max-age", "within-max-age", "gone-after-lookback"],
)
def test_stale_gauge_is_missing(prometheus_server: BackfilledPrometheus, after_stop: timedelta,
                                max_age: timedelta, missing: bool) -> None:
    h = prometheus_server.history
    now = h.stuck_stop + after_stop
    src = PrometheusSource(prometheus_server.url, retries=0)
    got = src.scalar_now(dcgm.busy_gpus("ml", "stuck"), now, max_age,
                         freshness_query=dcgm.freshness("ml", "stuck"))
    assert got.missing is missing
    if missing:
        assert "old" in got.missing_reason or "no " in got.missing_reason
    else:
        assert got.value > 0 and got.observed_at is not None and now - got.observed_at <= max_age


def test_instant_returns_labelled_samples(prometheus_server: BackfilledPrometheus) -> None:
    now = start_of(prometheus_server) + timedelta(days=1)
    samples = PrometheusSource(prometheus_server.url).instant('rate(requests_total{namespace="ml"}[5m])', now)
    assert sorted(s.labels["pod"] for s in samples) == sorted(prometheus_server.history.pods)
    assert all(s.timestamp == now and s.value > 0 for s in samples)


# -- range chunking -------------------------------------------------------------------------------
def test_range_is_chunked_within_the_point_limit(prometheus_server: BackfilledPrometheus) -> None:
    h = prometheus_server.history
    start, end = start_of(prometheus_server), h.trace.end.to_pydatetime()
    query = 'DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod=~"llm-[a-z0-9]+-[a-z0-9]+"}'
    big = PrometheusSource(prometheus_server.url)
    whole = big.range(query, start, end, 60)
    expected_points = int((end - start).total_seconds()) // 60 + 1  # 20,161 > 11,000
    assert big.requests_made == math.ceil(expected_points / 11_000)
    small = PrometheusSource(prometheus_server.url, max_points_per_series=997)
    pieces = small.range(query, start, end, 60)
    assert small.requests_made == math.ceil(expected_points / 997)
    # A point exists where a sample lies within the 5-minute lookback; the trace's gap has none.
    grid = start.timestamp() + 60 * np.arange(expected_points)
    # (the sample at t reads the trace step containing t - 60 s)
    sampled = grid[np.isfinite(h.trace.values[np.clip(np.arange(expected_points) - 1, 0, len(h.trace) - 1)])]
    sampled = sampled[sampled >= grid[0]]
    covered = grid[np.array([np.any((sampled <= t) & (sampled >= t - 300)) for t in grid])]
    assert len(covered) < expected_points
    assert len(whole) == len(pieces) == len(h.pods)
    for a, b in zip(whole, pieces, strict=True):
        assert a.labels == b.labels
        np.testing.assert_array_equal(a.timestamps, covered)  # none lost or repeated at a chunk edge
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.timestamps, b.timestamps)


# -- partial data (warnings) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def prometheus_with_broken_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus whose remote-read store is down: it answers, with warnings."""
    root: Path = tmp_path_factory.mktemp("prom-remote")
    with running_prometheus(root / "tsdb", root / "work",
                            remote_read_url=f"http://127.0.0.1:{free_port()}/read") as server:
        yield server.url


@pytest.mark.prometheus
def test_warnings_are_partial_data(prometheus_with_broken_remote: str) -> None:
    src = PrometheusSource(prometheus_with_broken_remote, retries=0)
    now = datetime.now(UTC)
    with pytest.raises(PartialDataError) as err:
        src.instant("up", now)
    assert err.value.warnings and "partial" in str(err.value)
    assert isinstance(err.value, SourceError)
    assert src.query("up", now).warnings == err.value.warnings
    src.instant("up", now, allow_partial=True)  # accepted when asked
    with pytest.raises(PartialDataError):
        src.scalar_now("sum(up)", now, timedelta(minutes=1))
    with pytest.raises(PartialDataError):
        src.range("up", now - timedelta(hours=1), now, 60)


# -- failures and retries -------------------------------------------------------------------------
def test_server_down_is_a_source_error_after_retries() -> None:
    sleeps = Sleeps()
    src = PrometheusSource(f"http://127.0.0.1:{free_port()}", retries=3, backoff_seconds=0.5, sleep=sleeps)
    with pytest.raises(SourceError, match=r"cannot connect \(connection refused\) — 4 attempt\(s\) failed"):
        src.scalar_now(RATE, datetime(2024, 1, 1, tzinfo=UTC), timedelta(minutes=2))
    assert sleeps == [0.5, 1.0, 2.0]
    assert src.requests_made == 4


def test_retries_stop_within_the_budget_on_the_injected_clock() -> None:
    clock = FakeClock(datetime(2024, 1, 1, tzinfo=UTC))
    sleeps = Sleeps()

    def sleep(seconds: float) -> None:
        sleeps(seconds)
        clock.advance(seconds)

    src = PrometheusSource(f"http://127.0.0.1:{free_port()}", retries=10, backoff_seconds=4, sleep=sleep,
                           clock=clock, retry_budget_seconds=30)
    with pytest.raises(SourceError, match=r"5 attempt\(s\) failed"):
        src.scalar_now(RATE, None, timedelta(minutes=2))
    assert sleeps == [4.0, 8.0, 8.0, 8.0]  # the next 8 s would end 36 s after the first attempt


def test_a_bad_query_is_not_retried(prometheus_server: BackfilledPrometheus) -> None:
    sleeps = Sleeps()
    src = PrometheusSource(prometheus_server.url, sleep=sleeps)
    with pytest.raises(SourceError, match="bad_data.*fix the query"):
        src.instant("sum(", start_of(prometheus_server))
    assert sleeps == [] and src.requests_made == 1


@pytest.mark.parametrize("call", ["instant", "range"])
def test_a_silent_server_times_out_and_is_retried(call: str) -> None:
    """A Prometheus that takes the connection and never answers has timed out — on the raw path and
    through prometheus-api-client alike — and says which setting to raise; it is not unreachable."""
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        sleeps = Sleeps()
        src = PrometheusSource(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.2,
                               retries=1, sleep=sleeps, timeout_setting="--timeout")
        at = datetime(2024, 1, 1, tzinfo=UTC)
        with pytest.raises(SourceError, match=r"timed out after 0.2 s — 2 attempt\(s\) failed") as caught:
            if call == "instant":
                src.instant("up", at)
            else:
                src.range("up", at - timedelta(hours=1), at, 60)
        assert "raise --timeout (now 0.2 s)" in str(caught.value)
        assert "cannot connect" not in str(caught.value)
        assert len(sleeps) == 1


OK_BODY = {"status": "success", "data": {"resultType": "vector",
                                         "result": [{"metric": {}, "value": [1704067200, "42"]}]}}


@pytest.mark.parametrize(
    ("responses", "outcome"),
    [
        ([(503, {"status": "error", "errorType": "timeout", "error": "query timed out"}), (200, OK_BODY)], 42.0),
        ([(429, "slow down"), (502, "<html>bad gateway</html>"), (200, OK_BODY)], 42.0),
        ([(500, "oops")] * 3, r"3 attempt\(s\) failed"),
        ([(200, "<html>grafana</html>")], "an HTML page"),
        ([(200, "hello")], "not Prometheus JSON"),
        ([(422, {"status": "error", "errorType": "execution",
                 "error": "many-to-many matching not allowed"})], "execution: many-to-many"),
        ([(200, {"status": "success", "data": {"resultType": "string", "result": [1, "x"]}})], "string"),
        ([(200, {"status": "success", "data": {"resultType": "vector",
                                               "result": [{"metric": {}, "value": [1, "abc"]}]}})],
         "non-numeric"),
    ],
    ids=["503-then-ok", "429-502-then-ok", "5xx-exhausts-retries", "html-body", "text-body", "422-execution",
         "string-result", "garbage-value"],
)
def test_http_faults(httpserver: HTTPServer, responses: list[tuple[int, object]], outcome: object) -> None:
    serve(httpserver, "/api/v1/query", responses)
    sleeps = Sleeps()
    src = PrometheusSource(httpserver.url_for("/"), retries=2, sleep=sleeps)
    at = datetime(2024, 1, 1, tzinfo=UTC)
    if isinstance(outcome, float):
        assert src.scalar_now("x", at, timedelta(minutes=2)).value == outcome
        assert len(sleeps) == len(responses) - 1
    else:
        with pytest.raises(SourceError, match=str(outcome)):
            src.scalar_now("x", at, timedelta(minutes=2))
    request = httpserver.log[0][0]
    assert request.args["query"] == "x" and float(request.args["time"]) == at.timestamp()


@pytest.mark.parametrize(
    "make",
    [lambda: PrometheusSource("prometheus:9090"), lambda: PrometheusSource("http://p", timeout=0),
     lambda: PrometheusSource("http://p", retries=-1),
     lambda: PrometheusSource("http://p", max_points_per_series=20_000),
     lambda: PrometheusSource("http://p").instant("up", datetime(2024, 1, 1)),
     lambda: PrometheusSource("http://p").range("up", datetime(2024, 1, 2, tzinfo=UTC),
                                                datetime(2024, 1, 1, tzinfo=UTC), 60),
     lambda: PrometheusSource("http://p").range("up", datetime(2024, 1, 1, tzinfo=UTC),
                                                datetime(2024, 1, 2, tzinfo=UTC), 0.5)],  # type: ignore[arg-type]
    ids=["no-scheme", "zero-timeout", "negative-retries", "points-over-limit", "naive-time",
         "end-before-start", "sub-second-step"],
)
def test_bad_arguments_are_refused_before_any_request(make) -> None:
    with pytest.raises(SourceError):
        make()


def test_the_injected_clock_is_the_default_time(prometheus_server: BackfilledPrometheus) -> None:
    from predictive_scaler.clock import FakeClock

    now = start_of(prometheus_server) + timedelta(days=3, minutes=11)
    src = PrometheusSource(prometheus_server.url, clock=FakeClock(now))
    assert src.scalar_now(RATE, None, timedelta(minutes=2)) == src.scalar_now(RATE, now, timedelta(minutes=2))
    assert [s.timestamp for s in src.instant("vector(1)")] == [now]


def test_missing_binaries_fail_the_test_never_skip() -> None:
    from tests.support.prometheus import require_binary

    with pytest.raises(pytest.fail.Exception, match="install Debian's `prometheus`"):
        require_binary("prometheus-that-is-not-installed")


def test_factory_serves_a_custom_history(prometheus_factory) -> None:
    import pandas as pd

    from predictive_scaler.series import Series
    from predictive_scaler.sources.history import pull_history
    from tests.support.openmetrics import CounterFamily

    start = pd.Timestamp("2024-05-01T00:00:00Z")
    short = Series(values=np.full(9 * 24 * 12, 12.0), start=start, step_seconds=300, name="nine_days")
    server = prometheus_factory(counters=[CounterFamily(name="hits_total", series=short, pods=["a-0", "a-1"],
                                                        labels={"namespace": "short"})])
    src = PrometheusSource(server.url)
    pulled = pull_history(src, 'sum(rate(hits_total{namespace="short"}[5m]))', start.to_pydatetime(),
                          (start + pd.Timedelta(days=9)).to_pydatetime(), 300, min_history=None)
    np.testing.assert_allclose(pulled.values[np.isfinite(pulled.values)], 12.0, rtol=0.05)
    # A metric that stopped 12 days ago: its history runs to the pull (one rule: observed_history), and
    # the 12 silent days are missing steps — too many of them.
    with pytest.raises(InsufficientHistoryError, match=r"57% of the 6,048 steps are missing .*9\.0 days observed"):
        pull_history(src, 'sum(rate(hits_total{namespace="short"}[5m]))', start.to_pydatetime(),
                     (start + pd.Timedelta(days=21)).to_pydatetime(), 300)


def test_demand_samples_are_the_planners_type() -> None:
    from predictive_scaler.core.values import DemandSample
    from predictive_scaler.core.values import DemandSample as CoreDemandSample
    from predictive_scaler.core.values import DemandSample as PlannerDemandSample

    assert DemandSample is PlannerDemandSample is CoreDemandSample  # one definition, in the core
    missing = DemandSample.absent("no series")
    assert missing.missing and missing.observed_at is None and missing.missing_reason == "no series"


EMPTY_BODY = {"status": "success", "data": {"resultType": "vector", "result": []}}
NAN_BODY = {"status": "success", "data": {"resultType": "vector",
                                          "result": [{"metric": {}, "value": [1704067200, "NaN"]}]}}


@pytest.mark.parametrize(
    ("earlier", "says_skew"),
    [(OK_BODY, True), (EMPTY_BODY, False), (NAN_BODY, False), (None, False)],
    ids=["data-15m-earlier", "empty-earlier-too", "nan-earlier", "probe-fails"],
)
def test_an_empty_answer_names_possible_clock_skew_only_when_earlier_data_exists(
    httpserver: HTTPServer, earlier: dict[str, object] | None, says_skew: bool
) -> None:
    at = datetime(2024, 1, 1, 12, tzinfo=UTC)
    probe_at = at - timedelta(minutes=15)
    def answer(request: Request) -> Response:
        if float(request.args["time"]) == at.timestamp():
            return Response(json.dumps(EMPTY_BODY), content_type="application/json")
        if earlier is None:
            return Response('{"status": "error", "errorType": "bad_data", "error": "nope"}', status=400,
                            content_type="application/json")
        return Response(json.dumps(earlier), content_type="application/json")

    httpserver.expect_request("/api/v1/query").respond_with_handler(answer)
    src = PrometheusSource(httpserver.url_for("/"), retries=0, sleep=Sleeps())
    sample = src.scalar_now("x", at, timedelta(minutes=2))
    reason = sample.missing_reason or ""
    assert math.isnan(sample.value) and "returned no series" in reason
    assert ("possible clock skew" in reason) is says_skew, reason
    assert "check" in reason  # says what to do either way
    assert [float(r.args["time"]) for r, _ in httpserver.log] == [at.timestamp(), probe_at.timestamp()]


def test_a_present_value_costs_no_probe(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/api/v1/query").respond_with_json(OK_BODY)
    src = PrometheusSource(httpserver.url_for("/"), retries=0, sleep=Sleeps())
    assert src.scalar_now("x", datetime(2024, 1, 1, tzinfo=UTC), timedelta(minutes=2)).value == 42.0
    assert len(httpserver.log) == 1


# -- prometheus-api-client: range pulls and the connection check ----------------------------------
MATRIX_BODY = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"pod": "a"}, "values": [[1704067200, "1"], [1704067260, "NaN"], [1704067320, "3"]]}]}}


def test_range_pulls_go_through_prometheus_api_client(prometheus_server: BackfilledPrometheus,
                                                     client_calls: list[str]) -> None:
    calls = client_calls
    h = prometheus_server.history
    src = PrometheusSource(prometheus_server.url, max_points_per_series=1000)
    query = 'DCGM_FI_DEV_GPU_UTIL{namespace="ml",pod=~"llm-[a-z0-9]+-[a-z0-9]+"}'
    start = start_of(prometheus_server)
    series = src.range(query, start, start + timedelta(hours=30), 60)
    assert calls == [query] * math.ceil((30 * 60 + 1) / 1000) == [query] * src.requests_made
    assert len(series) == len(h.pods) and all(np.isfinite(s.values).any() for s in series)


@pytest.mark.parametrize(
    ("responses", "outcome"),
    [
        ([(503, {"status": "error", "errorType": "timeout", "error": "query timed out"}), (200, MATRIX_BODY)], 3),
        ([(500, "oops")] * 3, r"3 attempt\(s\) failed"),
        ([(200, "<html>grafana</html>")], "an HTML page"),
        ([(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})], "bad_data: parse error"),
        ([(200, {**MATRIX_BODY, "warnings": ["remote store down"]})], "remote store down"),
        ([(200, {"status": "success", "data": {"resultType": "vector", "result": []}})], "not a matrix"),
    ],
    ids=["503-then-ok", "5xx-exhausts-retries", "html-body", "400-bad-data", "warnings", "vector-result"],
)
def test_range_faults_through_the_client(httpserver: HTTPServer, responses: list[tuple[int, object]],
                                         outcome: object) -> None:
    """The client drops everything but data.result; errors and warnings still read as on the raw path."""
    serve(httpserver, "/api/v1/query_range", responses)
    sleeps = Sleeps()
    src = PrometheusSource(httpserver.url_for("/"), retries=2, sleep=sleeps)
    start = datetime.fromtimestamp(1704067200, UTC)
    if isinstance(outcome, int):
        (series,) = src.range("x", start, start + timedelta(minutes=2), 60)
        assert len(series.values) == outcome and np.isnan(series.values[1])
        assert sleeps == [0.5]
    else:
        with pytest.raises(SourceError, match=str(outcome)):
            src.range("x", start, start + timedelta(minutes=2), 60)
        assert len(sleeps) == len(responses) - 1


def test_connection_check(prometheus_server: BackfilledPrometheus) -> None:
    assert PrometheusSource(prometheus_server.url).check_connection(2.0) is None
    problem = PrometheusSource(f"http://127.0.0.1:{free_port()}").check_connection(2.0)
    assert problem is not None and "unreachable" in problem


@pytest.mark.parametrize(("status", "verdict"), [
    (200, "ok"), (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"),
    (400, "refused"), (422, "refused"), (204, "refused"), (302, "redirect"), (307, "redirect"),
    (401, "credentials"), (403, "permission"), (404, "no-api"),
])
def test_the_http_status_alone_says_retry_refused_or_ok(status: int, verdict: str) -> None:
    from predictive_scaler.sources.prometheus import _status_verdict

    assert _status_verdict(status) == verdict
