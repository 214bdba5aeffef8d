"""A loopback HTTPS reverse proxy that asks for credentials, in front of a real Prometheus.

What a managed or multi-tenant Prometheus puts in front of the query API — TLS with a private CA, an
optional client certificate (mTLS), a bearer token or basic auth, a tenant header — is played here,
so the client (``sources.prometheus``) meets a real TLS handshake and real 401/403 answers, and the
answers themselves come from the real server behind it. stdlib ``http.server`` + ``ssl`` on one
daemon thread per connection; the certificates are made by :func:`make_pki` with ``cryptography``.

Answers: no or wrong credentials → 401 (with ``WWW-Authenticate``); right credentials, wrong or no
tenant → 403; otherwise the upstream's answer as it is. ``seen`` keeps each request's
Authorization and tenant header, for tests that check what was sent (a rotated token).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.pki import authority, leaf

TENANT_HEADER = "X-Scope-OrgID"
UPSTREAM_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA, the proxy's certificate for 127.0.0.1 signed by it, a client certificate signed
    by it, and a second CA that signed nothing here (a wrong trust anchor)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def make_pki(directory: Path) -> Pki:
    """Fresh certificates under ``directory`` (a test's tmp_path)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = authority("test prometheus CA")
    other = authority("some other CA")
    server = leaf(ca, "127.0.0.1", server=True)
    client = leaf(ca, "predictive-scaler", server=False)
    files = {
        "ca": ca.pem.cert, "server_cert": server.cert, "server_key": server.key,
        "client_cert": client.cert, "client_key": client.key, "other_ca": other.pem.cert,
    }
    paths = {}
    for name, data in files.items():
        path = directory / f"{name}.pem"
        path.write_bytes(data)
        path.chmod(0o600)
        paths[name] = path
    return Pki(**paths)


@dataclass
class AuthProxy:
    """The proxy's settings (change them while it runs: each request reads them) and what it saw."""

    upstream: str
    token: str | None = None
    basic: tuple[str, str] | None = None
    tenant: str | None = None
    url: str = ""
    seen: list[tuple[str | None, str | None]] = field(default_factory=list)
    refused: int = 0

    def allows(self, headers: Any) -> int | None:
        """None when the request may pass, else the status to refuse it with."""
        given = headers.get("Authorization")
        self.seen.append((given, headers.get(TENANT_HEADER)))
        if self.token is not None and given != f"Bearer {self.token}":
            return 401
        if self.basic is not None:
            want = "Basic " + base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
            if given != want:
                return 401
        if self.tenant is not None and headers.get(TENANT_HEADER) != self.tenant:
            return 403
        return None


def _handler(proxy: AuthProxy) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

        def _refuse(self, status: int) -> None:
            proxy.refused += 1
            body = b"no credentials or wrong ones\n" if status == 401 else b"tenant not allowed\n"
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="prometheus"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            refusal = proxy.allows(self.headers)
            if refusal is not None:
                self._refuse(refusal)
                return
            conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=UPSTREAM_TIMEOUT_SECONDS)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status)
            for name in ("Content-Type",):
                if resp.getheader(name):
                    self.send_header(name, resp.getheader(name) or "")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _forward  # noqa: N815 - http.server's names
        do_POST = _forward  # noqa: N815

    return Handler


@contextlib.contextmanager
def auth_proxy(upstream: str, pki: Pki, *, client_ca: bool = False, token: str | None = None,
               basic: tuple[str, str] | None = None, tenant: str | None = None) -> Iterator[AuthProxy]:
    """An HTTPS proxy on a free loopback port in front of ``upstream`` (``http://127.0.0.1:PORT``);
    ``client_ca``: ask for a client certificate signed by the test CA (mTLS)."""
    proxy = AuthProxy(upstream=upstream, token=token, basic=basic, tenant=tenant)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    if client_ca:
        ctx.load_verify_locations(pki.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    proxy.url = f"https://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
