"""Sans-I/O SASL server state machines (PLAIN, OAUTHBEARER)."""

from sasl.errors import SaslFailure, UnsupportedMechanism
from sasl.limits import MAX_CLIENT_MESSAGE_BYTES
from sasl.oauthbearer import OAuthBearerServer
from sasl.plain import PlainServer
from sasl.session import (
    OAUTHBEARER,
    PLAIN,
    SUPPORTED_MECHANISMS,
    SaslMechanismRegistry,
    make_server,
    session_lifetime_ms,
)
from sasl.types import (
    Authenticated,
    SaslServer,
    TokenRejected,
    TokenValidator,
    ValidatedToken,
)

__all__ = [
    "MAX_CLIENT_MESSAGE_BYTES",
    "OAUTHBEARER",
    "PLAIN",
    "SUPPORTED_MECHANISMS",
    "Authenticated",
    "OAuthBearerServer",
    "PlainServer",
    "SaslFailure",
    "SaslMechanismRegistry",
    "SaslServer",
    "TokenRejected",
    "TokenValidator",
    "UnsupportedMechanism",
    "ValidatedToken",
    "make_server",
    "session_lifetime_ms",
]
