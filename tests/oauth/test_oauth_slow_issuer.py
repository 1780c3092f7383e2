"""An issuer that hangs. While the broker holds its keys, logins naming made-up ``kid``
values are refused at once (one background fetch, none waiting for it), so they cannot
hold the threads that check tokens, and logins with a known key go on. Before it holds
any, a login waits for the first fetch holding no thread and no permit of the login gate:
any number of them stall no other login (PLAIN), and one arriving as the broker starts
passes once the issuer answers."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import RSAKey
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

from oauth.dev_issuer import DevIssuer, JwksDocument
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    AUDIENCE,
    CLIENTS,
    ERROR_CHALLENGE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    BearerConnection,
    bearer_message,
    good_login,
    issuer_token,
    oauth_file,
    rejected,
    start_broker,
)
from tests.security_helpers import SecureConnection, TokenIssuer

REFRESH_MIN_SECONDS = 1.0
ATTACKERS = 12
"""More than the broker's token-checking threads and its login gate."""


class HangingIssuer(DevIssuer):
    """The dev issuer, whose JWKS endpoint hangs while ``hang`` is set, until released."""

    def __init__(self) -> None:
        super().__init__(clients=CLIENTS, audience=AUDIENCE, tenant_claim="tenant")
        self.hang = threading.Event()
        self.release = threading.Event()
        self.holding = 0
        """JWKS requests being held now."""

    def jwks(self) -> JwksDocument:
        if self.hang.is_set():
            self.holding += 1
            self.release.wait(120)
            self.holding -= 1
        return super().jwks()


@pytest.fixture
def hanging() -> Iterator[HangingIssuer]:
    issuer = HangingIssuer()
    issuer.start()
    yield issuer
    issuer.release.set()
    issuer.stop()


@pytest.fixture
def slow_broker(tmp_path: Path, hanging: HangingIssuer) -> Iterator[BrokerProcess]:
    # The broker's fetch waits for the issuer far longer than any login may take.
    properties = oauth_file(tmp_path, hanging.url, http_timeout_seconds="100",
                            jwks_refresh_min_seconds=str(REFRESH_MIN_SECONDS))
    broker = start_broker(tmp_path, properties, failedAuthenticationDelayMs="0")
    yield broker
    broker.stop()


def test_made_up_kids_do_not_block_logins_while_the_issuer_hangs(
        slow_broker: BrokerProcess, hanging: HangingIssuer) -> None:
    port = slow_broker.port
    assert good_login(port, issuer_token(hanging)).error_code == 0
    time.sleep(REFRESH_MIN_SECONDS + 0.2)  # an unknown kid may trigger a fetch again
    hanging.hang.set()

    stranger = RSAKey.generate_key(2048, parameters={"alg": "RS256"})
    claims = hanging.claims_for(hanging.clients["app"], None)
    floods = [bearer_message(hanging.sign(claims, key=stranger, kid=uuid.uuid4().hex))
              for _ in range(ATTACKERS)]
    with ThreadPoolExecutor(max_workers=ATTACKERS) as pool:
        reasons = list(pool.map(lambda m: rejected(port, m), floods))
    # All answered, none waiting for the broker's one fetch, which the issuer holds (on a
    # loaded machine the background fetch may reach the issuer after the answers).
    deadline = time.monotonic() + 30
    while hanging.holding != 1:
        assert time.monotonic() < deadline, f"{hanging.holding} fetches held, not 1"
        time.sleep(0.05)
    assert set(reasons) == {"Authentication failed: token signed with an unknown key; "
                            "fetching the issuer's keys now, retry shortly"}
    assert good_login(port, issuer_token(hanging)).error_code == 0
    assert hanging.holding == 1

    hanging.hang.clear()
    hanging.release.set()
    assert good_login(port, issuer_token(hanging)).error_code == 0
    assert slow_broker.alive()


# -- before the first keys ----------------------------------------------------------------

NEVER_SECONDS = "100"
"""The broker's oauth.http.timeout.seconds: its first fetch outlasts the test."""


class Hole:
    """An issuer address that accepts connections and does not answer them until
    released; from then on it answers each one, held or new, HTTP 503 at once."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        self.released = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()[0]
            except OSError:
                return
            with self._lock:
                if not self.released:
                    self.held.append(conn)
                    continue
            self._refuse(conn)

    @staticmethod
    def _refuse(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")

    def release(self) -> None:
        """Answer every fetch from now on (so the ones under way fail at once)."""
        with self._lock:
            self.released = True
            held, self.held = self.held, []
        for conn in held:
            self._refuse(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def _b64(document: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


JUNK = _b64({"alg": "RS256", "kid": "k1", "typ": "JWT"}) + "." + _b64({"sub": "x"}) + ".AAAA"
"""A well-formed token no key checks: only the issuer's keys could refuse it."""


def pending_login(port: int, token: str) -> BearerConnection:
    """A connection whose OAUTHBEARER SaslAuthenticate was sent, its answer not read."""
    conn = BearerConnection(port, timeout=60)
    assert conn.handshake().error_code == NONE
    conn.send_frame(conn.request_bytes(
        SaslAuthenticateRequest[2](auth_bytes=bearer_message(token)), 2))
    return conn


def answer_of(conn: BearerConnection) -> Any:
    """The SaslAuthenticate v2 answer ``conn`` waits for."""
    return SaslAuthenticateResponse.decode(conn.read_frame()[5:], version=2)


def unanswered(conn: BearerConnection, seconds: float) -> bool:
    """Whether nothing came on ``conn`` for ``seconds``."""
    conn.sock.settimeout(seconds)
    try:
        return not conn.sock.recv(1, socket.MSG_PEEK)
    except (TimeoutError, BlockingIOError):
        return True
    finally:
        conn.sock.settimeout(60)


@pytest.fixture
def hole() -> Iterator[Hole]:
    started = Hole()
    yield started
    started.close()


def test_logins_waiting_for_the_first_keys_stall_no_other_login(
        tmp_path: Path, hole: Hole) -> None:
    """The issuer never answered: more OAUTHBEARER logins wait for its first keys than the
    broker has token-checking threads and login-gate permits, and PLAIN logins go on (they
    waited for a permit, up to twice oauth.http.timeout.seconds). When the issuer
    answers (an error), the waiting logins are refused the RFC 7628 way."""
    plain = TokenIssuer("hmac", tmp_path / "keys")
    broker = start_broker(
        tmp_path, oauth_file(tmp_path, hole.url, http_timeout_seconds=NEVER_SECONDS),
        saslAllowedMechanisms="PLAIN,OAUTHBEARER", failedAuthenticationDelayMs="0",
        **plain.settings)
    try:
        waiting = [pending_login(broker.port, JUNK) for _ in range(ATTACKERS)]
        for _ in range(3):
            other = SecureConnection(broker.port, timeout=30)
            try:
                assert other.login("public", plain.token()).error_code == NONE
            finally:
                other.close()
        assert all(unanswered(conn, 0) for conn in waiting)  # still waiting for the keys
        hole.release()
        for conn in waiting:
            first = answer_of(conn)
            assert first.error_code == NONE and bytes(first.auth_bytes) == ERROR_CHALLENGE
            second = conn.authenticate(b"\x01")
            assert second.error_code == SASL_AUTHENTICATION_FAILED
            assert "the issuer's signing keys are unavailable" in second.error_message
            conn.close()
        assert broker.alive()
    finally:
        broker.stop()


def test_a_login_as_the_broker_starts_passes_once_the_issuer_answers(
        tmp_path: Path, hanging: HangingIssuer) -> None:
    hanging.hang.set()  # the first JWKS fetch hangs
    broker = start_broker(
        tmp_path, oauth_file(tmp_path, hanging.url, http_timeout_seconds=NEVER_SECONDS),
        failedAuthenticationDelayMs="0")
    try:
        conn = pending_login(broker.port, issuer_token(hanging))
        try:
            assert unanswered(conn, 1.0)  # it waits for the keys
            hanging.hang.clear()
            hanging.release.set()
            assert answer_of(conn).error_code == NONE
        finally:
            conn.close()
    finally:
        broker.stop()
