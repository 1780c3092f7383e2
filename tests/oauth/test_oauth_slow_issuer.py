"""An issuer that hangs while the broker holds its keys: logins naming made-up ``kid``
values are refused at once (one background fetch, none waiting for it), so they cannot
hold the threads that check tokens, and logins with a known key go on."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from joserfc.jwk import RSAKey

from oauth.dev_issuer import DevIssuer, JwksDocument
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    AUDIENCE,
    CLIENTS,
    bearer_message,
    good_login,
    issuer_token,
    oauth_file,
    rejected,
    start_broker,
)

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
