"""TLS for the KEDA gRPC port: a server certificate and key, and optionally a client CA (mTLS).

KEDA's external trigger dials with TLS when its TriggerAuthentication gives ``caCert`` (or a
client certificate), or, from KEDA 2.17, when the trigger sets ``enableTLS: "true"``; it checks
the server certificate against the host of ``scalerAddress`` (e.g.
``predictive-scaler-keda.predictive-scaler-system.svc``), so that name must be among the
certificate's DNS names. With a client CA every client must present a certificate it signed
(``tlsClientCert`` / ``tlsClientKey`` in KEDA's TriggerAuthentication).

The files are read once at start (a missing or unreadable one is a ConfigError naming it) and
again whenever one of them changes, for the connections made after (cert-manager rotating a
Secret); a change that cannot be read keeps the last good pair and is logged.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from predictive_scaler.errors import ConfigError

log = logging.getLogger("predictive_scaler.keda")


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    #: Clients must present a certificate signed by this CA (None: any client, server TLS only).
    client_ca: Path | None = None

    @classmethod
    def of(cls, cert: str | Path | None, key: str | Path | None, client_ca: str | Path | None) -> TlsFiles | None:
        """The files from settings; None when no TLS is asked for; ConfigError for half a pair."""
        if not cert and not key:
            if client_ca:
                raise ConfigError("a KEDA client CA is set without a server certificate: mTLS needs "
                                  "PREDICTIVE_SCALER_KEDA_TLS_CERT and PREDICTIVE_SCALER_KEDA_TLS_KEY too",
                                  field="kedaTlsClientCa")
            return None
        if not cert or not key:
            missing = "PREDICTIVE_SCALER_KEDA_TLS_CERT" if not cert else "PREDICTIVE_SCALER_KEDA_TLS_KEY"
            raise ConfigError(f"KEDA TLS needs both a certificate and its key: set {missing} (or its flag)",
                              field="kedaTls")
        return cls(Path(cert), Path(key), Path(client_ca) if client_ca else None)

    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key, *((self.client_ca,) if self.client_ca else ()))


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the KEDA TLS {what} {path} ({exc.strerror or exc})", field="kedaTls") from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"the KEDA TLS {what} {path} is not PEM (no -----BEGIN line)", field="kedaTls")
    return data


def _stamp(files: TlsFiles) -> tuple[tuple[int, int], ...]:
    out = []
    for p in files.paths():
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((-1, -1))
    return tuple(out)


def _configuration(files: TlsFiles) -> grpc.ServerCertificateConfiguration:
    pair = (_read(files.key, "key"), _read(files.cert, "certificate"))
    roots = _read(files.client_ca, "client CA") if files.client_ca else None
    return grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials over ``files``, re-read when they change; ConfigError when they cannot be read now."""
    for p in files.paths():
        if not p.is_file():
            raise ConfigError(f"the KEDA TLS file {p} does not exist (or is not a file)", field="kedaTls")
    lock = threading.Lock()
    seen = [_stamp(files)]
    initial = _configuration(files)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before each handshake: None keeps the configuration in use.
        stamp = _stamp(files)
        with lock:
            if stamp == seen[0]:
                return None
            seen[0] = stamp
        try:
            fresh = _configuration(files)
        except ConfigError as exc:
            log.warning("KEDA TLS files changed but cannot be read; keeping the last good ones",
                        extra={"detail": str(exc)})
            return None
        log.info("KEDA TLS files re-read", extra={"cert": str(files.cert)})
        return fresh

    return grpc.dynamic_ssl_server_credentials(initial, fetch,
                                               require_client_authentication=files.client_ca is not None)
