"""TLS for SSL and SASL_SSL listeners: server contexts from PEM files and the principal of a
client certificate."""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Where the listener's certificate, key and trusted client CAs are."""

    certificate_file: str
    key_file: str
    trust_file: str = ""
    require_client_cert: bool = False


class TlsConfigError(ValueError):
    """The TLS files cannot be used; the message names the file."""


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A TLS 1.2+ server context; it asks for client certificates when a trust file is set
    and requires a trusted one when ``require_client_cert``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.certificate_file, settings.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(
            f"cannot load certificate {settings.certificate_file!r} with key "
            f"{settings.key_file!r}: {exc}") from exc
    if settings.trust_file:
        try:
            context.load_verify_locations(cafile=settings.trust_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"cannot load trusted certificates {settings.trust_file!r}: {exc}") from exc
        context.verify_mode = (ssl.CERT_REQUIRED if settings.require_client_cert
                               else ssl.CERT_OPTIONAL)
    elif settings.require_client_cert:
        raise TlsConfigError("client certificates are required but no trust file is set")
    return context


def certificate_principal(tls: ssl.SSLObject | None) -> str | None:
    """The common name of a verified client certificate, if the client sent one."""
    if tls is None:
        return None
    peer = tls.getpeercert()
    if not peer:
        return None
    for rdn in peer.get("subject", ()):
        for attribute in rdn:
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None
