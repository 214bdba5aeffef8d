"""A Prometheus URL with credentials in it, as the controller meets it: its secret never reaches what the
cluster keeps or shows (the PredictiveScaler's status, Events, logs, metrics), and a redirect away from
it is refused — with the controller still holding its replicas (missing data never scales down)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from tests.reliability.conftest import MakeWorld
from tests.reliability.harness import World

SECRET = "s3cr3t-pa55"


def with_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"scaler:{SECRET}@{parts.netloc}"))


def shown(world: World, caplog: pytest.LogCaptureFixture) -> str:
    """Everything of this scaler a user or another program can read: status, Events, logs, metrics."""
    return "\n".join([
        json.dumps(world.scaler().get("status") or {}),
        json.dumps([o for o in world.fake_api.objects("v1", "Event", "ml")]),
        *(f"{e.reason}: {e.message}" for p in world.periods for e in p.events),
        caplog.text,
        json.dumps(world.samples()),
        *(str(r.body) for r in world.fake_api.requests),
    ])


@pytest.fixture
def redirecting() -> Iterator[str]:
    """A Prometheus that sends every query to 127.0.0.2 (another host, the same port); a server of its
    own, as the fake API server has the ``httpserver`` fixture."""
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    port = server.port

    def answer(request: object) -> Response:
        return Response(status=302, headers={"Location": f"http://127.0.0.2:{port}/api/v1/query_range"})

    server.expect_request("/api/v1/query_range").respond_with_handler(answer)
    server.expect_request("/api/v1/query").respond_with_handler(answer)
    try:
        yield server.url_for("/").rstrip("/")
    finally:
        server.clear()
        server.stop()


def test_the_secret_of_a_working_url_is_never_shown(make_world: MakeWorld, caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    world = make_world()
    monkeypatch.setattr(world, "prometheus_url", with_credentials(world.prometheus_url))
    world.restart()  # a controller built on the URL with credentials
    periods = world.run(4)
    assert [p.strategy for p in periods] == ["predictive"] * 4, "the URL with credentials still reads Prometheus"
    assert SECRET not in shown(world, caplog)


def test_a_redirect_is_refused_said_and_no_secret_is_shown(make_world: MakeWorld, redirecting: str,
                                                           caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    world = make_world()
    before = world.target_replicas()
    monkeypatch.setattr(world, "prometheus_url", with_credentials(redirecting))
    world.restart()
    periods = world.run(3)
    assert all(p.scale_replicas >= before for p in periods), "a refused redirect is missing data: never a scale-down"
    text = shown(world, caplog)
    assert SECRET not in text
    kept = json.dumps(world.scaler().get("status") or {}) + json.dumps(world.fake_api.objects("v1", "Event", "ml"))
    assert "redirect" in kept and "127.0.0.2" in kept, f"the status or an Event says a redirect was refused: {kept}"
