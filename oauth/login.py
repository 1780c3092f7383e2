"""The OAuth 2.0 client-credentials login callback (RFC 6749 section 4.4), as KoP's
``OauthLoginCallbackHandler`` did it, plus caching and refresh.

:class:`ClientCredentialsLogin` discovers the issuer's ``token_endpoint`` (OIDC
discovery), posts a form-encoded ``grant_type=client_credentials`` request with the
client's id and secret (HTTP Basic, or in the form when the issuer supports only
``client_secret_post``), and caches the token until ``refresh_fraction`` of its lifetime
has passed (80 % by default). An issuer's refusal raises :class:`OAuthError` carrying its
``error`` and ``error_description`` (``invalid_client: bad secret``). Given only a token
endpoint (KIP-768's ``sasl.oauthbearer.token.endpoint.url``), it asks that endpoint
without discovery, the client authenticating with HTTP Basic unless told otherwise.
When a refresh fails while the cached token is still valid, the cached token is returned
and the failure logged. Thread-safe: concurrent callers share one request.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote_plus, urlencode

import jwt

from common.json_types import JsonObject, JsonValue, json_number
from oauth.credentials import ClientCredentials, load_credentials
from oauth.discovery import ProviderMetadata, discover
from oauth.errors import FetchError, OAuthError
from oauth.http import check_http_url, request

log = logging.getLogger(__name__)

DEFAULT_LIFETIME_SECONDS = 300.0
"""Assumed lifetime of a token whose answer has no ``expires_in`` and which has no ``exp``."""
REQUEST_FAILED = "request_failed"
AUTH_METHODS = ("auto", "client_secret_basic", "client_secret_post")


@dataclass(frozen=True)
class AccessToken:
    """A token from the issuer, with the times needed to refresh it."""

    value: str
    obtained_at: float
    """Seconds since the epoch, taken just before the request."""
    expires_at: float
    """Seconds since the epoch."""
    principal: str
    """The token's ``sub`` when it is a JWT that has one, else the client id."""
    scope: str | None = None

    def __repr__(self) -> str:
        return (f"AccessToken(principal={self.principal!r}, expires_at={self.expires_at}, "
                f"scope={self.scope!r})")

    @property
    def lifetime(self) -> float:
        """Seconds from the request to the expiry."""
        return self.expires_at - self.obtained_at


def unverified_claims(token: str) -> JsonObject:
    """The claims of a JWT read without checking its signature ({} if it is not one)."""
    try:
        claims: JsonValue = jwt.decode(token, options={"verify_signature": False})
    except (jwt.PyJWTError, ValueError, TypeError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _error_from(status: int, body: JsonValue) -> OAuthError:
    fields = body if isinstance(body, dict) else {}
    error, description = fields.get("error"), fields.get("error_description")
    if isinstance(error, str):
        return OAuthError(error, description if isinstance(description, str) else "")
    return OAuthError(REQUEST_FAILED, f"token endpoint answered HTTP {status}")


class ClientCredentialsLogin:
    """Gets, caches and refreshes an access token for one OAuth client."""

    def __init__(self, issuer_url: str | None, credentials_url: str | None = None, *,
                 credentials: ClientCredentials | None = None, audience: str | None = None,
                 scope: str | None = None, token_endpoint: str | None = None,
                 auth_method: str = "auto", refresh_fraction: float = 0.8,
                 timeout_seconds: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        if (credentials_url is None) == (credentials is None):
            raise ValueError("give exactly one of credentials_url and credentials")
        if auth_method not in AUTH_METHODS:
            raise ValueError(f"auth_method must be one of {', '.join(AUTH_METHODS)}")
        if not 0.1 <= refresh_fraction <= 1.0:
            raise ValueError("refresh_fraction must be between 0.1 and 1")
        if issuer_url is None and token_endpoint is None:
            raise ValueError("give the issuer URL or the token endpoint")
        self.issuer_url = (None if issuer_url is None
                           else check_http_url(issuer_url, "the issuer URL"))
        if token_endpoint is not None:
            check_http_url(token_endpoint, "the token endpoint")
        self._credentials_url = credentials_url
        self._credentials = credentials or load_credentials(str(credentials_url))
        self.audience = audience or None
        self.scope = scope or None
        self._token_endpoint = token_endpoint
        self._auth_method = auth_method
        self._refresh_fraction = refresh_fraction
        self._timeout = timeout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._metadata: ProviderMetadata | None = None
        self._cached: AccessToken | None = None

    @property
    def credentials(self) -> ClientCredentials:
        """The client's credentials as last read."""
        return self._credentials

    def extensions(self) -> dict[str, str]:
        """SASL extensions for the login: ``tenant`` and ``groupId`` from the credentials."""
        return self._credentials.extensions()

    def token(self) -> AccessToken:
        """A valid token: the cached one until its refresh time, else a new one."""
        with self._lock:
            cached = self._cached
            now = self._clock()
            if cached is not None and now < self._refresh_time(cached):
                return cached
            try:
                fresh = self._fetch()
            except OAuthError as exc:
                if cached is not None and now < cached.expires_at - 1:
                    log.warning("token refresh failed, using the current token: %s", exc)
                    return cached
                raise
            self._cached = fresh
            return fresh

    def invalidate(self) -> None:
        """Forget the cached token (the next :meth:`token` call asks the issuer)."""
        with self._lock:
            self._cached = None

    def _refresh_time(self, token: AccessToken) -> float:
        return token.obtained_at + self._refresh_fraction * token.lifetime

    def _provider(self) -> ProviderMetadata:
        if self._metadata is None:
            assert self.issuer_url is not None
            try:
                self._metadata = discover(self.issuer_url, timeout=self._timeout)
            except FetchError as exc:
                raise OAuthError(REQUEST_FAILED, f"OIDC discovery failed: {exc}") from None
        return self._metadata

    def _endpoint_and_method(self) -> tuple[str, str]:
        method = self._auth_method
        if self._token_endpoint is not None and self.issuer_url is None:
            # no issuer to ask (KIP-768's token endpoint URL alone): HTTP Basic by default
            return self._token_endpoint, "client_secret_basic" if method == "auto" else method
        if self._token_endpoint is not None and method != "auto":
            return self._token_endpoint, method
        metadata = self._provider()
        endpoint = self._token_endpoint or metadata.token_endpoint
        if endpoint is None:
            raise OAuthError(REQUEST_FAILED,
                             f"issuer {self.issuer_url} publishes no 'token_endpoint'")
        if method == "auto":
            supported = metadata.token_endpoint_auth_methods
            method = ("client_secret_post" if supported and "client_secret_basic" not in
                      supported and "client_secret_post" in supported
                      else "client_secret_basic")
        return endpoint, method

    def _fetch(self) -> AccessToken:
        if self._credentials_url is not None:
            try:
                self._credentials = load_credentials(self._credentials_url)
            except ValueError as exc:
                raise OAuthError(REQUEST_FAILED, str(exc)) from None
        endpoint, method = self._endpoint_and_method()
        creds = self._credentials
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        if self.audience:
            form["audience"] = self.audience
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        if method == "client_secret_post":
            form.update(client_id=creds.client_id, client_secret=creds.client_secret)
        else:
            pair = f"{quote_plus(creds.client_id)}:{quote_plus(creds.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        started = self._clock()
        try:
            answer = request(endpoint, timeout=self._timeout, data=urlencode(form).encode(),
                             headers=headers)
            body = answer.json()
        except FetchError as exc:
            raise OAuthError(REQUEST_FAILED, f"token request failed: {exc}") from None
        if answer.status != 200:
            raise _error_from(answer.status, body)
        return self._token_from(body, started)

    def _token_from(self, body: JsonValue, started: float) -> AccessToken:
        if not isinstance(body, dict):
            body = {}
        value = body.get("access_token")
        if not isinstance(value, str) or not value:
            raise OAuthError(REQUEST_FAILED, "token endpoint answer has no 'access_token'")
        token_type = body.get("token_type", "Bearer")
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise OAuthError(REQUEST_FAILED, f"unsupported token_type {token_type!r}")
        claims = unverified_claims(value)
        expires_in = json_number(body.get("expires_in"))
        exp = json_number(claims.get("exp"))
        limits = [exp] if exp is not None and exp > started else []
        if expires_in is not None and expires_in > 0:
            limits.append(started + expires_in)
        expires_at = min(limits) if limits else started + DEFAULT_LIFETIME_SECONDS
        sub = claims.get("sub")
        scope = body.get("scope")
        return AccessToken(
            value=value, obtained_at=started, expires_at=expires_at,
            principal=sub if isinstance(sub, str) and sub else self._credentials.client_id,
            scope=scope if isinstance(scope, str) else self.scope,
        )
