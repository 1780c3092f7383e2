"""An aiokafka token provider (``sasl_oauth_token_provider``) backed by
:class:`~oauth.login.ClientCredentialsLogin`. The blocking token request runs in a worker
thread so the event loop never waits on the issuer."""

from __future__ import annotations

import asyncio

from aiokafka.abc import AbstractTokenProvider

from oauth.login import ClientCredentialsLogin


class AioKafkaTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """Pass as ``sasl_oauth_token_provider`` with ``sasl_mechanism="OAUTHBEARER"``."""

    def __init__(self, login: ClientCredentialsLogin) -> None:
        self.login = login

    async def token(self) -> str:
        access = await asyncio.to_thread(self.login.token)
        return access.value

    def extensions(self) -> dict[str, str]:
        return self.login.extensions()
