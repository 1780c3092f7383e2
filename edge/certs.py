"""Throw-away TLS material for trying a secured broker (``edge-broker certs``): a CA, a
server certificate for the given hosts signed by it, and optionally a client certificate.

PEM files with RSA-2048 keys (PKCS#8, unencrypted, mode 0600); the CA's key is not kept,
so nothing more can be signed with it. For production, bring certificates from your own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
CA_NAME = "edge-broker throw-away CA"


@dataclass(frozen=True)
class CertFiles:
    """Where the PEM files are: CA certificate, server certificate and key, and the client
    certificate and key (None when no client was asked for)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path | None
    client_key: Path | None

    def written(self) -> list[Path]:
        """Every file, in the order they are written."""
        return [p for p in (self.ca, self.cert, self.key, self.client_cert, self.client_key)
                if p is not None]


def _files(directory: Path, client: bool) -> CertFiles:
    return CertFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                     directory / "client.pem" if client else None,
                     directory / "client.key" if client else None)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class Authority:
    """The CA: its key signs the leaf certificates, then is forgotten (tests keep one to
    sign client certificates of any subject)."""

    def __init__(self, days: int) -> None:
        self.now = datetime.datetime.now(datetime.UTC)
        self.days = days
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(CA_NAME)).issuer_name(_name(CA_NAME))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(minutes=5))
            .not_valid_after(self.now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def leaf(self, subject: str | x509.Name, hosts: Sequence[str]) -> tuple[bytes, bytes]:
        """A certificate and its key: a server one for ``hosts``, a client one without;
        ``subject`` is its common name, or its whole subject."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder().subject_name(
                subject if isinstance(subject, x509.Name) else _name(subject))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(minutes=5))
            .not_valid_after(self.now + datetime.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(host) for host in hosts]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _write(path: Path, data: bytes, private: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def make_certs(directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS,
               client_cn: str | None = None, days: int = 365,
               overwrite: bool = False) -> CertFiles:
    """Write the CA certificate, a server certificate for ``hosts`` (its common name the
    first host) and, when ``client_cn`` is given, a client certificate with that common
    name. Refuses (FileExistsError) to replace existing files unless ``overwrite``."""
    if not hosts:
        raise ValueError("at least one host is needed for the server certificate")
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    files = _files(directory, client_cn is not None)
    present = [str(p) for p in files.written() if p.exists()]
    if present and not overwrite:
        raise FileExistsError(f"already there (use --force to replace): {', '.join(present)}")
    directory.mkdir(parents=True, exist_ok=True)
    authority = Authority(days)
    server_pem, server_key = authority.leaf(hosts[0], hosts)
    _write(files.ca, authority.cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.cert, server_pem, private=False)
    _write(files.key, server_key, private=True)
    if client_cn is not None and files.client_cert is not None \
            and files.client_key is not None:
        client_pem, client_key = authority.leaf(client_cn, ())
        _write(files.client_cert, client_pem, private=False)
        _write(files.client_key, client_key, private=True)
    return files
