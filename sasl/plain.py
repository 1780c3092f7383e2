"""The SASL PLAIN server mechanism (RFC 4616) carrying Pulsar-style ``token:<jwt>`` passwords.

The username names the tenant (``tenant`` or ``tenant/namespace``, never the broker's
own namespace, which the composition root passes in as ``reserved_namespace``); the
password is ``<method>:<credential>`` where only the ``token`` method exists; the role
comes from the token, as in Kafka-on-Pulsar. With a tenant claim configured
(``oauth.tenant.claim``), a token carrying it logs in to that tenant only
(``sasl.tenant_claim``).
"""

from __future__ import annotations

from sasl.errors import SaslFailure, SaslPending
from sasl.limits import check_message_size
from sasl.mechanism import TokenMechanism
from sasl.names import claimed_tenant, parse_tenant_spec
from sasl.printable import printable
from sasl.tenant_claim import bound_tenant, token_tenant
from sasl.types import Authenticated, TokenValidator

SUPPORTED_METHOD = "token"
_METHOD_LIMIT = 32
"""How much of an unknown password method a failure message quotes."""


class PlainServer(TokenMechanism):
    """One PLAIN exchange: a single client message, answered with empty bytes on success."""

    mechanism = "PLAIN"

    def __init__(self, validator: TokenValidator, *, reserved_namespace: str | None = None,
                 tenant_claim: str | None = None) -> None:
        super().__init__(validator)
        self._reserved_namespace = reserved_namespace
        self._tenant_claim = tenant_claim
        self._done = False

    def step(self, message: bytes) -> bytes:
        if self._done:
            raise SaslFailure("PLAIN takes a single message; the exchange is already over")
        self._done = True
        try:
            self._result = self._authenticate(message)
        except SaslPending:
            self._done = False  # not a step: the same message comes again
            raise
        return b""

    def _authenticate(self, message: bytes) -> Authenticated:
        check_message_size(message)
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure("invalid PLAIN message: not valid UTF-8") from None
        parts = text.split("\x00")
        if len(parts) != 3:
            raise SaslFailure(
                "invalid PLAIN message: expected 'authzid NUL username NUL password' "
                f"(3 fields), got {len(parts)}"
            )
        authzid, username, password = parts
        self._claim_tenant(claimed_tenant(username))
        if authzid and authzid != username:
            raise SaslFailure("PLAIN authorization id must be empty or equal the username")
        tenant, namespace = parse_tenant_spec(username, self._reserved_namespace)
        method, sep, credential = password.partition(":")
        if not sep:
            raise SaslFailure(f"invalid password: expected '{SUPPORTED_METHOD}:<credential>'")
        if method != SUPPORTED_METHOD:
            raise SaslFailure(
                f"unsupported authentication method '{printable(method, _METHOD_LIMIT)}'; "
                f"supported: '{SUPPORTED_METHOD}'"
            )
        if not credential:
            raise SaslFailure("invalid password: empty token")
        token = self._validate(credential)
        bound_tenant(token_tenant(token, self._tenant_claim), tenant, "the username")
        return Authenticated(
            principal=token.principal,
            tenant=tenant,
            namespace=namespace,
            expires_at_ms=token.expires_at_ms,
            mechanism=self.mechanism,
        )
