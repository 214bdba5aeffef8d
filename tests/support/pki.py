"""Certificates made in the tests with ``cryptography``: a CA and leaves it signs (server or client),
for the TLS tests of the KEDA port and of the authenticating proxy in front of Prometheus."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    cert: bytes
    key: bytes


@dataclass(frozen=True)
class Authority:
    pem: Pem
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pem:
    return Pem(cert.public_bytes(serialization.Encoding.PEM),
               key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()))


def authority(cn: str) -> Authority:
    """A self-signed CA valid from five minutes ago for a day."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(_pem(cert, key), cert, key)


def leaf(ca: Authority, cn: str, *, server: bool, dns_names: Sequence[str] = ("localhost",)) -> Pem:
    """A certificate ``ca`` signs: a server's (for ``dns_names`` and 127.0.0.1) or a client's."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            *(x509.DNSName(n) for n in dns_names), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return _pem(builder.sign(ca.key, hashes.SHA256()), key)
