"""Adapters that plug :class:`~oauth.login.ClientCredentialsLogin` into Kafka clients.

- confluent-kafka: :func:`confluent_oauth_cb` gives the ``oauth_cb`` callable; librdkafka
  calls it at start and again at 80 % of each token's lifetime, and it returns
  ``(token, expiry seconds since the epoch, principal, extensions)``, the extensions being
  ``tenant`` / ``groupId`` from the credentials. :func:`confluent_config` gives the
  whole configuration fragment.
- kafka-python: :class:`oauth.kafka_python_provider.KafkaPythonTokenProvider`.
- aiokafka: :class:`oauth.aiokafka_provider.AioKafkaTokenProvider`.

(The last two live in their own modules so that each imports only its own client.)
"""

from __future__ import annotations

from collections.abc import Callable

from oauth.login import ClientCredentialsLogin

OAuthCallback = Callable[[str], tuple[str, float, str, dict[str, str]]]


def confluent_oauth_cb(login: ClientCredentialsLogin) -> OAuthCallback:
    """An ``oauth_cb`` for confluent-kafka; errors propagate and librdkafka retries."""

    def oauth_cb(_oauthbearer_config: str) -> tuple[str, float, str, dict[str, str]]:
        token = login.token()
        return token.value, token.expires_at, token.principal, login.extensions()

    return oauth_cb


def confluent_config(login: ClientCredentialsLogin) -> dict[str, str | OAuthCallback]:
    """The confluent-kafka settings for an OAUTHBEARER login through ``login``
    (add ``bootstrap.servers`` and ``security.protocol``)."""
    return {"sasl.mechanisms": "OAUTHBEARER", "oauth_cb": confluent_oauth_cb(login)}
