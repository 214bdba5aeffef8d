"""A loopback HTTP proxy in front of a real Prometheus that injects faults on demand.

The metrics path is tested against the real server; what a real network adds —
an outage, 503s, answers slower than the client waits, dropped connections, odd
but well-formed bodies — is injected here, between the two, so the client code
under test (``sources.prometheus``) meets exactly the bytes it would meet in a
cluster. stdlib only (``http.server`` + ``http.client``), one daemon thread per
connection, every wait bounded so a stuck test never hangs the suite.

Faults (set with :meth:`FaultProxy.inject`, cleared with :meth:`FaultProxy.clear`):

- ``Down()`` — the listener is closed: connection refused, as when Prometheus is down;
- ``Status(code)`` — answer ``code`` with a Prometheus error body (503, 429, 500 …);
- ``Hang(seconds)`` — read the request and never answer (the client's timeout fires);
  the connection is closed after ``seconds`` at most;
- ``Slow(seconds)`` — forward, but answer only after ``seconds`` (a slow query);
- ``Drop()`` — read the request and close the connection without a byte (reset);
- ``Fixed(status, body)`` — answer these bytes (the bad-input corpus);
- ``Rewrite(fn)`` — forward, then answer ``fn(path, params, json_body)`` (empty results,
  NaN samples, duplicated series, a frozen exporter's old timestamps …); ``fn`` may also
  change the query's parameters first through ``params_fn``.

A fault may be limited to queries containing ``match`` (a substring of the PromQL).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

#: No injected wait lasts longer than this (a forgotten fault must not hang the suite).
MAX_WAIT_SECONDS = 5.0
UPSTREAM_TIMEOUT_SECONDS = 30.0

Params = dict[str, str]
BodyRewrite = Callable[[str, Params, Any], Any]
ParamsRewrite = Callable[[str, Params], Params]


@dataclass(frozen=True)
class Down:
    match: str | None = None  # ignored: a closed listener refuses every query


@dataclass(frozen=True)
class Status:
    code: int = 503
    retry_after: float | None = None
    match: str | None = None


@dataclass(frozen=True)
class Hang:
    seconds: float = 2.0
    match: str | None = None


@dataclass(frozen=True)
class Slow:
    seconds: float = 0.5
    match: str | None = None


@dataclass(frozen=True)
class Drop:
    match: str | None = None


@dataclass(frozen=True)
class Fixed:
    status: int
    body: bytes
    content_type: str = "application/json"
    match: str | None = None


@dataclass(frozen=True)
class Rewrite:
    body_fn: BodyRewrite | None = None
    params_fn: ParamsRewrite | None = None
    match: str | None = None


Fault = Down | Status | Hang | Slow | Drop | Fixed | Rewrite


@dataclass(frozen=True)
class ProxiedRequest:
    path: str
    params: Params
    outcome: str  # "forwarded" | fault class name


class FaultProxy:
    """``FaultProxy(upstream_url)`` → ``.url`` to give the client; a context manager."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream {upstream!r} must be http://host:port")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.host = host
        self._fault: Fault | None = None
        self._lock = threading.Lock()
        self._released = threading.Event()
        #: The last requests seen (bounded), for assertions.
        self.requests: deque[ProxiedRequest] = deque(maxlen=2000)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        self._listen()

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _listen(self) -> None:
        server = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
        server.daemon_threads = True
        self.port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()

    def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=MAX_WAIT_SECONDS)
            self._thread = None

    def close(self) -> None:
        self._released.set()
        self._close_listener()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults ----------------------------------------------------------------------------------
    def inject(self, fault: Fault) -> None:
        with self._lock:
            self._released.set()  # let go of connections held by a previous Hang
            self._released = threading.Event()
            self._fault = fault
            if isinstance(fault, Down):
                self._close_listener()
            elif self._server is None:
                self._listen_again()

    def clear(self) -> None:
        with self._lock:
            self._released.set()
            self._fault = None
            if self._server is None:
                self._listen_again()

    @property
    def fault(self) -> Fault | None:
        return self._fault

    def _listen_again(self) -> None:
        # The same port again: the client keeps its URL, as after a Prometheus restart.
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while True:
            try:
                self._listen()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _fault_for(self, params: Mapping[str, str]) -> Fault | None:
        fault = self._fault
        if fault is None:
            return None
        match = getattr(fault, "match", None)
        if match is not None and match not in params.get("query", ""):
            return None
        return fault

    # -- forwarding ------------------------------------------------------------------------------
    def forward(self, path: str, params: Params) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port,
                                          timeout=UPSTREAM_TIMEOUT_SECONDS)
        try:
            query = urlencode(params)
            conn.request("GET", f"{path}?{query}" if query else path)
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.getheader("Content-Type") or "application/json"
        finally:
            conn.close()


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:  # noqa: C901
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 — http.server's naming
            parts = urlsplit(self.path)
            params = dict(parse_qsl(parts.query, keep_blank_values=True))
            self._serve(parts.path, params)

        def do_POST(self) -> None:  # noqa: N802 — prometheus-api-client may POST long queries
            length = int(self.headers.get("Content-Length") or 0)
            form = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            parts = urlsplit(self.path)
            params = dict(parse_qsl(parts.query, keep_blank_values=True))
            params.update(dict(parse_qsl(form, keep_blank_values=True)))
            self._serve(parts.path, params)

        def _serve(self, path: str, params: Params) -> None:
            fault = proxy._fault_for(params)
            released = proxy._released
            proxy.requests.append(ProxiedRequest(path, dict(params),
                                                 "forwarded" if fault is None else type(fault).__name__))
            if isinstance(fault, Hang):
                released.wait(min(fault.seconds, MAX_WAIT_SECONDS))
                self.close_connection = True
                return
            if isinstance(fault, Drop):
                self._reset()
                return
            if isinstance(fault, Status):
                body = json.dumps({"status": "error", "errorType": "unavailable",
                                   "error": f"injected HTTP {fault.code}"}).encode()
                headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
                self._answer(fault.code, body, "application/json", headers)
                return
            if isinstance(fault, Fixed):
                self._answer(fault.status, fault.body, fault.content_type)
                return
            if isinstance(fault, Rewrite) and fault.params_fn is not None:
                params = fault.params_fn(path, dict(params))
            try:
                status, body, ctype = proxy.forward(path, params)
            except OSError as exc:
                self._answer(502, json.dumps({"status": "error", "errorType": "proxy",
                                              "error": f"upstream: {exc}"}).encode(), "application/json")
                return
            if isinstance(fault, Rewrite) and fault.body_fn is not None and status == 200:
                doc = fault.body_fn(path, params, json.loads(body))
                body = json.dumps(doc).encode()
            if isinstance(fault, Slow):
                released.wait(min(fault.seconds, MAX_WAIT_SECONDS))
            self._answer(status, body, ctype)

        def _answer(self, status: int, body: bytes, ctype: str, headers: Mapping[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                # One request per connection: a Down fault must refuse the very next query,
                # not let it through on a kept-alive socket.
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (its timeout): nothing to do
            self.close_connection = True

        def _reset(self) -> None:
            # SO_LINGER 0: close with RST, what a crashed server or a cut network looks like.
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
            self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — quiet in tests
            return

    return Handler
