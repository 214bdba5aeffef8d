"""Hostile Prometheus answers through `backtest --prometheus` and `retrain`, served from loopback.

Whatever answers at the Prometheus URL — a proxy, a login page, a buggy exporter behind a recording
rule, or an attacker — the commands must neither train on nor promote what it says, nor follow it
elsewhere, nor print the URL's password, and must say what is wrong, where and what to do:

- **security**: redirects to another host, port or scheme (and loops, Locations holding
  credentials, redirects without a Location) are refused before they are followed — the servers on
  127.0.0.2 and on another port of 127.0.0.1 never see a request; the URL's password never shows in
  stdout, stderr, the logs (at DEBUG) or any file written (the JSON, the report, the saved history,
  the retraining record), on success or failure, even when the server echoes it back;
- **impossible demand**: negative values, ±Inf, absurd magnitudes, non-numbers, malformed
  matrices, duplicate or unordered timestamps are refused naming the query, the sample's UTC time
  and the kind of value; NaN (Prometheus's 0/0) is missing data — never 0 — and named as NaN;
- **wrong reasons**: a slow Prometheus is "timed out" (and names --timeout), a closed port "cannot
  connect", 401/403/404/HTML pages say credentials, permission, path or "not Prometheus".

`retrain` exits 1 with the reason when its source fails (the weekly CronJob shows failed) and 0 when a
scaler is only skipped for short history; `backtest` exits 2. Every case runs the real CLI
(``tests/reliability/hostile.py``) with the answering server's URL, credentials included, as ``{prom}``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from predictive_scaler.forecasting.store import ModelStore
from tests.reliability.hostile import Case, Ran, check, ids
from tests.support.prometheus import free_port

SECRET = "h0stile-s3cret"
AUTH = f"admin:{SECRET}@"
QUERY = 'sum(rate(web_requests_total{namespace="ml"}[5m]))'
#: The first bad sample of the cases that plant one: inside the first chunk of every pull below.
BAD_AT = "2024-01-03T12:00:00Z"
BAD_EPOCH = int(pd.Timestamp(BAD_AT).timestamp())

SCALER = f"""\
apiVersion: predictive-scaler.io/v1alpha1
kind: PredictiveScaler
metadata: {{name: web, namespace: ml}}
spec:
  target: {{name: web}}
  demand: {{query: '{QUERY}'}}
  capacity: {{requestsPerReplica: 20}}
  maxReplicas: 20
  quantile: 0.9
  leadTimes: {{podStartSeconds: 60, nodeStartSeconds: 300}}
  prewarm:
    enabled: true
    gpusPerNode: 2
    budget: {{maxGpus: 4, pricePerGpuHour: 3.0}}
"""
FILES = {"scaler.yaml": SCALER, "s.yaml": "name: hostile\nforecasters: [persistence]\nevaluation: 1d\n"}


def backtest(extra: str = "", timeout: str = "2") -> str:
    return ("backtest --prometheus {prom} --scaler {d}/scaler.yaml --scenario {d}/s.yaml "
            f"--end 2024-01-22T00:00:00Z --days 21 --no-progress --timeout {timeout} --json {extra}")


def retrain(timeout: str = "2") -> str:
    # The scaler's model is `web`, which the store already serves: nothing may replace it.
    return ("retrain --config {d}/scaler.yaml --prometheus {prom} --store {store} --now 2024-01-16T00:00:00Z "
            f"--history 15d --holdout 1d --run-id hostile --models persistence --timeout {timeout} --json")


BACKTEST, RETRAIN = backtest(), retrain()


# -- the servers --------------------------------------------------------------------------------------------

@dataclass
class Servers:
    """The answering server (the ``httpserver`` fixture) and two that must never be asked anything."""

    main: HTTPServer
    other_host: HTTPServer  # 127.0.0.2: another host than 127.0.0.1
    other_port: HTTPServer  # 127.0.0.1, another port

    def url(self, path: str = "", *, scheme: str = "http", auth: str = AUTH) -> str:
        return f"{scheme}://{auth}127.0.0.1:{self.main.port}{path}"


Serve = Callable[[Servers], str]  # sets up the answers; returns the URL the command is given


@dataclass(frozen=True)
class PromCase(Case):
    """A case with the Prometheus answers it is run against."""

    serve: Serve = lambda s: s.url()  # noqa: E731
    #: Extra check of what the servers saw.
    seen: Callable[[Servers], None] | None = None


def demand(ts: np.ndarray) -> np.ndarray:
    return 100.0 + 50.0 * np.sin(2 * np.pi * ts / 86400)


def good(ts: np.ndarray) -> list[Any]:
    return [f"{v:.3f}" for v in demand(ts)]


def bad_at(raw: Any) -> Callable[[np.ndarray], list[Any]]:
    """Good values, but ``raw`` for the hour from :data:`BAD_AT`."""
    def values(ts: np.ndarray) -> list[Any]:
        return [raw if BAD_EPOCH <= t < BAD_EPOCH + 3600 else f"{v:.3f}" for t, v in zip(ts, demand(ts), strict=True)]
    return values


def matrix_body(result: list[Any], **extra: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix", "result": result}, **extra}


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def grid(request: Request) -> np.ndarray:
    start, end, step = (float(request.args[k]) for k in ("start", "end", "step"))
    return np.arange(start, end + step / 2, step)


def answering(make: Callable[[Request], Response], path: str = "/api/v1/query_range") -> Serve:
    """Every range query answered by ``make`` (DCGM's, which the job pulls after the demand, empty)."""
    def handle(request: Request) -> Response:
        if "DCGM" in request.args.get("query", ""):
            return json_response(matrix_body([]))
        return make(request)

    def serve(s: Servers) -> str:
        s.main.expect_request(path).respond_with_handler(handle)
        return s.url()
    return serve


def series(*values: Callable[[np.ndarray], list[Any]], times: Callable[[np.ndarray], np.ndarray] = lambda t: t,
           **extra: Any) -> Serve:
    """A matrix of one series per ``values`` over the asked grid (``times`` moves the timestamps)."""
    def make(request: Request) -> Response:
        ts = grid(request)
        result = [{"metric": {"pod": f"web-{i}"}, "values": [[float(t), v] for t, v in zip(times(ts), fn(ts), strict=True)]}
                  for i, fn in enumerate(values)]
        return json_response(matrix_body(result, **extra))
    return answering(make)


def fixed(body: Any, status: int = 200, content_type: str = "application/json",
          headers: dict[str, str] | None = None, path: str = "/api/v1/query_range") -> Serve:
    """The same answer to every query (a dict as JSON, anything else as it is)."""
    def make(request: Request) -> Response:
        text = json.dumps(body) if isinstance(body, dict | list) else str(body)
        return Response(text, status=status, content_type=content_type, headers=headers)
    return answering(make, path)


def redirect(to: Callable[[Servers], str], status: int = 302) -> Serve:
    def serve(s: Servers) -> str:
        s.main.expect_request("/api/v1/query_range").respond_with_data(
            "", status=status, headers={"Location": to(s) + "/api/v1/query_range"})
        return s.url()
    return serve


def slow(seconds: float) -> Serve:
    """Good answers, each ``seconds`` late."""
    def make(request: Request) -> Response:
        time.sleep(seconds)
        ts = grid(request)
        return json_response(matrix_body([{"metric": {}, "values": [[float(t), v] for t, v in
                                                                    zip(ts, good(ts), strict=True)]}]))
    return answering(make)


def url_only(make: Callable[[Servers], str]) -> Serve:
    return make


def one_series_twice() -> Serve:
    """The same labels twice in one answer: every sample time twice."""
    def make(request: Request) -> Response:
        ts = grid(request)
        one = {"metric": {"pod": "web-0"}, "values": [[float(t), v] for t, v in zip(ts, good(ts), strict=True)]}
        return json_response(matrix_body([one, one]))
    return answering(make)


def began(at: str) -> Serve:
    """A series that began at ``at``: Prometheus has no samples before (none in the answer, not NaN)."""
    since = pd.Timestamp(at).timestamp()

    def make(request: Request) -> Response:
        ts = grid(request)
        ts = ts[ts >= since]
        values = [[float(t), v] for t, v in zip(ts, good(ts), strict=True)]
        return json_response(matrix_body([{"metric": {}, "values": values}] if values else []))
    return answering(make)


def asked_once(s: Servers) -> None:
    assert len(s.main.log) == 1, "a refused answer is neither retried nor followed"


# -- what a retrain must leave behind ------------------------------------------------------------------------

def retrained(result: str) -> Callable[[Ran, Path], None]:
    """The run's one scaler ended ``result``; unless promoted, ``web`` still serves what it served."""
    def then(ran: Ran, work: Path) -> None:
        [scaler] = json.loads(ran.out)["scalers"]
        assert scaler["result"] in result.split("|"), scaler
        store = ModelStore(work / "store")
        versions = sorted(v.version for v in store.list("web"))
        if result in ("failed", "skipped"):
            assert len(versions) == 3, versions  # nothing published from a refused source
            assert store.pointer("web").version == versions[-1]  # type: ignore[union-attr]
            assert scaler["serving_version"] == versions[-1]
        record = work / "store" / "web" / "retrain" / "hostile.json"
        assert json.loads(record.read_text())["result"] == scaler["result"]
    return then


def absent(*texts: str) -> Callable[[Ran, Path], None]:
    """None of ``texts`` in the output or in any file under the work directory."""
    def then(ran: Ran, work: Path) -> None:
        for text in texts:
            assert text not in ran.text, text
            for path in work.rglob("*"):
                assert not path.is_file() or text.encode() not in path.read_bytes(), (text, path)
    return then


def wrote(*names: str) -> Callable[[Ran, Path], None]:
    def then(ran: Ran, work: Path) -> None:
        missing = [n for n in names if not (work / n).is_file()]
        assert not missing, missing
    return then


def rcase(id: str, serve: Serve, code: int, *says: str, result: str = "failed", argv: str = RETRAIN,
          **kw: Any) -> PromCase:
    return PromCase(id, argv, code, says, FILES, store_may_change=True, then=retrained(result), serve=serve, **kw)


def bcase(id: str, serve: Serve, *says: str, argv: str = BACKTEST, code: int = 2, **kw: Any) -> PromCase:
    return PromCase(id, argv, code, says, FILES, serve=serve, **kw)


FAILED = "1 scaler(s) failed, so this run fails (exit 1)"
IMPOSSIBLE = ("impossible value at " + BAD_AT, "web_requests_total", "fix the query or the exporter")

# -- the cases -----------------------------------------------------------------------------------------------

SECURITY: list[Case] = [
    bcase("redirect-to-another-host", redirect(lambda s: f"http://127.0.0.2:{s.other_host.port}"),
          "redirect (HTTP 302)", "127.0.0.2", "never followed", "use the address Prometheus answers at",
          seen=asked_once),
    rcase("redirect-to-another-host-retrain", redirect(lambda s: f"http://127.0.0.2:{s.other_host.port}"), 1,
          "never followed", FAILED, seen=asked_once),
    bcase("redirect-to-another-port", redirect(lambda s: f"http://127.0.0.1:{s.other_port.port}"),
          "redirect (HTTP 302)", "127.0.0.1:", "never followed", seen=asked_once),
    rcase("redirect-to-another-port-retrain", redirect(lambda s: f"http://127.0.0.1:{s.other_port.port}"), 1,
          "never followed", FAILED),
    bcase("redirect-to-https", redirect(lambda s: f"https://127.0.0.1:{s.main.port}"), "never followed",
          "https://127.0.0.1"),
    bcase("redirect-to-itself-loop", redirect(lambda s: s.url()), "never followed", seen=asked_once),
    bcase("redirect-301-permanent", redirect(lambda s: f"http://127.0.0.2:{s.other_host.port}", 301),
          "HTTP 301", "never followed"),
    bcase("redirect-307-keeps-method", redirect(lambda s: f"http://127.0.0.2:{s.other_host.port}", 307),
          "HTTP 307", "never followed"),
    bcase("redirect-308", redirect(lambda s: f"http://127.0.0.1:{s.other_port.port}", 308), "HTTP 308",
          "never followed"),
    bcase("redirect-location-holds-credentials",
          redirect(lambda s: f"http://mallory:st0len-pw@127.0.0.2:{s.other_host.port}"),
          "never followed", "http://***@127.0.0.2", then=absent("st0len-pw")),
    bcase("redirect-to-a-file-url", redirect(lambda s: "file:///etc/passwd#"), "never followed", "file:///etc/passwd"),
    bcase("redirect-without-location", fixed("", status=302, content_type="text/plain"),
          "redirect (HTTP 302) without a Location", "never followed"),
    bcase("server-echoes-the-password",
          fixed({"status": "error", "errorType": "bad_data", "error": f"bad login admin:{SECRET} for you"}, 400),
          "Prometheus refused", "bad login ***", "fix the query"),
    rcase("server-echoes-the-password-in-a-value-retrain", series(bad_at(f"{SECRET}")), 1,
          "non-numeric value", "***", FAILED),
    bcase("terminal-escapes-and-a-megabyte-in-the-error",
          fixed({"status": "error", "errorType": "bad_data",
                 "error": "\x1b[2J\x1b[32mall good\nerror: forged line\r" + "x" * 1_000_000}, 400),
          "Prometheus refused", "bad_data: \\x1b[2J", "more characters",
          then=absent("\x1b", "\nerror: forged")),
    bcase("port-not-a-number-with-credentials", url_only(lambda s: f"http://admin:{SECRET}@127.0.0.1:notaport"),
          "cannot be parsed", "http://***@127.0.0.1:notaport"),
    bcase("port-not-a-number-with-credentials-retrain",
          url_only(lambda s: f"http://admin:{SECRET}@127.0.0.1:port"), "cannot be parsed", argv=RETRAIN),
    bcase("token-in-the-query-string", url_only(lambda s: s.url(f"/?access_token={SECRET}", auth="")),
          "query string", "base URL only"),
    bcase("credentials-on-every-output-of-a-backtest", series(good), '"policies"',
          argv="-v " + backtest("--report {d}/report --save-history {d}/pulled.csv"), code=0,
          then=wrote("report/report.md", "report/report.html", "pulled.csv")),
    rcase("credentials-on-every-output-of-a-retrain", series(good), 0, '"comparison"', result="promoted|kept",
          argv="-v " + RETRAIN),
]

IMPOSSIBLE_DEMAND: list[Case] = [
    bcase("negative", series(bad_at("-5")), *IMPOSSIBLE, "-5, a negative value", "rate()"),
    rcase("negative-retrain", series(bad_at("-5")), 1, *IMPOSSIBLE, "ImpossibleValueError", FAILED),
    bcase("tiny-negative", series(bad_at("-1e-09")), *IMPOSSIBLE, "-1e-09, a negative value"),
    bcase("nan-everywhere", series(lambda ts: ["NaN"] * len(ts)), "no usable data", "were NaN",
          "0/0", "never as 0", "guard the divisor"),
    rcase("nan-everywhere-retrain-fails", series(lambda ts: ["NaN"] * len(ts)), 1, "no usable data",
          "were NaN", FAILED),
    rcase("nan-most-steps-retrain-fails", series(lambda ts: ["NaN" if (t // 3600) % 2 else f"{v:.3f}"
                                                           for t, v in zip(ts, demand(ts), strict=True)]),
          1, "missing (> 20% allowed)", "were NaN", "guard the divisor", FAILED),
    rcase("a-few-nan-steps-are-gaps-and-it-trains", series(lambda ts: ["NaN" if t % 86400 < 600 else f"{v:.3f}"
                                                                     for t, v in zip(ts, demand(ts), strict=True)]),
          0, result="promoted|kept"),
    bcase("nan-most-steps", series(lambda ts: ["NaN" if (t // 3600) % 2 else f"{v:.3f}"
                                               for t, v in zip(ts, demand(ts), strict=True)]),
          "missing (> 20% allowed)", "were NaN", "never as 0"),
    bcase("plus-inf", series(bad_at("+Inf")), *IMPOSSIBLE, "+Inf (a division by zero"),
    rcase("minus-inf-retrain", series(bad_at("-Inf")), 1, *IMPOSSIBLE, "-Inf", FAILED),
    bcase("1e308", series(bad_at("1e308")), *IMPOSSIBLE, "1e+308, above 1e+15"),
    bcase("1e999-overflows", series(bad_at("1e999")), *IMPOSSIBLE, "'1e999', a number too large for a float"),
    bcase("just-above-the-bound", series(bad_at("2e15")), *IMPOSSIBLE, "2e+15, above 1e+15"),
    bcase("string-value", series(bad_at("abc")), "non-numeric value 'abc'", "Prometheus itself"),
    bcase("json-true-value", series(bad_at(True)), "non-numeric value", "True"),
    rcase("json-null-value-retrain", series(bad_at(None)), 1, "non-numeric value", "None", FAILED),
    bcase("value-is-an-object", series(bad_at({"v": 1})), "non-numeric value"),
    bcase("good-and-negative-series", series(good, bad_at("-3")), *IMPOSSIBLE, "-3, a negative value"),
    rcase("two-good-series-retrain", series(good, good), 1, "returned 2 series", "sum(", FAILED),
    bcase("thousands-of-series", fixed(matrix_body([{"metric": {"pod": f"p{i}"}, "values": [[BAD_EPOCH, "1"]]}
                                                    for i in range(2000)])),
          "2000 series", "more than 1000", "sum("),
    bcase("scalar-where-a-matrix-is-expected", fixed({"status": "success", "data": {"resultType": "scalar",
                                                                                    "result": [BAD_EPOCH, "1"]}}),
          "returned a 'scalar', not a matrix"),
    bcase("string-where-a-matrix-is-expected", fixed({"status": "success", "data": {"resultType": "string",
                                                                                    "result": [BAD_EPOCH, "x"]}}),
          "returned a 'string', not a matrix"),
    bcase("duplicate-timestamps", series(good, times=lambda ts: np.where(ts == BAD_EPOCH + 60, BAD_EPOCH, ts)),
          "two samples of one series at " + BAD_AT, "duplicate timestamps"),
    bcase("timestamps-out-of-order", series(good, times=lambda ts: np.where(
              ts == BAD_EPOCH, BAD_EPOCH + 60, np.where(ts == BAD_EPOCH + 60, BAD_EPOCH, ts))),
          "out of time order", BAD_AT),
    bcase("one-series-twice", one_series_twice(), "duplicate timestamps"),
    bcase("samples-ten-years-off", series(good, times=lambda ts: ts + 10 * 365 * 86400),
          "outside the asked range"),
    bcase("sample-time-nan", series(good, times=lambda ts: np.full(len(ts), np.nan)), "sample time 'nan'",
          "not a time between 1970 and 9999"),
    bcase("status-error-in-a-200", fixed({"status": "error", "errorType": "bad_data", "error": "parse error"}),
          "Prometheus refused", "bad_data", "parse error", "fix the query"),
    bcase("status-neither-success-nor-error", fixed({"status": "pending", "data": {}}),
          "neither 'success' nor 'error'"),
    bcase("labels-not-strings", fixed(matrix_body([{"metric": {"pod": {"x": 1}}, "values": [[BAD_EPOCH, "1"]]}])),
          "labels that are not names and strings"),
    bcase("sample-without-a-value", fixed(matrix_body([{"metric": {}, "values": [[BAD_EPOCH]]}])),
          "malformed sample", "[time, \"value\"]"),
    bcase("result-not-a-list", fixed({"status": "success", "data": {"resultType": "matrix", "result": {"a": 1}}}),
          "malformed result"),
    bcase("no-data-object", fixed({"status": "success"}), "without a data object"),
    rcase("partial-data-warnings-retrain", series(good, warnings=["remote store eu-1 down"]), 1,
          "may be partial", "remote store eu-1 down", FAILED),
]

WRONG_REASONS: list[Case] = [
    bcase("slow-answer-timed-out", slow(1.0), "timed out after 0.5 s", "raise --timeout (now 0.5 s)",
          argv=backtest(timeout="0.5"), timeout=120),
    rcase("slow-answer-timed-out-retrain", slow(1.0), 1, "timed out after 0.5 s", "raise --timeout", FAILED,
          argv=retrain(timeout="0.5"), timeout=120),
    bcase("connection-refused", url_only(lambda s: f"http://{AUTH}127.0.0.1:{free_port()}"),
          "cannot connect (connection refused)", "Prometheus is running there"),
    rcase("connection-refused-retrain", url_only(lambda s: f"http://{AUTH}127.0.0.1:{free_port()}"), 1,
          "cannot connect (connection refused)", FAILED),
    bcase("unauthorized-401", fixed("Unauthorized", 401, "text/plain", {"WWW-Authenticate": 'Basic realm="p"'}),
          "refused the credentials (HTTP 401", "http://user:password@host"),
    bcase("forbidden-403", fixed({"status": "error", "error": "forbidden"}, 403), "denied permission (HTTP 403",
          "read access"),
    bcase("missing-path-prefix-404", fixed("404 page not found", 404, "text/plain"), "HTTP 404", "path prefix",
          "/prometheus"),
    bcase("html-login-page", fixed("<!doctype html><html><title>Sign in</title><form>…</form></html>", 200,
                                   "text/html"), "an HTML page", "login page"),
    bcase("grafana-json", fixed({"message": "Unauthorized"}), "neither 'success' nor 'error'", "Prometheus?"),
    bcase("server-error-503", fixed("upstream connect error", 503, "text/plain"), "answered HTTP 503",
          "4 attempt(s) failed", "check its logs"),
    bcase("execution-422", fixed({"status": "error", "errorType": "execution",
                                  "error": "query processing would load too many samples"}, 422),
          "Prometheus refused", "execution", "too many samples", "fix the query"),
    bcase("https-to-a-plain-http-server", url_only(lambda s: s.url(scheme="https")), "TLS", "give an http:// URL"),
    bcase("url-ends-in-api-v1", url_only(lambda s: s.url("/api/v1")), "ends in /api/v1", "base URL"),
    bcase("timeout-zero", series(good), "--timeout must be a positive number", argv=backtest(timeout="0")),
    rcase("short-history-is-skipped", began("2024-01-06T00:00:00Z"), 0, "insufficient history: 10.0 days",
          result="skipped"),
]

CASES: dict[str, list[Case]] = {
    "security": SECURITY,
    "impossible demand": IMPOSSIBLE_DEMAND,
    "wrong reasons": WRONG_REASONS,
}
ALL = [case for cases in CASES.values() for case in cases]


def test_every_class_is_large_enough() -> None:
    sizes = {name: len(cases) for name, cases in CASES.items()}
    assert sizes["security"] >= 8 and sizes["impossible demand"] >= 10 and sizes["wrong reasons"] >= 5, sizes


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[tuple[HTTPServer, HTTPServer]]:
    """Prometheus-looking servers on another host (127.0.0.2) and another port: never to be asked."""
    servers = (HTTPServer(host="127.0.0.2", port=0), HTTPServer(host="127.0.0.1", port=0))
    for server in servers:
        server.expect_request("/api/v1/query_range").respond_with_json(matrix_body([]))
        server.start()
    yield servers
    for server in servers:
        server.clear()
        server.stop()


#: Cases that take seconds: retries with their backoff, answers late on purpose, a whole backtest.
SLOW = {"slow-answer-timed-out", "slow-answer-timed-out-retrain", "connection-refused", "connection-refused-retrain",
        "server-error-503", "credentials-on-every-output-of-a-backtest"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c.id in SLOW else [])
                                  for c in ALL], ids=ids(ALL))
def test_hostile_prometheus(case: PromCase, work: Path, httpserver: HTTPServer,
                            elsewhere: tuple[HTTPServer, HTTPServer], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    servers = Servers(httpserver, *elsewhere)
    for other in elsewhere:
        other.clear_log()
    ran = check(case, work, prom=case.serve(servers))
    assert [other.log for other in elsewhere] == [[], []], "a request reached another server"
    absent(SECRET)(ran, work)
    assert SECRET not in caplog.text, "the password reached the logs"
    if case.seen is not None:
        case.seen(servers)
