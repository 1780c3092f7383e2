"""OAuth: token validation (server callback) and client-credentials login callback."""

from oauth.errors import TokenInvalid
from oauth.keys import (
    PublicKey,
    load_key_material,
    load_public_key,
    load_secret_key,
    parse_public_key,
)
from oauth.token import (
    HMAC_ALGORITHMS,
    RSA_ALGORITHMS,
    JwtTokenValidator,
    TokenSettings,
)

__all__ = [
    "HMAC_ALGORITHMS",
    "RSA_ALGORITHMS",
    "JwtTokenValidator",
    "PublicKey",
    "TokenInvalid",
    "TokenSettings",
    "load_key_material",
    "load_public_key",
    "load_secret_key",
    "parse_public_key",
]
