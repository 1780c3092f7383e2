"""OAuth: token validation (the OAUTHBEARER server callback), the client-credentials login
callback with its Kafka-client adapters, and a development issuer.

The kafka-python and aiokafka adapters live in ``oauth.kafka_python_provider`` and
``oauth.aiokafka_provider`` (each imports its client); everything else is exported here.
"""

from oauth.adapters import confluent_config, confluent_oauth_cb
from oauth.credentials import ClientCredentials, load_credentials, parse_credentials
from oauth.errors import (
    FetchError,
    KeysUnavailable,
    OAuthConfigError,
    OAuthError,
    TokenInvalid,
)
from oauth.jwks import JwksCache
from oauth.jwks_validator import JwksTokenValidator
from oauth.key_validator import (
    HMAC_ALGORITHMS,
    RSA_ALGORITHMS,
    JwtTokenValidator,
    TokenSettings,
)
from oauth.keys import (
    PublicKey,
    load_key_material,
    load_public_key,
    load_secret_key,
    parse_public_key,
)
from oauth.login import AccessToken, ClientCredentialsLogin
from oauth.settings import ValidatorSettings, parse_validator_settings

__all__ = [
    "HMAC_ALGORITHMS",
    "RSA_ALGORITHMS",
    "AccessToken",
    "ClientCredentials",
    "ClientCredentialsLogin",
    "FetchError",
    "JwksCache",
    "JwksTokenValidator",
    "JwtTokenValidator",
    "KeysUnavailable",
    "OAuthConfigError",
    "OAuthError",
    "PublicKey",
    "TokenInvalid",
    "TokenSettings",
    "ValidatorSettings",
    "confluent_config",
    "confluent_oauth_cb",
    "load_credentials",
    "load_key_material",
    "load_public_key",
    "load_secret_key",
    "parse_credentials",
    "parse_public_key",
    "parse_validator_settings",
]
