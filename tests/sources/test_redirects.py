"""Prometheus over HTTP is a security boundary: no redirect is followed, no credential is printed.

A server on 127.0.0.1 answers every query with a redirect — to another host on loopback
(127.0.0.2 is another host than 127.0.0.1), to another port, or to another scheme — and the
source refuses each before requests follows it: the other server never sees a request, and the
error says why and what to do. A password in the URL shows as ``***`` in every message.
"""

from __future__ import annotations

import json
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


@pytest.fixture
def elsewhere() -> Iterator[HTTPServer]:
    """A Prometheus-looking server on another loopback host: it must never be asked anything."""
    server = HTTPServer(host="127.0.0.2", port=0)
    server.expect_request("/api/v1/query").respond_with_json({"status": "success",
                                                             "data": {"resultType": "vector", "result": []}})
    server.expect_request("/api/v1/query_range").respond_with_json(
        {"status": "success", "data": {"resultType": "matrix", "result": []}})
    server.start()
    yield server
    server.clear()
    server.stop()


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


def test_backtest_from_prometheus_refuses_a_redirect_and_prints_no_secret(
        httpserver: HTTPServer, elsewhere: HTTPServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _redirecting(httpserver, f"http://127.0.0.2:{elsewhere.port}")
    (tmp_path / "scaler.yaml").write_text(SCALER)
    code = main(["backtest", "--prometheus", url, "--scaler", str(tmp_path / "scaler.yaml"), "--no-progress",
                 "--timeout", "2", "--json"])
    out, err = capsys.readouterr()
    assert code != 0
    assert "never followed" in err and "Traceback" not in err, err
    assert SECRET not in out + err
    assert elsewhere.log == []


def test_retrain_refuses_a_redirect_promotes_nothing_and_prints_no_secret(
        httpserver: HTTPServer, elsewhere: HTTPServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _redirecting(httpserver, f"http://127.0.0.2:{elsewhere.port}")
    manifest = yaml.safe_load(SCALER)
    manifest["spec"]["demand"]["query"] = 'sum(rate(llm_requests_total{namespace="ml"}[5m]))'
    (tmp_path / "scalers.yaml").write_text(yaml.safe_dump(manifest))
    store = tmp_path / "models"
    main(["retrain", "--config", str(tmp_path / "scalers.yaml"), "--prometheus", url,
                 "--store", str(store), "--timeout", "2", "--json"])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "never followed" in out + err, out + err
    assert "Traceback" not in err
    assert elsewhere.log == []
    [outcome] = json.loads(out)["scalers"]
    assert outcome["result"] == "skipped" and "never followed" in outcome["reason"], outcome
    assert outcome["version"] is None and outcome["serving_version"] is None, outcome
    assert not list(store.rglob("model.json")), "nothing may be stored from a refused source"
