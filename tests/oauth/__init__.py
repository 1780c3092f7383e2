"""OAuth: token validation, JWKS, the dev issuer, clients logging in with tokens."""
