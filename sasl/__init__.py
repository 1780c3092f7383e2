"""Sans-I/O SASL server state machines (PLAIN, OAUTHBEARER)."""

from sasl.errors import SaslFailure
from sasl.lifetime import session_lifetime_ms
from sasl.limits import MAX_CLIENT_MESSAGE_BYTES
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from sasl.types import (
    Authenticated,
    SaslServer,
    TokenRejected,
    TokenValidator,
    ValidatedToken,
)

__all__ = [
    "MAX_CLIENT_MESSAGE_BYTES",
    "Authenticated",
    "OAuthBearerServer",
    "PlainServer",
    "SaslFailure",
    "SaslServer",
    "TokenRejected",
    "TokenValidator",
    "ValidatedToken",
    "session_lifetime_ms",
]
