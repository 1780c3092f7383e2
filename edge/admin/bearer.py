"""OAUTHBEARER logins of the admin command: the client properties of OIDC client
credentials (KIP-768's and librdkafka's names) become this project's login callback,
:class:`oauth.login.ClientCredentialsLogin`, behind kafka-python's token provider.

``sasl.mechanism=OAUTHBEARER`` takes ``sasl.oauthbearer.token.endpoint.url``,
``sasl.oauthbearer.client.id``, ``sasl.oauthbearer.client.secret`` (all three required),
``sasl.oauthbearer.scope``, ``sasl.oauthbearer.extensions`` (``tenant=acme,groupId=g``:
the SASL extensions the login callback sends) and ``sasl.oauthbearer.method`` (``oidc``,
librdkafka's name for this; its unsecured ``default`` is not offered). The first token is
asked for before the first connection, so an issuer's refusal (a wrong secret) is one
clear line instead of a broker that cannot be reached.
"""

from __future__ import annotations

from collections.abc import Mapping

from edge.admin.errors import LINE_LIMIT, CallFailed, UsageError
from oauth.credentials import GROUP_ID_EXTENSION, TENANT_EXTENSION, ClientCredentials
from oauth.errors import OAuthError
from oauth.kafka_python_provider import KafkaPythonTokenProvider
from oauth.login import ClientCredentialsLogin
from sasl.printable import printable

PREFIX = "sasl.oauthbearer."
METHOD = PREFIX + "method"
ENDPOINT = PREFIX + "token.endpoint.url"
CLIENT_ID = PREFIX + "client.id"
CLIENT_SECRET = PREFIX + "client.secret"
SCOPE = PREFIX + "scope"
EXTENSIONS = PREFIX + "extensions"
BEARER_KEYS = (METHOD, ENDPOINT, CLIENT_ID, CLIENT_SECRET, SCOPE, EXTENSIONS)
"""The OAUTHBEARER client properties taken."""


def _extensions(text: str, where: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or name not in (TENANT_EXTENSION, GROUP_ID_EXTENSION) or not value:
            raise UsageError(f"{where}: {EXTENSIONS} takes {TENANT_EXTENSION}=T and "
                             f"{GROUP_ID_EXTENSION}=G (comma-separated), not {item!r}")
        found[name] = value
    return found


def token_provider(properties: Mapping[str, str], where: str,
                   timeout_s: float) -> KafkaPythonTokenProvider:
    """The token provider of an OAUTHBEARER login (UsageError for a missing or bad key)."""
    method = properties.get(METHOD, "oidc").strip().lower()
    if method != "oidc":
        raise UsageError(f"{where}: {METHOD} {method!r} is not supported here (only 'oidc': "
                         f"client credentials from {ENDPOINT})")
    missing = [key for key in (ENDPOINT, CLIENT_ID, CLIENT_SECRET) if not properties.get(key)]
    if missing:
        raise UsageError(f"{where}: sasl.mechanism OAUTHBEARER needs {', '.join(missing)}")
    extensions = _extensions(properties.get(EXTENSIONS, ""), where)
    credentials = ClientCredentials(properties[CLIENT_ID], properties[CLIENT_SECRET],
                                    extensions.get(TENANT_EXTENSION),
                                    extensions.get(GROUP_ID_EXTENSION))
    try:
        login = ClientCredentialsLogin(None, credentials=credentials,
                                       token_endpoint=properties[ENDPOINT],
                                       scope=properties.get(SCOPE) or None,
                                       timeout_seconds=timeout_s)
    except ValueError as exc:
        raise UsageError(f"{where}: {ENDPOINT}: {exc}") from None
    return KafkaPythonTokenProvider(login)


def first_token(provider: KafkaPythonTokenProvider) -> None:
    """Ask for (or reuse) the provider's token; CallFailed with the issuer's answer."""
    try:
        provider.login.token()
    except OAuthError as exc:
        raise CallFailed(printable(f"OAuth login failed: {exc}", LINE_LIMIT)) from None
