"""TLS and mTLS on the KEDA port, over loopback, with certificates made here (``cryptography``).

The client is what KEDA's external trigger makes: it trusts ``caCert`` (TriggerAuthentication), checks
the server certificate against the host of ``scalerAddress`` (the Service's DNS name), and with
mTLS presents ``tlsClientCert`` / ``tlsClientKey``.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.errors import ConfigError
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.board import KedaBoard
from predictive_scaler.keda.server import KedaServer
from predictive_scaler.keda.tls import TlsFiles
from tests.support.pki import Pem, authority, leaf

HOST = "predictive-scaler-keda.predictive-scaler-system.svc"
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def pki() -> dict[str, Any]:
    ca, other = authority("predictive-scaler test CA"), authority("someone else's CA")
    names = (HOST, "localhost")
    return {"ca": ca.pem, "other": other.pem, "server": leaf(ca, HOST, server=True, dns_names=names),
            "keda": leaf(ca, "keda-operator", server=False), "stranger": leaf(other, "keda-operator", server=False),
            "server2": leaf(other, HOST, server=True, dns_names=names)}


def write(tmp: Path, server: Pem, client_ca: Pem | None) -> TlsFiles:
    (tmp / "tls.crt").write_bytes(server.cert)
    (tmp / "tls.key").write_bytes(server.key)
    if client_ca is not None:
        (tmp / "ca.crt").write_bytes(client_ca.cert)
    return TlsFiles(tmp / "tls.crt", tmp / "tls.key", tmp / "ca.crt" if client_ca is not None else None)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    servers: list[KedaServer] = []

    def start(files: TlsFiles) -> int:
        board = KedaBoard(FakeClock(NOW), 300)
        server = KedaServer(board, "127.0.0.1", 0, workers=4, polling_workers=2, tls=files).start()
        servers.append(server)
        return server.port

    yield start
    for s in servers:
        s.stop(0.2)


def ask(port: int, *, trust: Pem | None, identity: Pem | None = None) -> grpc.StatusCode | None:
    """One GetMetricSpec as KEDA would make it; None when answered, else the status code."""
    ref = pb.ScaledObjectRef(name="so", namespace="ml", scalerMetadata={"scalerName": "llm"})
    if trust is None:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=trust.cert,
                                             private_key=identity.key if identity else None,
                                             certificate_chain=identity.cert if identity else None)
        # KEDA checks the certificate against scalerAddress's host, the Service name.
        channel = grpc.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", HOST)])
    with channel:
        try:
            pb_grpc.ExternalScalerStub(channel).GetMetricSpec(ref, timeout=3)
        except grpc.RpcError as exc:
            return exc.code()
    return None


def test_server_tls(pki: dict[str, Any], serve: Any, tmp_path: Path) -> None:
    port = serve(write(tmp_path, pki["server"], None))
    assert ask(port, trust=pki["ca"]) is None  # caCert only (or enableTLS with the CA in KEDA's pool)
    assert ask(port, trust=pki["ca"], identity=pki["keda"]) is None  # a client certificate is not asked for
    assert ask(port, trust=None) == grpc.StatusCode.UNAVAILABLE  # plaintext is refused
    assert ask(port, trust=pki["other"]) == grpc.StatusCode.UNAVAILABLE  # the client does not trust it


def test_mutual_tls(pki: dict[str, Any], serve: Any, tmp_path: Path) -> None:
    port = serve(write(tmp_path, pki["server"], pki["ca"]))
    assert ask(port, trust=pki["ca"], identity=pki["keda"]) is None
    assert ask(port, trust=pki["ca"]) == grpc.StatusCode.UNAVAILABLE  # no client certificate
    assert ask(port, trust=pki["ca"], identity=pki["stranger"]) == grpc.StatusCode.UNAVAILABLE  # another CA's
    assert ask(port, trust=None) == grpc.StatusCode.UNAVAILABLE


def test_a_rotated_certificate_is_used_for_new_connections(pki: dict[str, Any], serve: Any, tmp_path: Path) -> None:
    files = write(tmp_path, pki["server"], None)
    port = serve(files)
    assert ask(port, trust=pki["ca"]) is None
    # A Secret update: new files (another CA here, so the change is visible to the client).
    write(tmp_path, pki["server2"], None)
    later = os.stat(files.cert).st_mtime_ns + 10**9
    os.utime(files.cert, ns=(later, later))
    assert ask(port, trust=pki["other"]) is None
    assert ask(port, trust=pki["ca"]) == grpc.StatusCode.UNAVAILABLE
    # A broken update keeps the last good pair.
    files.key.write_bytes(b"not a key")
    assert ask(port, trust=pki["other"]) is None


def test_tls_settings_say_what_is_missing(pki: dict[str, Any], tmp_path: Path) -> None:
    assert TlsFiles.of(None, None, None) is None
    with pytest.raises(ConfigError, match="PREDICTIVE_SCALER_KEDA_TLS_KEY"):
        TlsFiles.of("tls.crt", None, None)
    with pytest.raises(ConfigError, match="without a server certificate"):
        TlsFiles.of(None, None, "ca.crt")
    base = {"PREDICTIVE_SCALER_PROMETHEUS_URL": "http://prometheus:9090", "PREDICTIVE_SCALER_MODEL_STORE": "/m"}
    with pytest.raises(ConfigError, match="KEDA TLS needs a certificate and its key"):
        ControllerSettings.from_env({**base, "PREDICTIVE_SCALER_KEDA_TLS_CERT": "/tls/tls.crt"})
    settings = ControllerSettings.from_env({**base, "PREDICTIVE_SCALER_KEDA_TLS_CERT": "/tls/tls.crt",
                                            "PREDICTIVE_SCALER_KEDA_TLS_KEY": "/tls/tls.key",
                                            "PREDICTIVE_SCALER_KEDA_TLS_CLIENT_CA": "/tls/ca.crt"})
    assert (settings.keda_tls_cert, settings.keda_tls_key, settings.keda_tls_client_ca) == (
        "/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt")
    files = write(tmp_path, pki["server"], None)
    board = KedaBoard(FakeClock(NOW), 300)
    with pytest.raises(ConfigError, match="does not exist"):
        KedaServer(board, "127.0.0.1", 0, tls=TlsFiles(files.cert, tmp_path / "missing.key"))
    (tmp_path / "bad.crt").write_text("hello")
    with pytest.raises(ConfigError, match="is not PEM"):
        KedaServer(board, "127.0.0.1", 0, tls=TlsFiles(tmp_path / "bad.crt", files.key))
