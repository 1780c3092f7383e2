"""Parser for the OAUTHBEARER client initial response (RFC 7628 section 3.1).

Layout: a GS2 header ``n,`` + optional ``a=<authzid>`` + ``,``, then ``\\x01``, then
``key=value\\x01`` pairs, then a final ``\\x01``. The ``auth`` pair carries
``Bearer <token>``; every other pair is an extension. Parsing is strict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

KVSEP = "\x01"
AUTH_KEY = "auth"

_KEY = re.compile(r"[A-Za-z]+")
# RFC 7628 value: VCHAR / SP / HTAB / CR / LF
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]*")
# RFC 6750 credentials: "Bearer" 1*SP b64token
_BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*)")


class MalformedHeader(ValueError):
    """The GS2 header could not be understood (e.g. channel binding was asked for)."""


class MalformedMessage(ValueError):
    """The GS2 header was understood but the rest of the message is malformed."""


@dataclass(frozen=True)
class ClientInitialResponse:
    """The parts of an OAUTHBEARER client initial response."""

    authzid: str | None
    token: str
    extensions: Mapping[str, str]


def _decode_saslname(raw: str) -> str:
    """Undo the RFC 5801 escaping of ``,`` (=2C) and ``=`` (=3D) in an authzid."""
    if "\x00" in raw:
        raise MalformedHeader("invalid GS2 authorization id: contains NUL")
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "=":
            escape = raw[i : i + 3]
            if escape == "=2C":
                out.append(",")
            elif escape == "=3D":
                out.append("=")
            else:
                raise MalformedHeader("invalid escape in GS2 authorization id")
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _split_gs2_header(text: str) -> tuple[str | None, str]:
    """Return (authzid, rest after the header) or raise MalformedHeader."""
    if not text.startswith("n,"):
        if text[:2] in ("y,", "p="):
            raise MalformedHeader("channel binding is not supported; GS2 header must be 'n,'")
        raise MalformedHeader("invalid GS2 header: expected 'n,'")
    end = text.find(",", 2)
    if end < 0:
        raise MalformedHeader("invalid GS2 header: missing ',' after the authorization id")
    field = text[2:end]
    if not field:
        return None, text[end + 1 :]
    if not field.startswith("a=") or len(field) == 2:
        raise MalformedHeader("invalid GS2 header: authorization id must be 'a=<name>'")
    return _decode_saslname(field[2:]), text[end + 1 :]


def _parse_pairs(rest: str) -> dict[str, str]:
    if len(rest) < 2 or not rest.startswith(KVSEP) or not rest.endswith(KVSEP):
        raise MalformedMessage("invalid OAUTHBEARER message: bad key/value framing")
    inner = rest[1:-1]
    if not inner:
        return {}
    if not inner.endswith(KVSEP):
        raise MalformedMessage("invalid OAUTHBEARER message: missing final separator")
    pairs: dict[str, str] = {}
    for item in inner[:-1].split(KVSEP):
        key, sep, value = item.partition("=")
        if not sep or _KEY.fullmatch(key) is None:
            raise MalformedMessage("invalid OAUTHBEARER message: bad key/value pair")
        if _VALUE.fullmatch(value) is None:
            raise MalformedMessage(f"invalid OAUTHBEARER message: bad value for {key!r}")
        if key in pairs:
            raise MalformedMessage(f"invalid OAUTHBEARER message: duplicate key {key!r}")
        pairs[key] = value
    return pairs


def parse_client_initial_response(text: str) -> ClientInitialResponse:
    """Parse a decoded client initial response.

    Raises MalformedHeader when the GS2 header is not understood, MalformedMessage for
    any later fault (including a missing or badly formed ``auth`` pair).
    """
    authzid, rest = _split_gs2_header(text)
    pairs = _parse_pairs(rest)
    auth = pairs.pop(AUTH_KEY, None)
    if auth is None:
        raise MalformedMessage("invalid OAUTHBEARER message: missing 'auth' key")
    match = _BEARER.fullmatch(auth)
    if match is None:
        raise MalformedMessage("invalid OAUTHBEARER message: auth must be 'Bearer <token>'")
    return ClientInitialResponse(authzid=authzid, token=match.group(1), extensions=pairs)
