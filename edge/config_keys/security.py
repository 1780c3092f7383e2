"""Configuration keys of SASL logins and token validation, TLS, the limits on
connections before a login, and authorization.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from common.settings import key
from edge.config_types import INT_MAX, SecretKeyUrl
from listeners.tls import PrincipalMode

TokenExpiration = Literal["REQUIRED", "OPTIONAL"]


class SaslKeys(BaseModel):
    """SASL logins: the mechanisms offered, how `token:` passwords and OAUTHBEARER tokens
    are validated, the delay after a failed login and the session lifetime."""

    sasl_allowed_mechanisms: Annotated[tuple[str, ...], key(
        "saslAllowedMechanisms",
        "SASL mechanisms offered on SASL listeners: PLAIN, OAUTHBEARER (comma-separated)"
        )] = ("PLAIN",)
    sasl_listener_mechanisms: Annotated[tuple[str, ...], key(
        "saslListenerMechanisms",
        "per-listener override, `NAME:MECH+MECH,NAME:MECH`")] = ()
    token_secret_key: Annotated[SecretKeyUrl, key(
        "tokenSecretKey",
        "HMAC secret for `token:` passwords, as `data:;base64,...` or `file:` URL")] = ""
    token_public_key: Annotated[str, key(
        "tokenPublicKey",
        "RSA or EC public key (PEM or DER) for `token:` passwords, as `data:` or `file:` URL")] = ""
    token_auth_claim: Annotated[str, key(
        "tokenAuthClaim",
        "token claim that names the role (the principal)", min_length=1)] = "sub"
    token_audience_claim: Annotated[str, key(
        "tokenAudienceClaim",
        "token claim checked against `tokenAudience` (default `aud`)")] = ""
    token_audience: Annotated[str, key(
        "tokenAudience",
        "audience a token must carry; empty = not checked")] = ""
    token_expiration: Annotated[TokenExpiration, key(
        "tokenExpiration",
        "`required`: a token (PLAIN `token:` and OAUTHBEARER) without an `exp` claim is "
        "refused; `optional`: such a token never expires (the behaviour before this key; "
        "OAUTHBEARER with the issuer's JWKS always requires `exp`)")] = "REQUIRED"
    token_max_lifetime_seconds: Annotated[int, key(
        "tokenMaxLifetimeSeconds",
        "refuse a token whose lifetime is longer (`exp` - `iat`, or `exp` - now without "
        "`iat`; an `iat` in the future beyond the clock skew is refused), PLAIN and "
        "OAUTHBEARER alike; 0 = no limit (the default: off); a day (86400) or less is "
        "recommended", ge=0, le=INT_MAX)] = 0
    kop_oauth2_config_file: Annotated[str, key(
        "kopOauth2ConfigFile",
        "properties file of the OAUTHBEARER validator (oauth.* keys)")] = ""
    failed_authentication_delay_ms: Annotated[int, key(
        "failedAuthenticationDelayMs",
        "wait before answering a failed login (ms)", ge=0, le=INT_MAX)] = 300
    connections_max_reauth_ms: Annotated[int, key(
        "connectionsMaxReauthMs",
        "longest SASL session before re-authentication (ms); 0 = only the token's expiry "
        "limits it", ge=0)] = 0


class ListenerSecurityKeys(BaseModel):
    """TLS of SSL and SASL_SSL listeners, and the limits on connections before (and
    regardless of) a login."""

    tls_certificate_file_path: Annotated[str, key(
        "tlsCertificateFilePath",
        "PEM certificate (chain) of SSL and SASL_SSL listeners")] = ""
    tls_key_file_path: Annotated[str, key(
        "tlsKeyFilePath",
        "PEM private key of that certificate")] = ""
    tls_trust_certs_file_path: Annotated[str, key(
        "tlsTrustCertsFilePath",
        "PEM CA certificates trusted for client certificates on SSL listeners")] = ""
    tls_require_trusted_client_cert_on_connect: Annotated[bool, key(
        "tlsRequireTrustedClientCertOnConnect",
        "require a client certificate on SSL listeners (SASL_SSL listeners ask for none: "
        "their clients log in by SASL); its principal is as `tlsPrincipal` says")] = False
    tls_principal: Annotated[PrincipalMode, key(
        "tlsPrincipal",
        "what names a client certificate's principal on SSL listeners: `CN` its subject's "
        "common name (a certificate with none or several is refused), `DN` its whole "
        "subject as RFC 4514, `CN=app,O=Acme` (Kafka's default); a connection without a "
        "certificate is `ANONYMOUS`")] = "CN"
    max_connections_per_listener: Annotated[int, key(
        "maxConnectionsPerListener",
        "connections a listener holds at once, counted from their accept (before a TLS "
        "handshake); more are closed at once", ge=1, le=INT_MAX)] = 10000
    max_connections_per_ip: Annotated[int, key(
        "maxConnectionsPerIp",
        "connections one client address may hold at once across the listeners (Kafka's "
        "`max.connections.per.ip`), counted from their accept; more are closed at once; 0 "
        "= only the addresses in `maxConnectionsPerIpOverrides` (0 without overrides stops "
        "the start: no client could connect)", ge=0, le=INT_MAX
        )] = INT_MAX
    max_connections_per_ip_overrides: Annotated[tuple[str, ...], key(
        "maxConnectionsPerIpOverrides",
        "per-address caps instead of `maxConnectionsPerIp`, `ADDRESS:COUNT,ADDRESS:COUNT` "
        "(IP addresses, e.g. an Envoy's; Kafka's `max.connections.per.ip.overrides`)")] = ()
    tls_handshake_timeout_ms: Annotated[int, key(
        "tlsHandshakeTimeoutMs",
        "time a TLS handshake may take on SSL and SASL_SSL listeners (ms), and a PROXY "
        "protocol header on listeners in `proxyProtocolTrustedAddresses`; then the "
        "connection is closed", ge=100, le=INT_MAX)] = 10_000
    proxy_protocol_trusted_addresses: Annotated[tuple[str, ...], key(
        "proxyProtocolTrustedAddresses",
        "listeners behind a proxy that sends the PROXY protocol v2 header (Envoy: "
        "`edge-broker envoy-config --proxy-protocol`), `NAME:ADDRESS+ADDRESS,NAME:CIDR`: "
        "each connection to such a listener must come from one of its addresses or CIDR "
        "ranges and start with the header, whose client address then counts as the "
        "connection's (ACL hosts, audit, `maxConnectionsPerIp`); others are closed")] = ()
    sasl_server_max_receive_size: Annotated[int, key(
        "saslServerMaxReceiveSize",
        "largest frame accepted on a SASL listener before login, in bytes (Kafka's "
        "`sasl.server.max.receive.size`); a larger one closes the connection",
        ge=1, le=INT_MAX)] = 524288
    max_unauthenticated_buffered_bytes: Annotated[int, key(
        "maxUnauthenticatedBufferedBytes",
        "bytes that frames larger than 16 KiB of connections not yet logged in may hold at "
        "once, counted as they arrive (smaller ones, any login, are not counted); a frame "
        "beyond it closes its connection", ge=1, le=INT_MAX)] = 67108864
    max_concurrent_logins: Annotated[int, key(
        "maxConcurrentLogins",
        "requests of connections not yet logged in (ApiVersions, SaslHandshake, "
        "SaslAuthenticate) served at once across the listeners; more wait their turn, so "
        "that a login storm does not delay logged-in clients' requests", ge=1,
        le=INT_MAX)] = 8


class AuthorizationKeys(BaseModel):
    """ACL checks, the superusers, and the namespaces 'all topics' lists."""

    authorization_enabled: Annotated[bool, key(
        "authorizationEnabled",
        "check ACLs on every request (superusers pass every check)")] = False
    super_user_roles: Annotated[tuple[str, ...], key(
        "superUserRoles",
        "roles that pass every check, comma-separated")] = ()
    kop_allowed_namespaces: Annotated[tuple[str, ...], key(
        "kopAllowedNamespaces",
        "namespaces listed by 'all topics', e.g. `${tenant}/default,${tenant}/*`; empty = the"
        " login's namespace")] = ()
    max_acl_bindings_per_tenant: Annotated[int, key(
        "maxAclBindingsPerTenant",
        "ACL bindings CreateAcls may hold per tenant (a superuser's count for the tenant "
        "they name); a new one beyond answers POLICY_VIOLATION, and a CreateAcls of more "
        "creations than this answers INVALID_REQUEST for each", ge=1, le=INT_MAX)] = 1000
