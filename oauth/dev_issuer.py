"""A development OAuth 2.0 / OpenID Connect issuer for users and tests, on loopback only.

It serves, over plain HTTP:

| path | what |
|---|---|
| ``GET /.well-known/openid-configuration`` | discovery (issuer, jwks_uri, token_endpoint) |
| ``GET /jwks`` | the public signing keys (RS256, one ``kid`` each) |
| ``POST /token`` | the client-credentials grant; client auth by HTTP Basic or form fields |
| ``POST /rotate`` | a new signing key; the old one stays published for ``key_grace_seconds`` |
| | (default: the token lifetime, so tokens already issued stay valid), or is dropped |
| | at once with ``?drop_previous=true`` |
| ``GET /stats`` | request counts (``jwks_requests`` …) and the published ``kids`` |

Tokens are JWTs with ``iss``, ``sub`` (= client id), ``aud``, ``iat``, ``nbf``, ``exp``,
``jti``, ``client_id``, ``scope`` (the requested scope) and, when ``tenant_claim`` is set
and the client has a tenant, that claim. JOSE and JWK handling is joserfc's (Authlib's
JOSE library). :meth:`DevIssuer.sign` signs arbitrary claims for tests.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict
from urllib.parse import unquote_plus

from joserfc import jwt as jose_jwt
from joserfc.jwk import RSAKey

from common.json_types import JsonObject
from oauth.dev_http import IssuerServer, is_loopback

ALGORITHM = "RS256"


class JwksDocument(TypedDict):
    """A published JSON Web Key Set (public keys as joserfc writes them)."""

    keys: list[dict[str, str | list[str]]]


@dataclass(frozen=True)
class DevClient:
    """A client the dev issuer knows."""

    client_id: str
    secret: str
    tenant: str | None = None


def parse_client_spec(spec: str) -> DevClient:
    """``id:secret`` or ``id:secret:tenant``; raise ValueError otherwise."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"invalid client {spec!r}: expected id:secret or id:secret:tenant")
    return DevClient(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


class SigningKeys:
    """The current RSA signing key and the retired ones still published."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self._lock = threading.Lock()
        self._current = self._new_key()
        self._retired: list[tuple[RSAKey, float]] = []

    @staticmethod
    def _new_key() -> RSAKey:
        kid = uuid.uuid4().hex[:16]
        return RSAKey.generate_key(2048, parameters={"kid": kid, "use": "sig",
                                                     "alg": ALGORITHM})

    @property
    def current(self) -> RSAKey:
        """The key new tokens are signed with."""
        with self._lock:
            return self._current

    def rotate(self, drop_previous: bool = False) -> str:
        """Make a new current key; return its kid."""
        fresh = self._new_key()
        with self._lock:
            if drop_previous:
                self._retired = []
            else:
                self._retired.append((self._current, time.time()))
            self._current = fresh
        return str(fresh.kid)

    def public_jwks(self) -> JwksDocument:
        """The JWKS document: the current key and the retired keys within their grace."""
        now = time.time()
        with self._lock:
            self._retired = [(k, at) for k, at in self._retired
                             if now - at < self.grace_seconds]
            keys = [self._current] + [k for k, _ in reversed(self._retired)]
        return {"keys": [k.as_dict(private=False) for k in keys]}


class DevIssuer:
    """The issuer: start it, point brokers and clients at :attr:`url`, stop it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 clients: Iterable[DevClient] = (), audience: str = "edge-broker",
                 token_lifetime_seconds: int = 3600, tenant_claim: str | None = None,
                 key_grace_seconds: float | None = None) -> None:
        if not is_loopback(host):
            raise ValueError(f"the dev issuer serves on loopback only, not {host!r}")
        if token_lifetime_seconds < 1:
            raise ValueError("the token lifetime must be at least 1 second")
        self.host = host
        self.port = port
        self.clients = {c.client_id: c for c in clients}
        self.audience = audience
        self.token_lifetime_seconds = token_lifetime_seconds
        self.tenant_claim = tenant_claim or None
        self.keys = SigningKeys(token_lifetime_seconds if key_grace_seconds is None
                                else key_grace_seconds)
        self._server: IssuerServer | None = None
        self._thread: threading.Thread | None = None
        self._stats_lock = threading.Lock()
        self._counts: dict[str, int] = {}

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The issuer URL (also each token's ``iss``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the HTTP server is up."""
        return self._server is not None

    def start(self) -> DevIssuer:
        """Serve in a background thread; the port chosen (for port 0) is kept for restarts."""
        if self._server is not None:
            return self
        server = IssuerServer((self.host, self.port), self)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="dev-issuer",
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (``start`` again reuses the same port)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> DevIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- tokens --------------------------------------------------------------------------

    def sign(self, claims: Mapping[str, object], *, key: RSAKey | None = None,
             kid: str | None = None) -> str:
        """Sign ``claims`` as they are (tests use it for bad tokens); default: current key."""
        signer = key or self.keys.current
        header = {"alg": ALGORITHM, "typ": "JWT", "kid": kid or signer.kid}
        return jose_jwt.encode(header, dict(claims), signer)

    def claims_for(self, client: DevClient, scope: str | None) -> JsonObject:
        """The claims of a token issued now to ``client``."""
        now = int(time.time())
        claims: JsonObject = {
            "iss": self.url, "sub": client.client_id, "aud": self.audience, "iat": now,
            "nbf": now, "exp": now + self.token_lifetime_seconds, "jti": uuid.uuid4().hex,
            "client_id": client.client_id,
        }
        if scope:
            claims["scope"] = scope
        if self.tenant_claim and client.tenant:
            claims[self.tenant_claim] = client.tenant
        return claims

    def rotate(self, drop_previous: bool = False) -> str:
        """A new signing key; return its kid."""
        self.count("rotations")
        return self.keys.rotate(drop_previous)

    # -- stats ---------------------------------------------------------------------------

    def count(self, name: str) -> None:
        """Add one to a request counter."""
        with self._stats_lock:
            self._counts[name] = self._counts.get(name, 0) + 1

    def stats(self) -> dict[str, int | list[str]]:
        """Request counts and the published kids."""
        with self._stats_lock:
            counts = dict(self._counts)
        names = ("discovery_requests", "jwks_requests", "token_requests", "token_errors",
                 "rotations")
        result: dict[str, int | list[str]] = {name: counts.get(name, 0) for name in names}
        result["kids"] = [str(k["kid"]) for k in self.jwks()["keys"]]
        return result

    def jwks(self) -> JwksDocument:
        """The published keys."""
        return self.keys.public_jwks()

    def discovery(self) -> JsonObject:
        """The discovery document."""
        return {
            "issuer": self.url,
            "jwks_uri": f"{self.url}/jwks",
            "token_endpoint": f"{self.url}/token",
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic",
                                                      "client_secret_post"],
            "id_token_signing_alg_values_supported": [ALGORITHM],
            "response_types_supported": ["token"],
            "subject_types_supported": ["public"],
        }

    # -- the token endpoint --------------------------------------------------------------

    def token_response(self, form: Mapping[str, list[str]],
                       authorization: str | None) -> tuple[int, JsonObject]:
        """Answer a token request: (HTTP status, JSON body)."""
        self.count("token_requests")
        try:
            client, scope = self._check_request(form, authorization)
        except _Refusal as refusal:
            self.count("token_errors")
            return refusal.status, {"error": refusal.error,
                                    "error_description": refusal.description}
        token = self.sign(self.claims_for(client, scope))
        body: JsonObject = {"access_token": token, "token_type": "Bearer",
                                "expires_in": self.token_lifetime_seconds}
        if scope:
            body["scope"] = scope
        return 200, body

    def _check_request(self, form: Mapping[str, list[str]],
                       authorization: str | None) -> tuple[DevClient, str | None]:
        for name, values in form.items():
            if len(values) != 1:
                raise _Refusal(400, "invalid_request", f"parameter {name!r} repeated")
        single = {name: values[0] for name, values in form.items()}
        grant = single.get("grant_type")
        if grant is None:
            raise _Refusal(400, "invalid_request", "missing grant_type")
        if grant != "client_credentials":
            raise _Refusal(400, "unsupported_grant_type", f"grant_type {grant!r} is not "
                           "supported (client_credentials only)")
        client = self._authenticate(single, authorization)
        audience = single.get("audience")
        if audience is not None and audience != self.audience:
            raise _Refusal(400, "invalid_target", f"unknown audience {audience!r}")
        scope = " ".join(single.get("scope", "").split()) or None
        return client, scope

    def _authenticate(self, form: Mapping[str, str], authorization: str | None) -> DevClient:
        in_form = "client_id" in form or "client_secret" in form
        if authorization is not None:
            if in_form and "client_secret" in form:
                raise _Refusal(400, "invalid_request", "use one client authentication method")
            candidates = _basic_credentials(authorization)
        elif in_form:
            candidates = [(form.get("client_id", ""), form.get("client_secret", ""))]
        else:
            raise _Refusal(401, "invalid_client", "client authentication required")
        known = False
        for client_id, secret in candidates:
            client = self.clients.get(client_id)
            if client is not None:
                known = True
                if hmac.compare_digest(client.secret.encode(), secret.encode()):
                    return client
        raise _Refusal(401, "invalid_client", "bad secret" if known else "unknown client")


class _Refusal(Exception):
    def __init__(self, status: int, error: str, description: str) -> None:
        super().__init__(description)
        self.status, self.error, self.description = status, error, description


def _basic_credentials(header: str) -> list[tuple[str, str]]:
    """The (id, secret) pairs a Basic header may mean: as sent, and form-decoded."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise _Refusal(401, "invalid_client", "unsupported authorization scheme")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise _Refusal(401, "invalid_client", "malformed Basic credentials") from None
    client_id, sep, secret = decoded.partition(":")
    if not sep:
        raise _Refusal(401, "invalid_client", "malformed Basic credentials")
    raw = (client_id, secret)
    unquoted = (unquote_plus(client_id), unquote_plus(secret))
    return [raw] if raw == unquoted else [raw, unquoted]
