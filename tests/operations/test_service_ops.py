"""Running the broker as a service: ``--version``, ``check-config`` (valid, invalid,
secrets masked), ``/healthz`` and ``/readyz`` on the metrics port (a single broker and a
PostgreSQL one, and the 503 of a check that fails), and ``logFormat=json``: every line
one JSON object, a hostile client id escaped."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from edge.health import Readiness, health_app
from tests.admin_cli_helpers import edge_broker
from tests.broker_process import BrokerProcess
from tests.ports import free_port
from tests.postgres_server import shared_server
from tests.security_helpers import TokenIssuer


def test_version() -> None:
    ran = edge_broker("--version")
    assert ran.code == 0 and ran.out.strip() == "edge-broker 0.1.0"


def test_check_config_prints_every_key_with_secrets_masked(tmp_path: Path) -> None:
    config = tmp_path / "broker.properties"
    config.write_text("kafkaListeners=PLAINTEXT://127.0.0.1:9092\nlogFormat=json\n"
                      "storageUrl=postgres://edge:hunter2@db.example:5432/edge\n")
    ran = edge_broker("check-config", "--config", str(config), "--set",
                      "tokenSecretKey=data:;base64,c2VjcmV0LWtleS1vZi10aGlydHktdHdvLWJ5dGVz")
    assert ran.code == 0, ran.err
    shown = dict(line.split("=", 1) for line in ran.out.splitlines())
    assert shown["logFormat"] == "JSON"
    assert shown["storageUrl"] == "postgres://edge@db.example:5432/edge"  # no password
    assert shown["tokenSecretKey"] == "data:;base64,****"
    assert shown["brokerId"] == "0"  # defaults are shown too
    assert "hunter2" not in ran.out and "c2VjcmV0" not in ran.out


@pytest.mark.parametrize(("override", "expected"), [
    ("noSuchKey=1", "unknown config key 'noSuchKey'"),
    ("logFormat=xml", "invalid value 'xml' for 'logFormat'"),
    ("kafkaListeners=SASL_PLAINTEXT://127.0.0.1:9092", "need 'tokenSecretKey'"),
    ("kafkaListeners=SSL://127.0.0.1:9093", "'tlsCertificateFilePath'"),
])
def test_check_config_refuses_what_start_up_refuses(override: str, expected: str) -> None:
    ran = edge_broker("check-config", "--set", override)
    assert ran.code == 2 and ran.out == ""
    assert expected in ran.err and "Traceback" not in ran.err


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_endpoints_of_a_broker(tmp_path: Path) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path, {"metricsPort": str(port)}).start()
    try:
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (200, "ready\n")
        status, text = get(port, "/metrics")
        assert status == 200 and "kop_server_active_connections" in text
    finally:
        assert broker.stop() == 0


def test_readyz_of_a_postgres_broker_counts_its_membership(tmp_path: Path) -> None:
    port = free_port()
    broker = BrokerProcess(tmp_path, {"metricsPort": str(port),
                                      "storageUrl": shared_server().new_database_url()})
    broker.start(timeout=60)
    try:
        assert get(port, "/readyz") == (200, "ready\n")
    finally:
        assert broker.stop() == 0


def call(app_readiness: Readiness, path: str) -> tuple[str, bytes]:
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        statuses.append(status)

    def metrics(environ: dict[str, object], start: object) -> Iterable[bytes]:
        statuses.append("metrics")
        return [b""]

    body = b"".join(health_app(app_readiness, metrics)({"PATH_INFO": path},
                                                       start_response))
    return statuses[0], body


def test_readyz_is_503_naming_each_failing_check() -> None:
    state = {"listening": False}
    readiness = Readiness()
    readiness.add("listeners bound", lambda: state["listening"])
    readiness.add("cluster membership", lambda: 1 / 0 == 0)  # a check that cannot tell
    assert call(readiness, "/readyz") == (
        "503 Service Unavailable", b"not ready: listeners bound\nnot ready: cluster membership\n")
    assert call(readiness, "/healthz") == ("200 OK", b"ok\n")
    assert call(readiness, "/metrics")[0] == "metrics"
    state["listening"] = True
    readiness.add("cluster membership", lambda: True)
    assert call(readiness, "/readyz") == ("200 OK", b"ready\n")


HOSTILE = 'evil\n{"level": "ERROR", "message": "forged"}\u2028\x1b[31m' + "x" * 3000


def test_json_logs_are_one_object_a_line_and_escape_a_hostile_client_id(
        tmp_path: Path) -> None:
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "logFormat": "json",
        "failedAuthenticationDelayMs": "0", **issuer.settings}).start()
    try:
        with pytest.raises(KafkaError):
            KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                             sasl_plain_username="acme", sasl_plain_password="token:forged",
                             client_id=HOSTILE, bootstrap_timeout_ms=5000)
        KafkaAdminClient(bootstrap_servers=broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="PLAIN", sasl_plain_username="acme",
                         sasl_plain_password="token:" + issuer.token("alice"),
                         client_id="good-client").close()
        broker.wait_for_log("logged in as alice")
    finally:
        broker.stop()
    entries = [json.loads(line) for line in broker.lines]  # every line is one object
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    assert not any(entry["message"] == "forged" for entry in entries)
    failed = next(e for e in entries if "login from" in e["message"] and "failed" in e["message"])
    assert failed["level"] == "WARNING" and failed["tenant"] == "acme"
    assert failed["listener"] == "SASL_PLAINTEXT" and failed["client"].startswith("127.0.0.1:")
    assert failed["client_id"].startswith('evil\\n{"level": "ERROR"')
    assert "\\u2028\\x1b[31m" in failed["client_id"]
    assert "more characters]" in failed["client_id"] and len(failed["client_id"]) < 1100
    login = next(e for e in entries if "logged in as alice" in e["message"])
    assert (login["principal"], login["tenant"], login["client_id"]) == (
        "alice", "acme", "good-client")
