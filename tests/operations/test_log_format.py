"""Client text in logs and audit fields: ``sasl.printable`` escapes and bounds it, and the
broker's log formatter (``edge.log_format``) applies that to every argument of every
record while tracebacks keep their lines; with ``logFormat=json`` the lines about a topic
or a group carry ``topic`` / ``group`` as fields."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import InvalidRecordError, KafkaError, TopicAuthorizationFailedError

from edge.audit import AuditEvent
from edge.log_format import LOG_ARG_LIMIT, broker_log_handler
from sasl.printable import FIELD_LIMIT, printable
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.security_helpers import ACL_GROUP, NONE, OpsConnection, TokenIssuer, grant

FORGED = "2026-01-01 00:00:00,000 INFO edge.session: peer logged in as admin"


def test_printable_escapes_control_characters() -> None:
    assert printable("plain name-1.x") == "plain name-1.x"
    assert printable("a\r\nb\tc\x00d\x7f\x85e") == "a\\r\\nb\\tc\\x00d\\x7f\\x85e"
    assert printable("line\u2028sep\u202eevil") == "line\\u2028sep\\u202eevil"
    assert printable("é漢") == "é漢"


def test_printable_bounds_and_says_how_much_was_cut() -> None:
    text = printable("A" * 60_000)
    assert text.startswith("A" * FIELD_LIMIT) and text.endswith("...[59744 more characters]")
    escaped = printable("\n" * 1000, 10)
    assert escaped == "\\n" * 5 + "...[995 more characters]"


def test_audit_events_are_bounded_and_escaped() -> None:
    event = AuditEvent(kind="authentication", outcome="failure", listener="SASL",
                       client="127.0.0.1:1", tenant="t\r\n" + "x" * 60_000,
                       reason="r" * 60_000).bounded()
    assert event.tenant is not None and event.tenant.startswith("t\\r\\nxxx")
    assert len(event.tenant) < FIELD_LIMIT + 40 and event.reason is not None
    assert len(event.reason) < FIELD_LIMIT + 40 and event.principal is None


@pytest.fixture
def broker_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through the broker's log handler."""
    out = io.StringIO()
    handler = broker_log_handler(out)
    logger = logging.getLogger("test-log-format")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, out
    logger.removeHandler(handler)


def test_arguments_cannot_start_a_line(broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    logger.info("token accepted: extensions [%s]", "note=x\r\n" + FORGED)
    logger.warning("closing: %s", ValueError("bad\n" + FORGED))
    logger.info("group %(group)s joined", {"group": "g\n" + FORGED})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert not any(line.startswith(FORGED) for line in lines)
    assert lines[0].endswith(" INFO test-log-format: token accepted: extensions "
                             "[note=x\\r\\n" + FORGED + "]")


def test_arguments_are_bounded_numbers_kept(
        broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    logger.info("user %s sent %d bytes (%.1f%%)", "u" * 60_000, 60_000, 12.5)
    line = out.getvalue().rstrip("\n")
    assert len(line) < LOG_ARG_LIMIT + 200
    assert line.endswith("more characters] sent 60000 bytes (12.5%)")


def test_tracebacks_keep_their_lines_but_not_client_lines(
        broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("topic 'a\r\n" + FORGED + "'") from exc
    except ValueError:
        logger.exception("request from %s failed", "peer")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(" ERROR test-log-format: request from peer failed")
    assert lines[1] == "Traceback (most recent call last):"
    assert any("direct cause" in line for line in lines)
    assert lines[-1] == "ValueError: topic 'a\\r\\n" + FORGED + "'"
    assert not any(line.startswith(FORGED) for line in lines)


def test_any_argument_but_a_number_is_bounded_once_rendered(
        broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    """A dict or list (client configs, say) is rendered, then cut like a string: with
    ``%s``, with ``%r``, as a lone dict argument and as one value of a mapping."""
    logger, out = broker_log
    configs = {f"key-{i}\n": "v" * 100 for i in range(1000)}
    logger.info("created topic %s with %d partitions, configs %s", "t", 3, configs)
    logger.info("listed %r", list(range(60_000)))
    logger.info("lone %s", configs)
    logger.info("named %(configs)s of %(count)d", {"configs": configs, "count": 7})
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, [line[:100] for line in lines]
    assert all(len(line) < LOG_ARG_LIMIT + 200 for line in lines), [len(x) for x in lines]
    assert "with 3 partitions, configs {'key-0\\n': 'vvv" in lines[0]
    assert lines[0].endswith("more characters]")
    assert " listed [0, 1, 2, 3," in lines[1] and lines[1].endswith("more characters]")
    assert " lone {'key-0\\n'" in lines[2]
    assert " named {'key-0\\n'" in lines[3] and lines[3].endswith("more characters] of 7")


def test_a_topic_created_with_huge_configs_logs_a_bounded_line(broker: BrokerProcess,
                                                               topic_name: str) -> None:
    """A real CreateTopics (confluent-kafka) whose configs are valid but each a thousand
    characters long (leading zeros; over 1,024 is INVALID_CONFIG): the topic is created,
    and the broker's line names its configs as stored, canonical, so it stays bounded."""
    padding = "0" * 1000
    configs = {key: padding + value for key, value in {
        "retention.ms": "604800000", "retention.bytes": "1", "segment.bytes": "1048576",
        "segment.ms": "604800000", "index.interval.bytes": "4096",
        "max.message.bytes": "1048588", "min.insync.replicas": "1"}.items()}
    create_topic(broker.bootstrap, topic_name, 1, configs)
    line = broker.wait_for_log(f"created topic \\S*{topic_name} ")
    assert "'retention.ms': '604800000'" in line and padding not in line
    assert len(line) < LOG_ARG_LIMIT + 300, len(line)


# -- JSON lines about topics and groups carry them as fields --------------------------------

HOSTILE_GROUP = 'g\n{"level": "ERROR", "message": "forged"}\u2028' + "x" * 3000


def _entries(broker: BrokerProcess, needle: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in broker.lines if needle in line]


def _wait_entry(broker: BrokerProcess, needle: str, **fields: str) -> dict[str, Any]:
    """The first JSON line whose message has ``needle`` and which carries ``fields``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for entry in _entries(broker, needle):
            if all(entry.get(key) == value for key, value in fields.items()):
                return entry
        time.sleep(0.1)
    raise AssertionError(f"no line {needle!r} with {fields}:\n{broker.log_text()[-3000:]}")


def test_json_lines_about_topics_and_groups_carry_them(tmp_path: Path,
                                                       topic_name: str) -> None:
    """A real broker with ``logFormat=json`` and ACLs: topic creation, an authorization
    refusal, a refused produce (no key for a compacted topic), a group's rebalance, a
    denial on a group a client named with hostile text, and the log cleaner's lines each
    carry ``topic`` or ``group`` (and who) as fields, client text escaped and bounded."""
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "logFormat": "json",
        "authorizationEnabled": "true", "superUserRoles": "admin",
        "groupInitialRebalanceDelayMs": "0", "logCleanerBackoffMs": "200",
        **issuer.settings}).start()

    def login(role: str) -> dict[str, Any]:
        return {"bootstrap_servers": broker.bootstrap, "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN", "sasl_plain_username": "acme",
                "sasl_plain_password": "token:" + issuer.token(role)}

    internal = f"acme/default/{topic_name}"
    compacted = f"{topic_name}-compacted"
    try:
        admin = KafkaAdminClient(**login("admin"), client_id="ops-admin")
        admin.create_topics([NewTopic(topic_name, 1, 1), NewTopic(
            compacted, 1, 1, topic_configs={
                "cleanup.policy": "compact", "segment.bytes": "1024",
                "min.cleanable.dirty.ratio": "0.01"})])
        producer = KafkaProducer(**login("admin"), acks="all")
        for i in range(60):  # one batch each: the 1 KiB segments fill and are sealed
            producer.send(compacted, key=f"k{i % 3}".encode(), value=b"v" * 100).get(30)
        producer.send(topic_name, b"for the group").get(30)
        with pytest.raises(InvalidRecordError):  # a compacted topic wants keys
            producer.send(compacted, b"no key").get(30)
        producer.flush(30)
        producer.close()

        root = OpsConnection(broker.port)  # bob may log in to acme: an ACL of acme
        root.login("acme", issuer.token("admin"))
        assert grant(root, ACL_GROUP, "bob-group", "User:bob") == NONE
        root.close()
        denied = KafkaProducer(**login("bob"), client_id="bob-client", acks="all",
                               retries=0, max_block_ms=5000)
        with pytest.raises(TopicAuthorizationFailedError):
            denied.send(topic_name, b"refused").get(30)
        denied.close()
        bob = KafkaAdminClient(**login("bob"))
        with contextlib.suppress(KafkaError):
            bob.describe_groups([HOSTILE_GROUP])
        bob.close()

        consumer = KafkaConsumer(topic_name, **login("admin"), group_id="ops-group",
                                 auto_offset_reset="earliest")
        deadline = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(500)
        consumer.close()
        admin.close()

        created = _wait_entry(broker, "created topic", topic=internal)
        assert (created["tenant"], created["principal"], created["client_id"]) == (
            "acme", "admin", "ops-admin")
        refusal = _wait_entry(broker, "authorization denied", topic=internal)
        assert refusal["level"] == "WARNING" and refusal["principal"] == "bob"
        assert refusal["client"] == "127.0.0.1" and refusal["listener"] == "SASL_PLAINTEXT"
        assert refusal["client_id"] == "bob-client"
        produce = _wait_entry(broker, "refused: ", topic=f"acme/default/{compacted}")
        assert produce["principal"] == "admin" and produce["tenant"] == "acme"
        rebalance = _wait_entry(broker, "generation 1 with 1 members", group="ops-group")
        assert rebalance["tenant"] == "acme" and "topic" not in rebalance
        cleaned = _wait_entry(broker, "log cleaner: cleaned",
                              topic=f"acme/default/{compacted}")
        assert cleaned["tenant"] == "acme"
        hostile = next(e for e in _entries(broker, "authorization denied")
                       if e.get("group", "").startswith("g\\n{"))
        assert '"level": "ERROR"' in hostile["group"] and "\\u2028" in hostile["group"]
        assert len(hostile["group"]) < LOG_ARG_LIMIT + 100
        assert "more characters]" in hostile["group"]
    finally:
        broker.stop()
    entries = [json.loads(line) for line in broker.lines]  # every line is one object
    assert not any(entry["message"] == "forged" for entry in entries)
