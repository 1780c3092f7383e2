"""OAuth acceptance 3 and issuer outages: the broker follows a key rotation with one JWKS
refetch in the background (the first login with the new key is refused at once, the
client's retry passes), a flood of tokens naming unknown ``kid`` values does not become a
flood of JWKS requests, and the broker starts and recovers while the issuer is
unreachable."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import confluent_kafka
import pytest
from joserfc.jwk import RSAKey

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    bearer_message,
    confluent_settings,
    consume_confluent,
    good_login,
    issuer_count,
    issuer_token,
    login_for,
    make_issuer,
    oauth_file,
    rejected,
    start_broker,
)
from tests.ports import free_port

REFRESH_MIN_SECONDS = 2.0


@pytest.fixture(scope="module")
def oauth_options() -> dict[str, str]:
    """The broker's ``oauth.*`` keys for this module."""
    return {"jwks_refresh_min_seconds": str(REFRESH_MIN_SECONDS)}


@pytest.fixture(scope="module")
def oauth_broker_settings() -> dict[str, str]:
    """The broker's own settings for this module."""
    return {"failedAuthenticationDelayMs": "0"}


def jwks_requests(issuer: DevIssuer) -> int:
    return issuer_count(issuer, "jwks_requests")


def test_rotation_then_unknown_kid_flood(broker: BrokerProcess, issuer: DevIssuer) -> None:
    login = login_for(issuer, "app", "app-secret")
    old_token = login.token().value
    assert good_login(broker.port, old_token).error_code == 0
    before = jwks_requests(issuer)
    assert before >= 1

    new_kid = issuer.rotate()
    time.sleep(REFRESH_MIN_SECONDS + 0.2)
    login.invalidate()
    new_token = login.token().value
    assert "fetching the issuer's keys now, retry shortly" in rejected(
        broker.port, bearer_message(new_token))
    broker.wait_for_log(f"OAuth signing keys fetched: kid {new_kid}")
    assert good_login(broker.port, new_token).error_code == 0  # the client's retry
    assert jwks_requests(issuer) == before + 1
    # The old key stays published for the tokens it signed (the issuer's grace period).
    assert good_login(broker.port, old_token).error_code == 0
    assert jwks_requests(issuer) == before + 1

    stranger = RSAKey.generate_key(2048, parameters={"alg": "RS256"})
    claims = issuer.claims_for(issuer.clients["app"], None)
    floods = [bearer_message(issuer.sign(claims, key=stranger, kid=uuid.uuid4().hex))
              for _ in range(50)]
    after_rotation = jwks_requests(issuer)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=10) as pool:
        reasons = list(pool.map(lambda m: rejected(broker.port, m), floods))
    elapsed = time.monotonic() - started
    assert all("token signed with an unknown key" in r for r in reasons), set(reasons)
    grown = jwks_requests(issuer) - after_rotation
    assert grown <= 1 + int(elapsed / REFRESH_MIN_SECONDS), (grown, elapsed)
    assert grown <= 3
    assert good_login(broker.port, new_token).error_code == 0
    assert broker.alive()


def test_dropped_key_is_refused_after_a_refetch(broker: BrokerProcess,
                                                issuer: DevIssuer) -> None:
    old_token = issuer_token(issuer)
    assert good_login(broker.port, old_token).error_code == 0
    new_kid = issuer.rotate(drop_previous=True)
    time.sleep(REFRESH_MIN_SECONDS + 0.2)
    new_token = issuer_token(issuer)
    assert "retry shortly" in rejected(broker.port, bearer_message(new_token))
    broker.wait_for_log(f"OAuth signing keys fetched: kid {new_kid}$")
    assert good_login(broker.port, new_token).error_code == 0
    # The broker's cached set no longer holds the dropped key.
    assert "unknown key" in rejected(broker.port, bearer_message(old_token))


def test_a_client_logs_in_after_a_rotation_by_retrying(broker: BrokerProcess,
                                                       issuer: DevIssuer,
                                                       topic_name: str) -> None:
    new_kid = issuer.rotate(drop_previous=True)
    time.sleep(REFRESH_MIN_SECONDS + 0.2)
    conf = confluent_settings(broker.bootstrap, login_for(issuer, "app", "app-secret"))
    errors: list[str] = []
    producer = confluent_kafka.Producer({**conf, "acks": "all",
                                         "error_cb": lambda e: errors.append(e.str())})
    producer.produce(topic_name, value=b"after-rotation")
    assert producer.flush(30) == 0
    # librdkafka's first login was refused while the broker fetched the new key; it
    # logged in again on its own.
    assert any("fetching the issuer's keys now, retry shortly" in e for e in errors), errors
    broker.wait_for_log(f"OAuth signing keys fetched: kid {new_kid}$")
    assert consume_confluent(conf, topic_name, 1) == [b"after-rotation"]


def test_issuer_errors_are_logged_not_told_to_clients(tmp_path: Path) -> None:
    issuer = make_issuer(port=free_port())
    issuer.stop()
    properties = oauth_file(tmp_path, issuer.url, jwks_retry_seconds="0.1")
    broker = start_broker(tmp_path, properties, failedAuthenticationDelayMs="0")
    try:
        token = issuer_token(issuer)
        for _ in range(3):
            time.sleep(0.2)  # past the retry interval: each login starts a fetch
            reason = rejected(broker.port, bearer_message(token))
            assert reason == ("Authentication failed: cannot check tokens now: the issuer's "
                              "signing keys are unavailable, retry later"), reason
        # The operator learns why, once while it lasts.
        line = broker.wait_for_log("cannot fetch the OAuth issuer's signing keys")
        assert issuer.url in line
        assert sum("cannot fetch the OAuth issuer's" in t for t in broker.lines) == 1
        issuer.start()
        time.sleep(0.2)
        assert good_login(broker.port, token).error_code == 0
        broker.wait_for_log("OAuth signing keys fetched")
    finally:
        broker.stop()
        issuer.stop()


def test_broker_starts_while_the_issuer_is_down(tmp_path: Path) -> None:
    issuer = make_issuer(port=free_port())
    issuer.stop()
    assert not issuer.running
    properties = oauth_file(tmp_path, issuer.url, jwks_retry_seconds="0.3")
    broker = start_broker(tmp_path, properties, failedAuthenticationDelayMs="0")
    try:
        broker.wait_for_log("cannot fetch the OAuth issuer's signing keys")
        token = issuer_token(issuer)
        reason = rejected(broker.port, bearer_message(token))
        assert "signing keys are unavailable" in reason, reason

        issuer.start()
        time.sleep(0.4)
        assert good_login(broker.port, token).error_code == 0

        # Briefly down again: the keys already fetched keep logins working.
        issuer.stop()
        assert good_login(broker.port, issuer_token(issuer)).error_code == 0
        issuer.start()
        assert good_login(broker.port, issuer_token(issuer)).error_code == 0
        assert broker.alive()
    finally:
        broker.stop()
        issuer.stop()
