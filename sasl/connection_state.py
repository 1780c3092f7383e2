"""The SASL state of one connection, sans-I/O: the exchange under way, the login, and how
long the session may last before it must re-authenticate (KIP-368).

Kafka's rules (``SaslServerAuthenticator``): on a SASL listener nothing but ApiVersions and
the SASL APIs is served before a login, in its order (the states ``INITIAL_REQUEST``,
``HANDSHAKE_OR_VERSIONS_REQUEST``, ``HANDSHAKE_REQUEST``, ``AUTHENTICATE``): one ApiVersions
at most (one of a version the broker does not serve is answered UNSUPPORTED_VERSION and
may be retried), then SaslHandshake, then SaslAuthenticate; anything else closes the
connection. A SaslHandshake starts a login, or a
re-authentication of a session that has a lifetime (SaslHandshake v1, the same mechanism,
and the same principal and tenant at the end); after a v0 handshake the client sends bare
tokens until the login completes. A session past its lifetime is closed on its next
request, a SaslHandshake included (only an exchange begun in time may finish). The
caller (the connection's session in ``edge/``) does the I/O: it runs the mechanism's
steps, answers, audits and closes; the clock comes in as ``now`` (ms since the epoch).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from sasl.errors import SaslFailure
from sasl.lifetime import session_lifetime_ms
from sasl.types import Authenticated, SaslServer


class Phase(Enum):
    """Where a connection stands."""

    NOT_LOGGED_IN = "not logged in"
    """No login yet (on a listener without SASL, for ever)."""
    AUTHENTICATING = "authenticating"
    """A first exchange is under way."""
    LOGGED_IN = "logged in"
    REAUTHENTICATING = "re-authenticating"
    """A logged-in session runs a new exchange."""


class Handshake(Enum):
    """The verdict on a SaslHandshake."""

    ACCEPTED = "accepted"
    """Start the exchange (:meth:`ConnectionSasl.begin`)."""
    NOT_NOW = "SaslHandshake on a connection that cannot re-authenticate"
    """Answered ILLEGAL_SASL_STATE; the connection stays (no SASL on the listener, or a
    session without a lifetime)."""
    DURING_EXCHANGE = "SaslHandshake during a SASL exchange"
    """Answered ILLEGAL_SASL_STATE; the connection is closed."""
    UNSUPPORTED = "the SASL mechanism is not enabled"
    """Answered UNSUPPORTED_SASL_MECHANISM; the connection is closed."""
    WRONG_REAUTHENTICATION = ("re-authentication must use SaslHandshake v1 and the same "
                              "mechanism")
    """Answered ILLEGAL_SASL_STATE; the connection is closed."""


class ConnectionSasl:
    """The SASL state of one connection (``sasl_listener``: whether it must log in)."""

    def __init__(self, sasl_listener: bool, max_reauth_ms: int = 0) -> None:
        self.sasl_listener = sasl_listener
        self.max_reauth_ms = max_reauth_ms
        self.login: Authenticated | None = None
        """The last successful login (kept while a re-authentication runs)."""
        self.exchange: SaslServer | None = None
        """The mechanism of the exchange under way."""
        self.raw_tokens = False
        """After a v0 handshake: the next frames are bare SASL tokens."""
        self.session_ends_ms: int | None = None
        """When the session must have re-authenticated by; None: no limit."""
        self.versions_answered = False
        """Whether an ApiVersions was answered before the login (Kafka answers one)."""

    @property
    def phase(self) -> Phase:
        """Where the connection stands."""
        if self.exchange is not None:
            return Phase.AUTHENTICATING if self.login is None else Phase.REAUTHENTICATING
        return Phase.NOT_LOGGED_IN if self.login is None else Phase.LOGGED_IN

    @property
    def gated(self) -> bool:
        """Whether only ApiVersions and the SASL APIs may be served (a SASL listener, no
        login yet)."""
        return self.sasl_listener and self.login is None

    def takes_authenticate(self) -> bool:
        """Whether a SaslAuthenticate belongs to a login (else: it comes after one and is
        answered ILLEGAL_SASL_STATE, the connection stays)."""
        return self.sasl_listener and (self.exchange is not None or self.login is None)

    def expired(self, now: int, authenticate: bool = False) -> bool:
        """Whether the session outlived its lifetime without re-authenticating, so that a
        request closes the connection (Kafka checks before anything else, a SaslHandshake
        included); a SaslAuthenticate (``authenticate``) of a re-authentication begun in
        time may still finish it."""
        if self.session_ends_ms is None or now <= self.session_ends_ms:
            return False
        return not (authenticate and self.exchange is not None)

    def before_login(self, api_versions: bool, supported: bool = True) -> str | None:
        """The verdict on a request other than SaslHandshake and SaslAuthenticate while
        :attr:`gated`: None when it is served (an ApiVersions, ``supported``: of a version
        served, which uses up the one allowed), else why the connection is closed."""
        if not api_versions:
            return "request before SASL authentication"
        if self.exchange is not None:
            return "ApiVersions during a SASL exchange"
        if self.versions_answered:
            return "ApiVersions repeated before SaslHandshake"
        self.versions_answered = supported
        return None

    # -- the exchange --------------------------------------------------------------------

    def handshake(self, mechanism: str, version: int, offered: Collection[str]) -> Handshake:
        """The verdict on a SaslHandshake for ``mechanism`` (``offered``: the listener's)."""
        if not self.sasl_listener or (self.phase == Phase.LOGGED_IN
                                      and self.session_ends_ms is None):
            return Handshake.NOT_NOW
        if self.exchange is not None:
            return Handshake.DURING_EXCHANGE
        if mechanism not in offered:
            return Handshake.UNSUPPORTED
        if self.login is not None and (version == 0 or mechanism != self.login.mechanism):
            return Handshake.WRONG_REAUTHENTICATION
        return Handshake.ACCEPTED

    def begin(self, server: SaslServer, version: int) -> None:
        """An accepted handshake starts ``server``'s exchange (v0: bare tokens follow)."""
        self.exchange = server
        self.raw_tokens = version == 0

    def authenticating(self) -> SaslServer | None:
        """The exchange a SaslAuthenticate continues; None when there is none (no
        handshake, or a v0 handshake whose tokens come bare): ILLEGAL_SASL_STATE."""
        return None if self.raw_tokens else self.exchange

    def check(self, result: Authenticated) -> None:
        """A re-authentication may not change who is logged in (SaslFailure)."""
        login = self.login
        if login is not None and (result.principal, result.tenant, result.namespace) != (
                login.principal, login.tenant, login.namespace):
            raise SaslFailure("re-authentication may not change the principal or tenant")

    def succeeded(self, result: Authenticated, now: int) -> int:
        """The exchange logged ``result`` in (checked already); return the session lifetime
        (KIP-368, ms; 0: no limit)."""
        self.login = result
        self.exchange = None
        self.raw_tokens = False
        lifetime = session_lifetime_ms(now, result.expires_at_ms, self.max_reauth_ms)
        self.session_ends_ms = now + lifetime if lifetime > 0 else None
        return lifetime

    def failed(self) -> None:
        """The exchange failed (the connection is closed after the answer)."""
        self.exchange = None

    def lifetime_left(self, now: int) -> int:
        """What SaslAuthenticate reports after a login: the ms left (at least 1), 0 when
        the session has no limit."""
        if self.session_ends_ms is None:
            return 0
        return max(self.session_ends_ms - now, 1)
