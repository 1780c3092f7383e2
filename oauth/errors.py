"""Exceptions of the OAuth package: token rejections (server side), issuer errors (client
side) and configuration mistakes."""

from __future__ import annotations

from sasl.types import TokenPending, TokenRejected


class TokenInvalid(TokenRejected):
    """A token failed validation; ``message`` is short and safe to show the client."""


class KeysUnavailable(TokenInvalid):
    """The issuer's signing keys could not be fetched, so no token can be checked now."""


class KeysPending(KeysUnavailable, TokenPending):
    """No signing keys are held yet and a fetch is under way: ``ready`` is done when it
    ends (a login may wait for it, see ``sasl.types.TokenPending``)."""


class OAuthConfigError(ValueError):
    """An OAuth setting is unknown or has a bad value; the message names the key."""


class FetchError(Exception):
    """An HTTP document (discovery, JWKS) could not be fetched or was not as expected."""


class OAuthError(Exception):
    """The issuer refused a token request, or could not be asked.

    ``error`` is the OAuth error code (RFC 6749 section 5.2, e.g. ``invalid_client``) or
    ``request_failed`` when the issuer could not be reached or answered nonsense;
    ``description`` is the issuer's ``error_description`` or our explanation.
    """

    def __init__(self, error: str, description: str = "") -> None:
        self.error = error
        self.description = description
        super().__init__(f"{error}: {description}" if description else error)
