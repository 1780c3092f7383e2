"""Session lifetime for re-authentication (KIP-368) and the SASL mechanism registry.

``session_lifetime_ms`` gives the value a broker reports in SaslAuthenticate's
``session_lifetime_ms``; the registry builds a fresh server mechanism per handshake,
refusing mechanisms that the listener has not enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from sasl.errors import UnsupportedMechanism
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from sasl.types import SaslServer, TokenValidator

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
SUPPORTED_MECHANISMS: tuple[str, ...] = (PLAIN, OAUTHBEARER)

ServerFactory = Callable[[], SaslServer]


def session_lifetime_ms(now_ms: int, token_expiry_ms: int | None, max_reauth_ms: int) -> int:
    """The session lifetime to report after a successful authentication.

    0 means no limit and is returned only when neither bound applies (no token expiry,
    ``max_reauth_ms <= 0``). Otherwise it is the smaller of the time left until the token
    expires and ``max_reauth_ms`` (when positive). A token already at or past its expiry
    gives 1 ms, never 0 or less, so that it cannot be mistaken for "no limit".
    """
    bounds: list[int] = []
    if token_expiry_ms is not None:
        bounds.append(token_expiry_ms - now_ms)
    if max_reauth_ms > 0:
        bounds.append(max_reauth_ms)
    if not bounds:
        return 0
    return max(min(bounds), 1)


class SaslMechanismRegistry:
    """The mechanisms a listener enables and how to build a server for each of them."""

    def __init__(
        self,
        allowed: Sequence[str],
        *,
        plain_validator: TokenValidator | None = None,
        oauthbearer_validator: TokenValidator | None = None,
        tenant_claim: str | None = None,
    ) -> None:
        factories: dict[str, ServerFactory] = {}
        for name in allowed:
            if name in factories:
                continue
            factories[name] = self._factory(
                name, plain_validator, oauthbearer_validator, tenant_claim
            )
        self._factories: Mapping[str, ServerFactory] = MappingProxyType(factories)

    @staticmethod
    def _factory(
        name: str,
        plain_validator: TokenValidator | None,
        oauthbearer_validator: TokenValidator | None,
        tenant_claim: str | None,
    ) -> ServerFactory:
        if name == PLAIN:
            if plain_validator is None:
                raise ValueError("SASL mechanism PLAIN is enabled but has no token validator")
            plain = plain_validator
            return lambda: PlainServer(plain)
        if name == OAUTHBEARER:
            if oauthbearer_validator is None:
                raise ValueError("SASL mechanism OAUTHBEARER is enabled but has no token validator")
            bearer = oauthbearer_validator
            return lambda: OAuthBearerServer(bearer, tenant_claim=tenant_claim)
        raise ValueError(
            f"unknown SASL mechanism {name!r}; supported: {', '.join(SUPPORTED_MECHANISMS)}"
        )

    @property
    def enabled(self) -> tuple[str, ...]:
        """The enabled mechanism names, in configured order."""
        return tuple(self._factories)

    def make_server(self, mechanism: str) -> SaslServer:
        """A new server for ``mechanism`` (case-sensitive); raises UnsupportedMechanism."""
        factory = self._factories.get(mechanism)
        if factory is None:
            raise UnsupportedMechanism(self.enabled, mechanism)
        return factory()


def make_server(
    mechanism: str,
    allowed: Sequence[str],
    *,
    plain_validator: TokenValidator | None = None,
    oauthbearer_validator: TokenValidator | None = None,
    tenant_claim: str | None = None,
) -> SaslServer:
    """Build a server for ``mechanism`` if it is in ``allowed``, else UnsupportedMechanism.

    Only the requested mechanism needs its validator; asking for an enabled mechanism
    without one is a ValueError (a configuration fault, not a client fault).
    """
    if mechanism not in allowed:
        raise UnsupportedMechanism(tuple(dict.fromkeys(allowed)), mechanism)
    return SaslMechanismRegistry(
        [mechanism],
        plain_validator=plain_validator,
        oauthbearer_validator=oauthbearer_validator,
        tenant_claim=tenant_claim,
    ).make_server(mechanism)
