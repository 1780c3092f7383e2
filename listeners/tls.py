"""TLS for SSL and SASL_SSL listeners: server contexts from PEM files and the principal of a
client certificate."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Literal

from cryptography import x509
from cryptography.x509.oid import NameOID

PrincipalMode = Literal["CN", "DN"]
"""What names a client certificate's principal (``tlsPrincipal``): its subject's one
common name, or its whole subject as RFC 4514 (Kafka's ``DEFAULT`` mapping rule)."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Where the listener's certificate, key and trusted client CAs are."""

    certificate_file: str
    key_file: str
    trust_file: str = ""
    require_client_cert: bool = False
    client_certs: bool = True
    """Whether clients are asked for certificates at all: on SSL listeners, not on SASL_SSL
    ones, whose clients log in by SASL (Kafka's ``ssl.client.auth``, KIP-684)."""


class TlsConfigError(ValueError):
    """The TLS files cannot be used; the message names the file."""


class CertificateRefused(Exception):
    """A verified client certificate that names no principal (the message says why)."""


def _encrypted_key(key_file: str) -> bytes:
    """The ``password`` callback of ``load_cert_chain``, called only for an encrypted key:
    without one OpenSSL would ask for it on the terminal (and wait there)."""
    raise TlsConfigError(f"the private key {key_file!r} is encrypted; encrypted keys are not "
                         "supported: give the key file unencrypted (readable by the broker "
                         "only)")


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A TLS 1.2+ server context without renegotiation; when ``client_certs``, it asks for
    client certificates when a trust file is set and requires a trusted one when
    ``require_client_cert``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION
    if settings.require_client_cert and not settings.trust_file:
        raise TlsConfigError("client certificates are required but no trust file is set")
    try:
        context.load_cert_chain(settings.certificate_file, settings.key_file,
                                password=lambda: _encrypted_key(settings.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot load certificate {settings.certificate_file!r} with key "
            f"{settings.key_file!r}: {exc}") from exc
    if settings.trust_file and settings.client_certs:
        try:
            context.load_verify_locations(cafile=settings.trust_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"cannot load trusted certificates {settings.trust_file!r}: {exc}") from exc
        context.verify_mode = (ssl.CERT_REQUIRED if settings.require_client_cert
                               else ssl.CERT_OPTIONAL)
    return context


def certificate_principal(tls: ssl.SSLObject | None, mode: PrincipalMode = "CN") -> str | None:
    """The principal of a verified client certificate, None if the client sent none. In
    ``CN`` mode its subject's common name: a subject with none, or with more than one
    (parsers disagree on which one counts), is refused (CertificateRefused); in ``DN``
    mode the whole subject, RFC 4514 (``CN=app,O=Acme``: the order of Java's
    ``X500Principal.getName()``), refused only when empty."""
    if tls is None or not tls.getpeercert():  # none, or not verified (the dict is empty)
        return None
    der = tls.getpeercert(binary_form=True)
    if der is None:
        return None
    subject = x509.load_der_x509_certificate(der).subject
    if mode == "DN":
        name = subject.rfc4514_string()
        if not name:
            raise CertificateRefused("client certificate with an empty subject")
        return name
    names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise CertificateRefused(
            f"client certificate subject {subject.rfc4514_string()!r} has "
            f"{'no common name' if not names else f'{len(names)} common names'} "
            "(tlsPrincipal=CN needs exactly one; tlsPrincipal=DN names it by its subject)")
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8", "replace")
