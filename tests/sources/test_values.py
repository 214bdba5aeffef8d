"""Every value Prometheus answers is checked as a trace's is, and every failure is named for what it is.

- a negative value, ±Inf or one above ``MAX_PLAUSIBLE_VALUE`` is refused (ImpossibleValueError: a
  DataError and a SourceError) naming the query, the sample's UTC time and the kind of value; the
  controller's live read makes it missing data with that reason (it holds, and keeps running);
- NaN (Prometheus's 0/0) is missing, never 0, and the missing-data messages count it;
- a request that fails is mapped by the exception's type: timed out, connection refused, a name
  that does not resolve, no answer to the connection — never by its text.
"""

from __future__ import annotations

import json
import math
import socket
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import requests
from pytest_httpserver import HTTPServer
from urllib3.exceptions import MaxRetryError, NameResolutionError, NewConnectionError
from werkzeug import Request, Response

from predictive_scaler.errors import DataError, SourceError
from predictive_scaler.sources.history import pull_history
from predictive_scaler.sources.prometheus import (
    ImpossibleValueError,
    NaNAnswerError,
    PrometheusSource,
    _Retryable,
    _transport_error,
)

QUERY = "sum(rate(x[5m]))"
START = datetime(2024, 1, 1, tzinfo=UTC)
BAD = START + timedelta(minutes=30)


def source(httpserver: HTTPServer, **kw: object) -> PrometheusSource:
    return PrometheusSource(httpserver.url_for("/"), retries=0, sleep=lambda s: None, **kw)  # type: ignore[arg-type]


def serve_range(httpserver: HTTPServer, value_at: dict[float, str], default: str = "5") -> None:
    """One series over the asked grid: ``default``, or ``value_at[t]``."""
    def handle(request: Request) -> Response:
        start, end, step = (float(request.args[k]) for k in ("start", "end", "step"))
        values = [[t, value_at.get(t, default)] for t in np.arange(start, end + step / 2, step)]
        body = {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
        return Response(json.dumps(body), content_type="application/json")
    httpserver.expect_request("/api/v1/query_range").respond_with_handler(handle)


def serve_instant(httpserver: HTTPServer, value: str) -> None:
    httpserver.expect_request("/api/v1/query").respond_with_json(
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, value]}]}})


@pytest.mark.parametrize(("raw", "kind"), [
    ("-5", "-5, a negative value"),
    ("-1e-12", "-1e-12, a negative value"),
    ("+Inf", "+Inf (a division by zero"),
    ("-Inf", "-Inf"),
    ("1e308", "1e+308, above 1e+15"),
    ("1e999", "'1e999', a number too large for a float"),
], ids=["negative", "tiny-negative", "plus-inf", "minus-inf", "1e308", "1e999"])
def test_an_impossible_value_in_a_range_is_refused_naming_query_time_and_kind(
        httpserver: HTTPServer, raw: str, kind: str) -> None:
    serve_range(httpserver, {BAD.timestamp(): raw, BAD.timestamp() + 60: raw})
    with pytest.raises(ImpossibleValueError) as caught:
        source(httpserver).range(QUERY, START, START + timedelta(hours=1), 60)
    message = str(caught.value)
    assert isinstance(caught.value, DataError) and isinstance(caught.value, SourceError)
    assert QUERY in message and "at 2024-01-01T00:30:00Z" in message and kind in message, message
    assert "2 such sample(s)" in message and "fix the query or the exporter" in message, message


def test_nan_and_zero_are_kept_in_a_range(httpserver: HTTPServer) -> None:
    serve_range(httpserver, {BAD.timestamp(): "NaN", BAD.timestamp() + 60: "0", BAD.timestamp() + 120: "-0"})
    [series] = source(httpserver).range(QUERY, START, START + timedelta(hours=1), 60)
    assert np.isnan(series.values[30]) and series.values[31] == 0 and series.values[32] == 0


def test_a_history_of_nan_is_named_as_nan_not_as_no_data(httpserver: HTTPServer) -> None:
    serve_range(httpserver, {}, default="NaN")
    with pytest.raises(DataError) as caught:
        pull_history(source(httpserver), QUERY, START, START + timedelta(days=1), 300, min_history=timedelta(hours=1),
                     average_from=60)
    message = str(caught.value)
    assert isinstance(caught.value, NaNAnswerError) and isinstance(caught.value, SourceError)  # the query's fault
    assert "returned no usable data" in message and "1440 of its 1440 samples were NaN" in message, message
    assert "first at 2024-01-01T00:01:00Z" in message and "never as 0" in message, message


@pytest.mark.filterwarnings("ignore:--min-history")  # an hour is enough to show the message
@pytest.mark.parametrize(("nan_minutes", "says"), [
    (range(200, 650), r"are missing \(> 20% allowed\).*; 450 of its 1440 samples were NaN"),
    (range(200, 1000), r"55% of the 288 steps are missing .*; 800 of its 1440 samples were NaN"),
    (range(1, 1380), r"insufficient history: .*; 1379 of its 1440 samples were NaN"),
], ids=["over-max-missing", "over-half", "too-short-once-trimmed"])
def test_nan_gaps_are_counted_when_history_is_refused(httpserver: HTTPServer, nan_minutes: range, says: str) -> None:
    serve_range(httpserver, {START.timestamp() + 60 * i: "NaN" for i in nan_minutes})
    with pytest.raises(DataError, match=says):
        pull_history(source(httpserver), QUERY, START, START + timedelta(days=1), 300,
                     min_history=timedelta(hours=2), max_missing_fraction=0.2, average_from=60)


@pytest.mark.parametrize(("raw", "says"), [
    ("-3", "-3, a negative value"), ("+Inf", "+Inf"), ("-Inf", "-Inf"), ("2e15", "above 1e+15"),
    ("NaN", "returned NaN at 2024-01-01T00:30:00Z"),
], ids=["negative", "plus-inf", "minus-inf", "huge", "nan"])
def test_the_controllers_live_read_makes_an_impossible_value_missing_with_its_reason(
        httpserver: HTTPServer, raw: str, says: str) -> None:
    from predictive_scaler.controller.ports import PrometheusMetricsPort
    from predictive_scaler.sources.history import PrometheusMetrics

    serve_instant(httpserver, raw)
    src = source(httpserver)
    sample = src.scalar_now(QUERY, BAD, timedelta(minutes=2))
    assert sample.missing and math.isnan(sample.value)
    assert says in (sample.missing_reason or ""), sample.missing_reason
    assert QUERY in (sample.missing_reason or "")
    port = PrometheusMetricsPort(PrometheusMetrics(src, QUERY))
    with pytest.raises(SourceError, match="missing|never 0"):  # the reconciler holds on it and goes on
        port.demand_now(BAD)


def test_the_controllers_recent_history_refuses_an_impossible_value_as_a_source_error(httpserver: HTTPServer) -> None:
    from predictive_scaler.sources.history import PrometheusMetrics

    serve_range(httpserver, {BAD.timestamp(): "-7"})
    with pytest.raises(SourceError, match="negative value"):  # reconcile.py: "no recent history for the model"
        PrometheusMetrics(source(httpserver), QUERY).recent(START + timedelta(hours=2), timedelta(hours=2), 300)


def test_an_absurd_freshness_time_is_missing_data_not_a_crash(httpserver: HTTPServer) -> None:
    def handle(request: Request) -> Response:
        value = "1e308" if "timestamp" in request.args["query"] else "4"
        body = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, value]}]}}
        return Response(json.dumps(body), content_type="application/json")

    httpserver.expect_request("/api/v1/query").respond_with_handler(handle)
    sample = source(httpserver).scalar_now(QUERY, BAD, timedelta(minutes=2), freshness_query="min(timestamp(x))")
    assert sample.missing and "not a sample time" in (sample.missing_reason or "")


def test_a_server_echoing_the_password_never_gets_it_printed(httpserver: HTTPServer) -> None:
    secret = "s3cr3t-pa55"
    serve_range(httpserver, {BAD.timestamp(): f"user:{secret}"})
    src = PrometheusSource(httpserver.url_for("/").replace("http://", f"http://user:{secret}@"), retries=0)
    with pytest.raises(SourceError, match="non-numeric") as caught:
        src.range(QUERY, START, START + timedelta(hours=1), 60)
    assert secret not in str(caught.value) and "***" in str(caught.value)


# -- failures mapped by type ------------------------------------------------------------------------------------

def _wrapped(reason: Exception) -> requests.ConnectionError:
    """What requests raises when urllib3 gives up on a connection: ConnectionError(MaxRetryError(reason))."""
    return requests.ConnectionError(MaxRetryError(None, "/api/v1/query", reason))  # type: ignore[arg-type]


def _refused() -> Exception:
    error = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    error.__cause__ = ConnectionRefusedError(111, "Connection refused")
    return error


@pytest.mark.parametrize(("exc", "says"), [
    (requests.ReadTimeout("read timed out"), "timed out after 2 s"),
    (requests.ConnectTimeout("connect timed out"), "cannot connect (no answer to the connection within 2 s)"),
    (_wrapped(_refused()), "cannot connect (connection refused)"),
    (_wrapped(NameResolutionError("prom.invalid", None, socket.gaierror(-2, "Name or service not known"))),  # type: ignore[arg-type]
     "does not resolve"),
    (requests.ConnectionError(ConnectionResetError(104, "reset")), "cannot connect (ConnectionResetError)"),
], ids=["read-timeout", "connect-timeout", "refused", "dns", "reset"])
def test_a_failed_request_is_named_by_its_type(exc: requests.RequestException, says: str) -> None:
    mapped = _transport_error(exc, "http://prom.invalid:9090", 2.0, "--timeout")
    assert isinstance(mapped, _Retryable) and says in mapped.summary, mapped
    assert ("--timeout" in mapped.advice) is ("timed out" in says or "within" in says)


def test_tls_against_plain_http_is_not_retried_and_says_which_scheme(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/api/v1/query").respond_with_json({})
    src = PrometheusSource(httpserver.url_for("/").replace("http://", "https://"), retries=3, sleep=lambda s: None)
    with pytest.raises(SourceError, match="TLS .* give an http:// URL"):
        src.instant("up", START)
    assert src.requests_made == 1


@pytest.mark.parametrize(("url", "says"), [
    ("http://admin:s3cr3t@127.0.0.1:port", "cannot be parsed"),
    ("http://admin:s3cr3t@:9090", "has no host"),
    ("http://prom:9090/?token=s3cr3t", "query string"),
    ("http://prom:9090/api/v1", "ends in /api/v1"),
    ("ftp://prom:9090", "must start with http:// or https://"),
], ids=["port-not-a-number", "no-host", "query-string", "api-path", "ftp"])
def test_a_url_requests_would_fail_on_is_refused_without_its_secrets(url: str, says: str) -> None:
    with pytest.raises(SourceError, match=says) as caught:
        PrometheusSource(url)
    assert "s3cr3t" not in str(caught.value)
