"""The OAUTHBEARER validator's settings: the ``oauth.*`` keys of the file named by the
broker key ``kopOauth2ConfigFile``.

:func:`parse_validator_settings` turns the file's key/value pairs into
:class:`ValidatorSettings`; an unknown key, a bad value or a key that does not apply to
the chosen ``oauth.validate.method`` raises :class:`OAuthConfigError` naming the key.
:data:`SETTING_KEYS` documents every key (the README's table is made from it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from oauth.errors import OAuthConfigError
from oauth.http import check_http_url

METHOD_JWKS = "jwks"
METHOD_TOKEN = "token"
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric algorithms only: an issuer's JWKS never holds a shared secret."""


@dataclass(frozen=True)
class ValidatorSettings:
    """How OAUTHBEARER tokens are checked (see :data:`SETTING_KEYS` for each field)."""

    method: str = METHOD_JWKS
    issuer_url: str | None = None
    jwks_url: str | None = None
    audiences: tuple[str, ...] = ()
    principal_claim: str = "sub"
    tenant_claim: str | None = None
    required_scopes: tuple[str, ...] = ()
    clock_skew_seconds: int = 30
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    jwks_refresh_min_seconds: float = 10.0
    jwks_retry_seconds: float = 1.0
    jwks_max_age_seconds: float = 3600.0
    http_timeout_seconds: float = 5.0
    max_lifetime_seconds: int = 0
    """Refuse a token living longer; 0 = no limit. Set from the broker's
    ``tokenMaxLifetimeSeconds``, not from an ``oauth.*`` key."""


@dataclass(frozen=True)
class SettingKey:
    """One ``oauth.*`` key: its field, how its text is read, and what it means."""

    name: str
    attr: str
    parse: Callable[[str], Any]
    default: str
    doc: str
    methods: tuple[str, ...] = (METHOD_JWKS,)


def _method(text: str) -> str:
    lowered = text.lower()
    if lowered not in (METHOD_JWKS, METHOD_TOKEN):
        raise ValueError(f"expected {METHOD_JWKS} or {METHOD_TOKEN}")
    return lowered


def _url(text: str) -> str:
    check_http_url(text, "the value")
    return text


def _word(text: str) -> str:
    if not text or any(ch.isspace() for ch in text):
        raise ValueError("expected a non-empty claim name without spaces")
    return text


def _words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(w for w in re.split(r"[\s,]+", text) if w))


def _audiences(text: str) -> tuple[str, ...]:
    items = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not items:
        raise ValueError("expected one or more audiences, comma-separated")
    return items


def _algorithms(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not names:
        raise ValueError("expected one or more algorithms, comma-separated")
    for name in names:
        if name not in DEFAULT_ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is not allowed (choose from "
                             f"{', '.join(DEFAULT_ALGORITHMS)}; 'none' and HS* never are)")
    return names


def _number(low: float, high: float, *, integer: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise ValueError(f"expected a number from {low:g} to {high:g}") from None
        if not low <= value <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return value
    return parse


_BOTH = (METHOD_JWKS, METHOD_TOKEN)
SETTING_KEYS: tuple[SettingKey, ...] = (
    SettingKey("oauth.validate.method", "method", _method, METHOD_JWKS,
               "`jwks`: check tokens with the issuer's published keys; `token`: with the "
               "broker's `tokenSecretKey` / `tokenPublicKey` settings (as PLAIN does)", _BOTH),
    SettingKey("oauth.issuer.url", "issuer_url", _url, "",
               "the issuer; its `/.well-known/openid-configuration` gives `jwks_uri`, and "
               "a token's `iss` must equal it"),
    SettingKey("oauth.jwks.url", "jwks_url", _url, "",
               "the JWKS URL, instead of (or besides) discovery; without an issuer URL "
               "`iss` is not checked"),
    SettingKey("oauth.audience", "audiences", _audiences, "",
               "audience(s), comma-separated: a token's `aud` must hold one; empty = not "
               "checked"),
    SettingKey("oauth.principal.claim", "principal_claim", _word, "sub",
               "claim naming the principal (role)"),
    SettingKey("oauth.tenant.claim", "tenant_claim", _word, "",
               "claim naming the tenant; when a token lacks it, the `tenant` SASL "
               "extension, else `kafkaTenant`", _BOTH),
    SettingKey("oauth.required.scopes", "required_scopes", _words, "",
               "scopes a token must all hold (comma or space separated), in `scope` "
               "(a string) or `scp` (a list)"),
    SettingKey("oauth.clock.skew.seconds", "clock_skew_seconds",
               _number(0, 600, integer=True), "30",
               "leeway for `exp` and `nbf` (seconds); the session still ends at `exp`"),
    SettingKey("oauth.algorithms", "algorithms", _algorithms, ",".join(DEFAULT_ALGORITHMS),
               "signature algorithms accepted, comma-separated (never `none` or HS*)"),
    SettingKey("oauth.jwks.refresh.min.seconds", "jwks_refresh_min_seconds",
               _number(0, 3600), "10",
               "a token signed with an unknown `kid` refetches the JWKS at most this often"),
    SettingKey("oauth.jwks.retry.seconds", "jwks_retry_seconds", _number(0, 3600), "1",
               "after a failed fetch (issuer down), the next try waits this long"),
    SettingKey("oauth.jwks.max.age.seconds", "jwks_max_age_seconds", _number(1, 86400 * 7),
               "3600", "keys older than this are refetched on the next login (kept if the "
               "issuer is down)"),
    SettingKey("oauth.http.timeout.seconds", "http_timeout_seconds", _number(0.1, 120), "5",
               "timeout of each discovery or JWKS request"),
)
_BY_NAME: Mapping[str, SettingKey] = {key.name: key for key in SETTING_KEYS}


def parse_validator_settings(properties: Mapping[str, str]) -> ValidatorSettings:
    """Read the ``oauth.*`` keys; raise OAuthConfigError naming the first bad key."""
    values: dict[str, Any] = {}
    for name, raw in properties.items():
        key = _BY_NAME.get(name)
        if key is None:
            known = ", ".join(_BY_NAME)
            raise OAuthConfigError(f"unknown OAuth key {name!r} (known keys: {known})")
        text = raw.strip()
        if not text and key.default == "":
            continue
        try:
            values[key.attr] = key.parse(text)
        except ValueError as exc:
            raise OAuthConfigError(f"invalid value {text!r} for {name!r}: {exc}") from None
    settings = replace(ValidatorSettings(), **values)
    _check_method(settings, properties)
    return settings


def _check_method(settings: ValidatorSettings, properties: Mapping[str, str]) -> None:
    for name, raw in properties.items():
        key = _BY_NAME[name]
        if raw.strip() and settings.method not in key.methods:
            raise OAuthConfigError(
                f"{name!r} does not apply with oauth.validate.method={settings.method}")
    if settings.method == METHOD_JWKS and not (settings.issuer_url or settings.jwks_url):
        raise OAuthConfigError(
            "'oauth.issuer.url' (or 'oauth.jwks.url') is required with "
            "oauth.validate.method=jwks")


def settings_reference_markdown() -> str:
    """A Markdown table of the ``oauth.*`` keys: name, default and meaning."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key in SETTING_KEYS:
        default = f"`{key.default}`" if key.default else "(none)"
        rows.append(f"| `{key.name}` | {default} | {key.doc} |")
    return "\n".join(rows) + "\n"
