"""Loading token keys from Pulsar-style key URLs.

A key URL is ``data:[<mediatype>];base64,<data>``, ``file:///abs/path``,
``file:/abs/path`` or a plain filesystem path. Public keys may be PEM (a public key
or a certificate) or DER, raw or base64-encoded.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from pathlib import Path
from urllib.parse import unquote

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ec import (
    EllipticCurvePrivateKey,
    EllipticCurvePublicKey,
)
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey
from cryptography.hazmat.primitives.serialization import (
    load_der_private_key,
    load_der_public_key,
    load_pem_private_key,
    load_pem_public_key,
)

PublicKey = RSAPublicKey | EllipticCurvePublicKey
"""The public key types a token may be verified with."""

PrivateKey = RSAPrivateKey | EllipticCurvePrivateKey
"""The private key types a token may be signed with."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def _b64decode(data: str, what: str) -> bytes:
    compact = "".join(data.split())
    compact += "=" * (-len(compact) % 4)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid base64 data in {what}") from None


def _short(url: str) -> str:
    return url if len(url) <= 60 else url[:57] + "..."


def _load_data_url(url: str) -> bytes:
    header, sep, data = url[len("data:") :].partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise ValueError(f"unsupported key URL {_short(url)!r}: data: URLs must be base64")
    return _b64decode(data, f"key URL {_short(url)!r}")


def _file_url_path(url: str) -> str:
    rest = url[len("file:") :]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host not in ("", "localhost") or not slash:
            raise ValueError(f"unsupported key URL {url!r}: file URL must name a local path")
        rest = "/" + path
    if not rest.startswith("/"):
        raise ValueError(f"unsupported key URL {url!r}: file URL path must be absolute")
    return unquote(rest)


def _read(path: str, url: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read key {url!r}: {exc.strerror or exc}") from None


def load_key_material(url: str) -> bytes:
    """Return the bytes a key URL names; raise ValueError naming the value otherwise."""
    if not url or not url.strip():
        raise ValueError("empty key URL")
    lowered = url.lower()
    if lowered.startswith("data:"):
        data = _load_data_url(url)
    elif lowered.startswith("file:"):
        data = _read(_file_url_path(url), url)
    elif _SCHEME.match(url):
        raise ValueError(f"unsupported key URL {_short(url)!r}: use data:, file: or a path")
    else:
        data = _read(url, url)
    if not data:
        raise ValueError(f"key {_short(url)!r} is empty")
    return data


def load_secret_key(url: str) -> bytes:
    """The HMAC secret a key URL names, as raw bytes (Pulsar's tokenSecretKey)."""
    return load_key_material(url)


def _checked(key: object, url: str) -> PublicKey:
    if isinstance(key, RSAPublicKey | EllipticCurvePublicKey):
        return key
    raise ValueError(
        f"unsupported public key type {type(key).__name__} in {_short(url)!r}: expected RSA or EC"
    )


def parse_public_key(data: bytes, url: str = "<bytes>") -> PublicKey:
    """Parse a PEM public key or certificate, or DER (raw or base64), to a key object."""
    stripped = data.strip()
    key: object
    if stripped.startswith(b"-----BEGIN"):
        try:
            if stripped.startswith(b"-----BEGIN CERTIFICATE-----"):
                key = x509.load_pem_x509_certificate(stripped).public_key()
            else:
                key = load_pem_public_key(stripped)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ValueError(f"invalid PEM public key in {_short(url)!r}: {exc}") from None
        return _checked(key, url)
    candidates = [data]
    with contextlib.suppress(UnicodeDecodeError, ValueError):
        candidates.append(_b64decode(stripped.decode("ascii"), _short(url)))
    for candidate in candidates:
        try:
            key = load_der_public_key(candidate)
        except (ValueError, UnsupportedAlgorithm):
            continue
        return _checked(key, url)
    raise ValueError(f"no PEM or DER public key found in {_short(url)!r}")


def load_public_key(url: str) -> PublicKey:
    """The public key a key URL names (Pulsar's tokenPublicKey)."""
    return parse_public_key(load_key_material(url), url)


def load_private_key(url: str) -> PrivateKey:
    """The unencrypted RSA or EC private key (PEM or DER) a key URL names, for signing
    tokens (Pulsar's ``tokens create --private-key``)."""
    data = load_key_material(url)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key: object = load_pem_private_key(data.strip(), password=None)
        else:
            key = load_der_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"no unencrypted private key in {_short(url)!r}: {exc}") from None
    if isinstance(key, RSAPrivateKey | EllipticCurvePrivateKey):
        return key
    raise ValueError(f"unsupported private key type {type(key).__name__} in {_short(url)!r}: "
                     "expected RSA or EC")
