"""Prometheus over HTTP is a security boundary: no redirect is followed, no credential is printed.

A server on 127.0.0.1 answers every query with a redirect — to another host on loopback
(127.0.0.2 is another host than 127.0.0.1), to another port, or to another scheme — and the
source refuses each before requests follows it: the other server never sees a request, and the
error says why and what to do. A password in the URL shows as ``***`` in every message, log line
(at DEBUG) and file written, on success and on failure; through `backtest --prometheus`,
`retrain` and the source the controller builds from its settings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pytest_httpserver import HTTPServer

from predictive_scaler.cli import main
from predictive_scaler.errors import SourceError
from predictive_scaler.sources.prometheus import PrometheusSource, redact_url
from tests.commands.test_backtest import SCALER

SECRET = "s3cr3t-pa55"


def _prometheus_lookalike(host: str) -> Iterator[HTTPServer]:
    server = HTTPServer(host=host, port=0)
    server.expect_request("/api/v1/query").respond_with_json({"status": "success",
                                                             "data": {"resultType": "vector", "result": []}})
    server.expect_request("/api/v1/query_range").respond_with_json(
        {"status": "success", "data": {"resultType": "matrix", "result": []}})
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture
def elsewhere() -> Iterator[HTTPServer]:
    """A Prometheus-looking server on another loopback host: it must never be asked anything."""
    yield from _prometheus_lookalike("127.0.0.2")


@pytest.fixture
def other_port() -> Iterator[HTTPServer]:
    """A Prometheus-looking server on this host, another port: it must never be asked anything."""
    yield from _prometheus_lookalike("127.0.0.1")


def _target(where: str, elsewhere: HTTPServer, other_port: HTTPServer) -> str:
    return {"other-host": f"http://127.0.0.2:{elsewhere.port}", "other-port": f"http://127.0.0.1:{other_port.port}"}[where]


def _no_secret_anywhere(text: str, root: Path) -> None:
    assert SECRET not in text
    for path in root.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def _redirecting(httpserver: HTTPServer, location: str) -> str:
    """httpserver answers every path with a 302 to ``location`` + the path; its URL with credentials."""
    for path in ("/api/v1/query", "/api/v1/query_range", "/api/v1/status/buildinfo", "/"):
        httpserver.expect_request(path).respond_with_data("", status=302,
                                                          headers={"Location": location + path})
    return f"http://admin:{SECRET}@127.0.0.1:{httpserver.port}"


@pytest.mark.parametrize(("url", "shown"), [
    ("http://admin:pw@prom:9090/api", "http://***@prom:9090/api"),
    ("https://token@prom.example:443", "https://***@prom.example:443"),
    ("http://prom:9090", "http://prom:9090"),
    ("http://a:b@c@prom:9090/x?q=1", "http://***@prom:9090/x?q=1"),
    ("http://[::1]:9090", "http://[::1]:9090"),
], ids=["user-and-password", "token-only", "no-credentials", "at-in-password", "ipv6"])
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("where", ["other-host", "other-port", "other-scheme"])
@pytest.mark.parametrize("call", ["instant", "range", "check_connection"])
def test_a_redirect_is_refused_before_it_is_followed(httpserver: HTTPServer, elsewhere: HTTPServer,
                                                     where: str, call: str) -> None:
    location = {"other-host": f"http://127.0.0.2:{elsewhere.port}",
                "other-port": f"http://127.0.0.1:{elsewhere.port}",
                "other-scheme": f"https://127.0.0.1:{httpserver.port}"}[where]
    source = PrometheusSource(_redirecting(httpserver, location), timeout=2, retries=0)
    now = datetime(2026, 1, 5, tzinfo=UTC)
    if call == "check_connection":
        message = source.check_connection(2)
        assert message is not None
    else:
        with pytest.raises(SourceError) as caught:
            if call == "instant":
                source.instant("up")
            else:
                source.range("up", now - timedelta(hours=1), now, 60)
        message = str(caught.value)
    assert "redirect" in message and "never followed" in message, message
    assert SECRET not in message and "***@127.0.0.1" in message, message
    assert elsewhere.log == [], "the redirect was followed"
    assert len(httpserver.log) == 1, "one request, no retry of a refused redirect"


@pytest.mark.parametrize("where", ["other-host", "other-port"])
def test_backtest_from_prometheus_refuses_a_redirect_and_prints_no_secret(
        httpserver: HTTPServer, elsewhere: HTTPServer, other_port: HTTPServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, where: str) -> None:
    caplog.set_level(logging.DEBUG)
    url = _redirecting(httpserver, _target(where, elsewhere, other_port))
    (tmp_path / "scaler.yaml").write_text(SCALER)
    code = main(["-v", "backtest", "--prometheus", url, "--scaler", str(tmp_path / "scaler.yaml"), "--no-progress",
                 "--timeout", "2", "--json", "--report", str(tmp_path / "report"),
                 "--save-history", str(tmp_path / "pulled.csv")])
    out, err = capsys.readouterr()
    assert code == 2
    assert "never followed" in err and "Traceback" not in err, err
    _no_secret_anywhere(out + err + caplog.text, tmp_path)
    assert elsewhere.log == [] and other_port.log == []


@pytest.mark.parametrize("where", ["other-host", "other-port"])
def test_retrain_refuses_a_redirect_fails_promotes_nothing_and_prints_no_secret(
        httpserver: HTTPServer, elsewhere: HTTPServer, other_port: HTTPServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, where: str) -> None:
    caplog.set_level(logging.DEBUG)
    url = _redirecting(httpserver, _target(where, elsewhere, other_port))
    manifest = yaml.safe_load(SCALER)
    manifest["spec"]["demand"]["query"] = 'sum(rate(llm_requests_total{namespace="ml"}[5m]))'
    (tmp_path / "scalers.yaml").write_text(yaml.safe_dump(manifest))
    store = tmp_path / "models"
    code = main(["-v", "retrain", "--config", str(tmp_path / "scalers.yaml"), "--prometheus", url,
                 "--store", str(store), "--timeout", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 1, "a source that answers with a redirect fails the run (the CronJob shows it)"
    assert "never followed" in err and "1 scaler(s) failed" in err, err
    assert "Traceback" not in err
    _no_secret_anywhere(out + err + caplog.text, tmp_path)  # the run record in the store included
    assert elsewhere.log == [] and other_port.log == []
    [outcome] = json.loads(out)["scalers"]
    assert outcome["result"] == "failed" and "never followed" in outcome["reason"], outcome
    assert outcome["version"] is None and outcome["serving_version"] is None, outcome
    assert not list(store.rglob("model.json")), "nothing may be stored from a refused source"


@pytest.mark.parametrize("where", ["other-host", "other-port"])
def test_the_controllers_source_refuses_a_redirect_and_prints_no_secret(
        httpserver: HTTPServer, elsewhere: HTTPServer, other_port: HTTPServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, where: str) -> None:
    """The source the controller builds from its flags (controller/run.py: URL and timeout from the
    settings) refuses the redirect on every read it makes: demand now, recent history, /readyz's probe."""
    from predictive_scaler.cli import build_parser
    from predictive_scaler.clock import FakeClock
    from predictive_scaler.commands.controller import settings_from_args
    from predictive_scaler.controller.ports import PrometheusMetricsPort
    from predictive_scaler.spec import ScalerSpec

    caplog.set_level(logging.DEBUG)
    url = _redirecting(httpserver, _target(where, elsewhere, other_port))
    args = build_parser().parse_args(["controller", "--prometheus-url", url, "--model-store", str(tmp_path)])
    settings = settings_from_args(args, {})
    now = datetime(2026, 1, 5, tzinfo=UTC)
    source = PrometheusSource(settings.prometheus_url, timeout=settings.prometheus_timeout_seconds,
                              clock=FakeClock(now), sleep=lambda s: None)
    spec = ScalerSpec.from_dict(yaml.safe_load(SCALER)["spec"])
    port = PrometheusMetricsPort.for_spec(source, spec, "ml")
    messages = []
    for read in (lambda: port.demand_now(now), lambda: port.recent(now, timedelta(hours=1), 300)):
        with pytest.raises(SourceError) as caught:  # the reconciler holds on it, and says why
            read()
        messages.append(str(caught.value))
    messages.append(source.check_connection(2) or "")
    for message in messages:
        assert "never followed" in message and "***@127.0.0.1" in message, message
    _no_secret_anywhere("\n".join(messages) + caplog.text, tmp_path)
    assert elsewhere.log == [] and other_port.log == []
    assert len(httpserver.log) == 3, "one request per read, none retried"
