"""The OAUTHBEARER validator's settings: the ``oauth.*`` keys of the file named by the
broker key ``kopOauth2ConfigFile``.

Each key is declared once, as a field of the pydantic model :class:`ValidatorSettings`
(``common.settings.key``: the property name is the field's alias).
:func:`parse_validator_settings` reads the file's key/value pairs into it; an unknown
key, a bad value or a key that does not apply to the chosen ``oauth.validate.method``
raises :class:`OAuthConfigError` naming the key.  :data:`SETTING_KEYS` and
:func:`settings_reference_markdown` (the README's table) come from the declarations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

from common.settings import DeclaredKey, declared_keys, first_problem, key, to_text
from oauth.errors import OAuthConfigError
from oauth.http import check_http_url

METHOD_JWKS = "jwks"
METHOD_TOKEN = "token"
Method = Literal["jwks", "token"]
DEFAULT_ALGORITHMS: tuple[str, ...] = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
"""Asymmetric algorithms only: an issuer's JWKS never holds a shared secret."""


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _url(text: str) -> str:
    return check_http_url(text, "the value")


def _word(text: str) -> str:
    if not text or any(ch.isspace() for ch in text):
        raise ValueError("expected a non-empty claim name without spaces")
    return text


def _split(pattern: str) -> BeforeValidator:
    """Text to a tuple of its distinct non-empty items, split at ``pattern``."""
    def split(value: object) -> object:
        if not isinstance(value, str):
            return value
        return tuple(dict.fromkeys(w for w in re.split(pattern, value.strip()) if w.strip()))
    return BeforeValidator(split)


def _some(what: str) -> AfterValidator:
    def check(items: tuple[str, ...]) -> tuple[str, ...]:
        if not items:
            raise ValueError(f"expected one or more {what}, comma-separated")
        return items
    return AfterValidator(check)


def _algorithms(names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        if name not in DEFAULT_ALGORITHMS:
            raise ValueError(f"algorithm {name!r} is not allowed (choose from "
                             f"{', '.join(DEFAULT_ALGORITHMS)}; 'none' and HS* never are)")
    return names


Url = Annotated[str, AfterValidator(_url)]
Claim = Annotated[str, AfterValidator(_word)]
CommaList = Annotated[tuple[str, ...], _split(r"\s*,\s*")]


class ValidatorSettings(BaseModel):
    """How OAUTHBEARER tokens are checked; each field's description says what it means.

    Construct it by attribute name (or property name); the model is frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_by_name=True,
                              validate_by_alias=True, str_strip_whitespace=True)

    method: Annotated[Method, BeforeValidator(_lower), key(
        "oauth.validate.method",
        "`jwks`: check tokens with the issuer's published keys; `token`: with the "
        "broker's `tokenSecretKey` / `tokenPublicKey` settings (as PLAIN does)")] = "jwks"
    issuer_url: Annotated[Url | None, key(
        "oauth.issuer.url",
        "the issuer; its `/.well-known/openid-configuration` gives `jwks_uri`, and a "
        "token's `iss` must equal it")] = None
    jwks_url: Annotated[Url | None, key(
        "oauth.jwks.url",
        "the JWKS URL, instead of (or besides) discovery; without an issuer URL `iss` is "
        "not checked")] = None
    audiences: Annotated[CommaList, _some("audiences"), key(
        "oauth.audience",
        "audience(s), comma-separated: a token's `aud` must hold one; empty = not "
        "checked")] = ()
    principal_claim: Annotated[Claim, key(
        "oauth.principal.claim", "claim naming the principal (role)")] = "sub"
    tenant_claim: Annotated[Claim | None, key(
        "oauth.tenant.claim",
        "claim naming the tenant; a token carrying it logs in to that tenant only (PLAIN "
        "and OAUTHBEARER: a username or `tenant` extension naming another is refused); "
        "when a token lacks it, the tenant the client names (the username, the `tenant` "
        "extension), else `kafkaTenant`")] = None
    required_scopes: Annotated[tuple[str, ...], _split(r"[\s,]+"), key(
        "oauth.required.scopes",
        "scopes a token must all hold (comma or space separated), in `scope` (a string) "
        "or `scp` (a list)")] = ()
    clock_skew_seconds: Annotated[int, key(
        "oauth.clock.skew.seconds",
        "leeway for `exp` and `nbf` (seconds); the session still ends at `exp`",
        ge=0, le=600)] = 30
    algorithms: Annotated[CommaList, _some("algorithms"), AfterValidator(_algorithms), key(
        "oauth.algorithms",
        "signature algorithms accepted, comma-separated (never `none` or HS*)",
    )] = DEFAULT_ALGORITHMS
    jwks_refresh_min_seconds: Annotated[float, key(
        "oauth.jwks.refresh.min.seconds",
        "once keys are held, a token signed with an unknown `kid` (or keys past their "
        "maximum age) starts a background JWKS fetch at most this often; that login is "
        "refused at once, the client's retry passes once the fetch lands",
        ge=0, le=3600)] = 10.0
    jwks_retry_seconds: Annotated[float, key(
        "oauth.jwks.retry.seconds",
        "while no keys are held yet (first start, issuer down), a login starts a new fetch "
        "at most this often after a failed one",
        ge=0, le=3600)] = 1.0
    jwks_max_age_seconds: Annotated[float, key(
        "oauth.jwks.max.age.seconds",
        "keys older than this are refetched in the background on the next login (kept "
        "if the issuer is down)", ge=1, le=86400 * 7)] = 3600.0
    http_timeout_seconds: Annotated[float, key(
        "oauth.http.timeout.seconds",
        "time limit of each discovery or JWKS request as a whole (resolving the host "
        "name, connecting, TLS, "
        "redirects within its origin, the answer however slowly it comes)",
        ge=0.1, le=120)] = 5.0
    max_lifetime_seconds: int = 0
    """Refuse a token living longer; 0 = no limit. Set from the broker's
    ``tokenMaxLifetimeSeconds``, not from an ``oauth.*`` key."""


SETTING_KEYS: tuple[DeclaredKey, ...] = declared_keys(ValidatorSettings)
"""Every ``oauth.*`` key, in declaration order."""
_BY_NAME: Mapping[str, DeclaredKey] = {item.name: item for item in SETTING_KEYS}
_BY_ATTR: Mapping[str, DeclaredKey] = {item.attr: item for item in SETTING_KEYS}
_BOTH_METHODS = frozenset({"oauth.validate.method", "oauth.tenant.claim"})
"""The keys that apply with ``oauth.validate.method=token`` too; the others are jwks's."""


def _reason(item: DeclaredKey, message: str, cause: Exception | None) -> str:
    if cause is not None:
        return str(cause)
    low, high = item.bounds()
    if low is not None and high is not None:
        return f"expected a number from {low:g} to {high:g}"
    choices = get_args(item.info.annotation)
    if choices and all(isinstance(choice, str) for choice in choices):
        return "expected " + " or ".join(choices)
    return message


def parse_validator_settings(properties: Mapping[str, str]) -> ValidatorSettings:
    """Read the ``oauth.*`` keys; raise OAuthConfigError naming the first bad key."""
    values: dict[str, str] = {}
    for name, raw in properties.items():
        if name not in _BY_NAME:
            known = ", ".join(_BY_NAME)
            raise OAuthConfigError(f"unknown OAuth key {name!r} (known keys: {known})")
        if raw.strip() or _BY_NAME[name].default not in (None, ()):
            values[name] = raw
    try:
        settings = ValidatorSettings.model_validate(values)
    except ValidationError as exc:
        problem = first_problem(exc)
        item = _BY_NAME.get(problem.where) or _BY_ATTR[problem.where]
        text = str(properties.get(item.name, problem.value)).strip()
        reason = _reason(item, problem.message, problem.cause)
        raise OAuthConfigError(f"invalid value {text!r} for {item.name!r}: {reason}") from None
    _check_method(settings, values)
    return settings


def _check_method(settings: ValidatorSettings, given: Mapping[str, str]) -> None:
    if settings.method != METHOD_JWKS:
        for name in given:
            if name not in _BOTH_METHODS:
                raise OAuthConfigError(
                    f"{name!r} does not apply with oauth.validate.method={settings.method}")
    if settings.method == METHOD_JWKS and not (settings.issuer_url or settings.jwks_url):
        raise OAuthConfigError(
            "'oauth.issuer.url' (or 'oauth.jwks.url') is required with "
            "oauth.validate.method=jwks")


def settings_reference_markdown() -> str:
    """A Markdown table of the ``oauth.*`` keys: name, default and meaning."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for item in SETTING_KEYS:
        default = to_text(item.default)
        rows.append(f"| `{item.name}` | {f'`{default}`' if default else '(none)'} "
                    f"| {item.doc} |")
    return "\n".join(rows) + "\n"
