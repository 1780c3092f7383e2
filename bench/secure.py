"""What the TLS, login and tenant rows share: certificates, token keys, a broker with
several listeners, and the client settings of each security protocol.

The certificates are the project's own (``edge.certs.make_certs``, as ``edge-broker
certs`` writes them); tokens are signed with pyjwt, HS256 with a random secret or RS256
with a fresh 2048-bit RSA key, the kinds the broker's ``tokenSecretKey`` and
``tokenPublicKey`` check. PLAIN logs in as tenant ``public`` (the broker's default
tenant, so every listener sees the same topics) with the password ``token:<jwt>``.
"""

from __future__ import annotations

import base64
import functools
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bench.brokers import EdgeBroker
from edge.certs import make_certs
from edge.ready_line import parse_ready

TENANT = "public"
"""The tenant PLAIN logs in to: the broker's default, whose topics PLAINTEXT sees too."""


@dataclass(frozen=True)
class Material:
    """Files in a temporary directory: CA, server certificate and key, token keys."""

    directory: Path
    ca: Path
    cert: Path
    key: Path
    hmac_secret: bytes
    rsa_private: Path
    rsa_public: Path

    def hs256_settings(self) -> dict[str, str]:
        """Broker keys checking HS256 tokens."""
        return {"tokenSecretKey": "data:;base64," + base64.b64encode(self.hmac_secret).decode()}

    def rs256_settings(self) -> dict[str, str]:
        """Broker keys checking RS256 tokens."""
        return {"tokenPublicKey": self.rsa_public.resolve().as_uri()}

    def tls_settings(self) -> dict[str, str]:
        """Broker keys serving the server certificate."""
        return {"tlsCertificateFilePath": str(self.cert), "tlsKeyFilePath": str(self.key)}

    def token(self, algorithm: str = "HS256", sub: str = "bench", lifetime_s: int = 7200,
              **claims: str) -> str:
        """A token for role ``sub`` signed with the HS256 secret or the RS256 key."""
        body = {"sub": sub, "exp": int(time.time()) + lifetime_s, **claims}
        return sign(self, algorithm, body)


def sign(material: Material, algorithm: str, body: dict[str, object]) -> str:
    """``body`` as a JWT signed with ``material``'s key for ``algorithm``."""
    if algorithm == "HS256":
        return jwt.encode(body, material.hmac_secret, algorithm="HS256")
    return jwt.encode(body, _private_key(material.rsa_private), algorithm="RS256")


@functools.cache
def _private_key(path: Path) -> rsa.RSAPrivateKey:
    """The RS256 signing key, loaded once (loading checks the key: tens of ms)."""
    key = serialization.load_pem_private_key(path.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return key


def make_material(directory: Path) -> Material:
    """Write certificates and token keys into ``directory``."""
    files = make_certs(directory, days=2, overwrite=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / "token-private.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public = directory / "token-public.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return Material(directory, files.ca, files.cert, files.key, secrets.token_bytes(32),
                    private, public)


class TempMaterial:
    """:func:`make_material` in a temporary directory removed on exit."""

    def __enter__(self) -> Material:
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-secure-")
        return make_material(Path(self._tmp.name))

    def __exit__(self, *exc: object) -> None:
        self._tmp.cleanup()


def client_config(protocol: str, material: Material, token: str | None = None,
                  mechanism: str = "PLAIN", username: str = TENANT) -> dict[str, str]:
    """librdkafka settings for ``protocol`` (PLAINTEXT, SSL, SASL_SSL, SASL_PLAINTEXT);
    SASL logs in as ``username`` (``tenant`` or ``tenant/namespace``)."""
    config = {"security.protocol": protocol}
    if "SSL" in protocol:
        config["ssl.ca.location"] = str(material.ca)
    if protocol.startswith("SASL"):
        assert token is not None, "SASL needs a token"
        config.update({"sasl.mechanism": mechanism, "sasl.username": username,
                       "sasl.password": f"token:{token}"})
    return config


def as_flags(config: dict[str, str]) -> list[str]:
    """``config`` as ``bench.worker`` options."""
    return [f"{key}={value}" for key, value in config.items()]


class MultiListenerBroker(EdgeBroker):
    """This broker with one listener per security protocol; :attr:`ports` by protocol
    name (the PLAINTEXT one is :attr:`port`, which the admin calls use)."""

    def __init__(self, protocols: list[str], settings: dict[str, str]) -> None:
        listeners = ",".join(f"{protocol}://127.0.0.1:0" for protocol in protocols)
        super().__init__({"kafkaListeners": listeners, **settings})
        self.ports: dict[str, int] = {}
        self.cprofile_to: Path | None = None
        """Run the broker under ``cProfile`` writing here (``bench.secure_profile``)."""

    def command(self) -> list[str]:
        args = super().command()
        if self.cprofile_to is None:
            return args
        return [args[0], "-m", "cProfile", "-o", str(self.cprofile_to), *args[1:]]

    def _on_line(self, line: str, ready: threading.Event) -> None:
        parsed = parse_ready(line)
        if parsed is not None and parsed.listeners:
            self.ports = {listener.name: listener.port for listener in parsed.listeners}
            self.port = self.ports.get("PLAINTEXT", parsed.listeners[0].port)
            ready.set()

    def address(self, protocol: str) -> str:
        """``host:port`` of the listener of ``protocol``."""
        return f"127.0.0.1:{self.ports[protocol]}"
