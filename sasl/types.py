"""Value types and protocols shared by the SASL mechanisms and their token validators."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from sasl.printable import printable


def _no_extensions() -> Mapping[str, str]:
    return MappingProxyType({})


class TokenRejected(Exception):
    """A validator refused a token; ``message`` is short and safe to show the client
    (escaped and bounded like :class:`sasl.errors.SaslFailure`'s)."""

    def __init__(self, message: str) -> None:
        self.message = printable(message)
        super().__init__(self.message)


class TokenPending(TokenRejected):
    """A validator cannot check the token until something under way ends (an issuer's
    first signing keys being fetched): ``ready`` is done once it has. A login may wait
    for it, at most ``wait_seconds`` and holding no thread, then ask again; ``message``
    is the refusal when it does not wait."""

    def __init__(self, message: str, ready: Future[None], wait_seconds: float) -> None:
        super().__init__(message)
        self.ready = ready
        self.wait_seconds = wait_seconds


@dataclass(frozen=True)
class ValidatedToken:
    """What a validator learned from an accepted token."""

    principal: str
    """The role, taken from the configured claim."""
    expires_at_ms: int | None
    """The token's ``exp`` in milliseconds since the epoch, ``None`` if it has none."""
    claims: Mapping[str, object]


class TokenValidator(Protocol):
    """Checks a bearer token; raises :class:`TokenRejected` (or a subclass) if it is bad."""

    def validate(self, token: str) -> ValidatedToken: ...


@dataclass(frozen=True)
class Authenticated:
    """The outcome of a successful SASL exchange."""

    principal: str
    """The role."""
    tenant: str | None
    """From the PLAIN username, or a token claim / extension; ``None`` = broker default."""
    namespace: str | None
    """From a PLAIN username of the form ``tenant/namespace``."""
    expires_at_ms: int | None
    """The session must end no later than this (ms since the epoch); ``None`` = no bound."""
    mechanism: str
    extensions: Mapping[str, str] = field(default_factory=_no_extensions)
    """OAUTHBEARER extensions such as ``groupId``."""


class SaslServer(Protocol):
    """A sans-I/O SASL server mechanism: feed it client messages, send back what it returns."""

    @property
    def mechanism(self) -> str: ...

    def step(self, message: bytes) -> bytes:
        """Consume one client message; return the bytes to send back. Raises SaslFailure;
        SaslPending (at most once per exchange) when the message cannot be judged yet:
        the exchange did not move, and the caller gives the same message again once
        ``ready`` is done (or ``wait_seconds`` passed)."""
        ...

    @property
    def complete(self) -> bool: ...

    @property
    def result(self) -> Authenticated | None: ...

    @property
    def refused(self) -> str | None:
        """None, unless a step answered a failed login with an error challenge (RFC 7628
        section 3.2.2) instead of raising SaslFailure: then why it failed. The login has
        failed as of that step (the caller reports it then); the client's next message ends
        the exchange with SaslFailure for the same reason."""
        ...

    @property
    def claimed_tenant(self) -> str | None:
        """The tenant the client named so far (username, extension or token claim), even
        if the login then failed or the name is invalid; ``None`` if it named none.
        Escaped and bounded: for audit events and log lines."""
        ...
