"""TLS and mTLS on the KEDA port, over loopback, with certificates made here (``cryptography``).

The client is what KEDA's external trigger makes: it trusts ``caCert`` (TriggerAuthentication), checks
the server certificate against the host of ``scalerAddress`` (the Service's DNS name), and with
mTLS presents ``tlsClientCert`` / ``tlsClientKey``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from predictive_scaler.clock import FakeClock
from predictive_scaler.controller.settings import ControllerSettings
from predictive_scaler.errors import ConfigError
from predictive_scaler.keda import externalscaler_pb2 as pb
from predictive_scaler.keda import externalscaler_pb2_grpc as pb_grpc
from predictive_scaler.keda.board import KedaBoard
from predictive_scaler.keda.server import KedaServer
from predictive_scaler.keda.tls import TlsFiles

HOST = "predictive-scaler-keda.predictive-scaler-system.svc"
NOW = dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def authority(cn: str) -> tuple[Pem, Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(NOW - dt.timedelta(minutes=5))
            .not_valid_after(NOW + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _pem(cert, key), cert, key


def leaf(ca: tuple[Pem, Any, Any], cn: str, *, server: bool) -> Pem:
    _, ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW - dt.timedelta(minutes=5)).not_valid_after(NOW + dt.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName(HOST), x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return _pem(builder.sign(ca_key, hashes.SHA256()), key)


def _pem(cert: Any, key: Any) -> Pem:
    return Pem(cert.public_bytes(serialization.Encoding.PEM),
               key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()))


@pytest.fixture(scope="module")
def pki() -> dict[str, Any]:
    ca, other = authority("predictive-scaler test CA"), authority("someone else's CA")
    return {"ca": ca[0], "other": other[0], "server": leaf(ca, HOST, server=True),
            "keda": leaf(ca, "keda-operator", server=False), "stranger": leaf(other, "keda-operator", server=False),
            "server2": leaf(other, HOST, server=True), "other_ca": other}


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
