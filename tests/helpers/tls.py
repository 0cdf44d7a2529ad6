"""Certificates made in the tests (the ``cryptography`` package): a self-signed server certificate for localhost and
127.0.0.1, as ``openssl req -x509`` in docs/server.md makes it (a CA certificate, so clients can trust it directly),
and client certificates it signs (mutual TLS)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    key_object: ec.EllipticCurvePrivateKey
    cert_object: x509.Certificate

    def client_context(self) -> ssl.SSLContext:
        """A client's context that trusts this certificate (and verifies the host name)."""
        return ssl.create_default_context(cafile=str(self.cert))


def _write(folder: Path, name: str, cert: x509.Certificate, key, password: str | None) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return cert_path, key_path


def _builder(common_name: str, issuer: x509.Name | None, key) -> x509.CertificateBuilder:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
    )


def self_signed(folder: Path, name: str = "server", *, key_password: str | None = None) -> CertFiles:
    """A self-signed certificate for ``localhost`` and ``127.0.0.1`` and its key (encrypted with ``key_password``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder("localhost", None, key)
        .add_extension(alt_names, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = _write(folder, name, cert, key, key_password)
    return CertFiles(cert_path, key_path, key, cert)


def client_certificate(folder: Path, issuer: CertFiles, name: str = "client") -> CertFiles:
    """A client certificate signed by ``issuer`` (mutual TLS)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(name, issuer.cert_object.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key_object.public_key()), critical=False
        )
        .sign(issuer.key_object, hashes.SHA256())
    )
    cert_path, key_path = _write(folder, name, cert, key, None)
    return CertFiles(cert_path, key_path, key, cert)
