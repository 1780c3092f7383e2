"""A kafka-python token provider (``sasl_oauth_token_provider``) backed by
:class:`~oauth.login.ClientCredentialsLogin`: ``token()`` returns a cached or refreshed
access token, ``extensions()`` the ``tenant`` / ``groupId`` SASL extensions."""

from __future__ import annotations

from kafka.net.sasl.oauth import AbstractTokenProvider

from oauth.login import ClientCredentialsLogin


class KafkaPythonTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """Pass as ``sasl_oauth_token_provider`` with ``sasl_mechanism="OAUTHBEARER"``."""

    def __init__(self, login: ClientCredentialsLogin) -> None:
        super().__init__()
        self.login = login

    def token(self) -> str:
        return self.login.token().value

    def extensions(self) -> dict[str, str]:
        return self.login.extensions()
