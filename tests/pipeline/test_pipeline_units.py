"""The pipeline's pure parts, without Spark: option parsing, the sink's topic, offset specs and the
checkpoint form, read limits, client settings, ``--since``, the printed tables, and how
a task tells a cut input from a whole one (on real sockets)."""

from __future__ import annotations

import argparse
import json
import socket

import confluent_kafka
import pytest
from pyspark.sql import Row

from pipeline.audit.table import format_table
from pipeline.batch_reader import BatchReader
from pipeline.cli import build_parser, parse_since, source_options
from pipeline.clients import base_config
from pipeline.offsets import from_json, parse_spec, rate_limit, to_json
from pipeline.options import OptionError, parse_options
from pipeline.produce import ANY_PARTITION, Record, record_of
from pipeline.staging import RangeCollector, from_staging, merge, to_staging
from pipeline.stream_reader import StreamReader
from pipeline.task_input import LinkNotFound, executor_link, input_cut

BOOT = {"kafka.bootstrap.servers": "h:1"}


def test_options_are_parsed_and_checked() -> None:
    options = parse_options({**BOOT, "subscribe": "a, b", "maxOffsetsPerTrigger": "10",
                             "FailOnDataLoss": "false", "kafka.security.protocol": "SASL_SSL",
                             "isolationLevel": "read_uncommitted", "pollTimeoutMs": "500"})
    assert options.topics == ("a", "b") and options.max_offsets_per_trigger == 10
    assert not options.fail_on_data_loss and options.isolation_level == "read_uncommitted"
    assert options.client == {"security.protocol": "SASL_SSL"} and options.poll_timeout_ms == 500
    assert parse_options({**BOOT, "assign": '{"t": [1, 0]}'}).assign == {"t": [0, 1]}
    assert parse_options({**BOOT, "topic": "out"}, reading=False).write_topic == "out"
    assert parse_options({**BOOT, "TransactionalIdPrefix": "copy"},
                         reading=False).transactional_id_prefix == "copy"
    sink = parse_options({**BOOT, "Atomicity": "Partition", "copyPauseMs": "5"}, reading=False)
    assert sink.atomicity == "partition" and sink.copy_pause_ms == 5
    assert parse_options(BOOT, reading=False).atomicity == "batch"
    for acks in ("all", "-1", "ALL"):  # the sink's producer is idempotent: acks=all only
        assert parse_options({**BOOT, "kafka.acks": acks}, reading=False).client == {
            "acks": acks}
    for acks in ("1", "0"):
        with pytest.raises(OptionError, match=f"kafka.acks must be all .*not '{acks}'"):
            parse_options({**BOOT, "kafka.Acks": acks}, reading=False)
    bad = [({"subscribe": "t"}, "kafka.bootstrap.servers is required"),
           ({**BOOT}, "exactly one of"),
           ({**BOOT, "subscribe": "t", "assign": '{"t":[0]}'}, "got subscribe, assign"),
           ({**BOOT, "assign": "[0]"}, "option assign must be JSON"),
           ({**BOOT, "subscribe": "t", "failOnDataLoss": "maybe"}, "true or false"),
           ({**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "must be positive"),
           ({**BOOT, "subscribe": "t", "isolationLevel": "dirty"}, "isolationLevel must be"),
           ({**BOOT, "subscribe": "t", "kafka.group.id": "g"}, "managed by the edgekafka"),
           ({**BOOT, "subscribe": "t", "kafka.transactional.id": "x"}, "managed by the edge"),
           ({**BOOT, "subscribe": "t", "oauth.issuerUrl": "http://x"}, "needs oauth.credent"),
           ({**BOOT, "subscribe": "t", "startingTimestamp": "noon"}, "epoch milliseconds"),
           ({**BOOT, "subscribe": "t", "atomicity": "task"}, "one of batch, partition"),
           ({**BOOT, "subscribe": "t", "copyPauseMs": "-1"}, "must not be negative"),
           ({**BOOT, "subscribe": "t", "startingTimestamp": "-5"}, r"\(0 or more\), not -5"),
           ({**BOOT, "subscribePattern": "orders("}, "option subscribePattern is not a "
            "regular expression"),
           ({**BOOT, "topic": "t", "transactionalIdPrefix": ""}, "transactionalIdPrefix must "
            "not be empty"),
           ({**BOOT, "subscribe": "t", "includeHeaders": "false"}, "includeHeaders cannot be")]
    for given, message in bad:
        with pytest.raises(OptionError, match=message):
            parse_options(given)
    assert parse_options({**BOOT, "subscribe": "t", "includeHeaders": "true",
                          "checkpointLocation": "/cp", "path": "/p"}).include_headers


def test_unknown_and_unsupported_options_are_refused_by_name() -> None:
    """They used to be ignored: a typo'd read limit read everything, Spark's timestamp
    options read from the default offsets."""
    cases = [("maxOffsetPerTrigger", "5", "unknown option maxOffsetPerTrigger \\(did you "
              "mean maxOffsetsPerTrigger\\?\\)"),
             ("startingoffset", "earliest", "did you mean startingOffsets"),
             ("colour", "red", "^unknown option colour$"),
             ("endingTimestamp", "1700000000000", "endingTimestamp of Spark's Kafka "
              "connector is not supported by the edgekafka source: use endingOffsets"),
             ("startingOffsetsByTimestamp", '{"t":{"0":1}}', "not supported.*use "
              "startingTimestamp"),
             ("endingOffsetsByTimestamp", '{"t":{"0":1}}', "not supported"),
             ("minPartitions", "8", "not supported.*one Spark partition per Kafka")]
    for name, value, message in cases:
        with pytest.raises(OptionError, match=message):
            parse_options({**BOOT, "subscribe": "t", name: value})
    assert parse_options({**BOOT, "subscribe": "t", "kafka.fetch.max.bytes": "1"}).client == {
        "fetch.max.bytes": "1"}


def test_offsets_spark_refuses_are_refused() -> None:
    """endingOffsets on a stream, latest (-1) as a batch's start and earliest (-2) as its
    end were accepted: a stream ignored its end, a batch read nothing."""
    with pytest.raises(OptionError, match="endingOffsets is for batch reads only"):
        StreamReader(parse_options({**BOOT, "subscribe": "t", "endingOffsets": "latest"}))
    for given, message in [({"startingOffsets": '{"t": {"0": -1}}'}, "startingOffsets "
                            "cannot be latest \\(-1 in JSON\\) for a batch read"),
                           ({"startingOffsets": "latest"}, "cannot be latest"),
                           ({"endingOffsets": '{"t": {"0": 5, "1": -2}}'}, "endingOffsets "
                            "cannot be earliest \\(-2 in JSON\\)"),
                           ({"endingOffsets": "earliest"}, "cannot be earliest")]:
        with pytest.raises(OptionError, match=message):
            BatchReader(parse_options({**BOOT, "subscribe": "t", **given})).partitions()


def test_offset_specs_and_checkpoint_form() -> None:
    assert parse_spec(None, "latest", "startingOffsets") == "latest"
    assert parse_spec(" Earliest ", "latest", "startingOffsets") == "earliest"
    spec = parse_spec('{"t": {"0": 23, "1": -2}, "u": {"3": -1}}', "latest", "x")
    assert spec == {("t", 0): 23, ("t", 1): -2, ("u", 3): -1}
    with pytest.raises(OptionError, match="must be earliest, latest or JSON"):
        parse_spec("soon", "latest", "startingOffsets")
    with pytest.raises(OptionError, match="neither an offset"):
        parse_spec('{"t": {"0": -3}}', "latest", "startingOffsets")
    offsets = {("b", 10): 5, ("a", 2): 7, ("a", 0): 1}
    document = to_json(offsets)
    assert json.dumps(document) == '{"a": {"0": 1, "2": 7}, "b": {"10": 5}}'
    assert from_json(json.loads(json.dumps(document))) == offsets


def test_staged_ranges_and_records() -> None:
    collected = RangeCollector()
    for partition, offset in [(0, 5), (0, 6), (0, 7), (0, 9), (1, 10), (0, 10)]:
        collected.add(confluent_kafka.Message(topic="s", partition=partition, offset=offset))
    assert collected.ranges == [(0, 5, 7), (0, 9, 9), (1, 10, 10), (0, 10, 10)]
    merged = merge([*collected.ranges, (0, 0, 4), (0, 20, 21)])
    assert {p: list(spans) for p, spans in merged.items()} == {
        0: [(0, 7), (9, 10), (20, 21)], 1: [(10, 10)]}
    with pytest.raises(RuntimeError, match="overlap in partition 0 at offset 3"):
        merge([(0, 0, 4), (0, 3, 8)])
    record = Record("out", -1, b"k", b"v", [("h", b"1"), ("h", None)])
    staged = to_staging(record, "s", 2)
    assert (staged.topic, staged.partition, staged.headers) == (
        "s", 2, [("edgekafka.topic", b"out"), ("edgekafka.partition", b"-1"), ("h", b"1"),
                 ("h", None)])
    message = confluent_kafka.Message(topic="s", partition=2, offset=0, key=b"k", value=b"v",
                                      headers=staged.headers)
    assert from_staging(message) == record
    with pytest.raises(RuntimeError, match="s-2 offset 0 is not a staged record"):
        from_staging(confluent_kafka.Message(topic="s", partition=2, offset=0, value=b"v"))


def test_the_topic_option_overrides_the_topic_column() -> None:
    """As in Spark's Kafka sink: the option ``topic`` wins over a row's ``topic`` column;
    without the option a row's own topic is used, and a null one fails the task."""
    boot = {"kafka.bootstrap.servers": "127.0.0.1:1"}
    by_option = parse_options({**boot, "topic": "fixed"}, reading=False)
    by_row = parse_options(boot, reading=False)
    row = Row(topic="own", key=None, value=b"v", partition=None, headers=None)
    assert record_of(row, by_option).topic == "fixed"
    assert record_of(Row(value=b"v"), by_option).topic == "fixed"
    assert record_of(Row(topic=None, value=b"v"), by_option).topic == "fixed"
    assert record_of(row, by_row) == Record("own", ANY_PARTITION, None, b"v", None)
    with pytest.raises(ValueError, match="a row's topic is null and the option 'topic' is "
                       "unset"):
        record_of(Row(topic=None, value=b"v"), by_row)


def test_rate_limit_shares_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50, ("t", 3): 1}
    assert rate_limit(start, latest, 1000) == latest
    limited = rate_limit(start, latest, 100)
    assert limited[("t", 0)] == 75 and limited[("t", 1)] == 125  # 300:100 backlog
    assert limited[("t", 2)] == 50
    assert limited[("t", 3)] == 1  # a new partition (no start) stays at its latest
    tiny = rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 1000, ("t", 1): 1}, 10)
    assert tiny == {("t", 0): 9, ("t", 1): 1}  # every partition with data moves


def test_client_settings_for_security() -> None:
    plain = base_config(parse_options({**BOOT, "subscribe": "t", "kafka.sasl.username": "u",
                                       "kafka.sasl.password": "p",
                                       "kafka.security.protocol": "SASL_PLAINTEXT"}))
    assert plain["sasl.mechanisms"] == "PLAIN" and plain["bootstrap.servers"] == "h:1"
    callback = "tests.pipeline.test_pipeline_units:fake_cb"
    oauth = base_config(parse_options({**BOOT, "subscribe": "t", "oauth.callback": callback}))
    assert oauth["sasl.mechanisms"] == "OAUTHBEARER"
    assert oauth["security.protocol"] == "SASL_PLAINTEXT" and oauth["oauth_cb"] is fake_cb
    with pytest.raises(OptionError, match=r"package\.module:function"):
        base_config(parse_options({**BOOT, "subscribe": "t", "oauth.callback": "nothing"}))


def fake_cb(_config: str) -> tuple[str, float, str, dict[str, str]]:
    return "token", 0.0, "me", {}


def test_since_and_cli_options() -> None:
    now = 1_800_000_000.0
    assert parse_since("15m", now) == (now - 900) * 1000
    assert parse_since("2h", now) == (now - 7200) * 1000
    assert parse_since("1700000000000") == 1_700_000_000_000
    assert parse_since("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_since("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_since("yesterday")
    args = build_parser().parse_args([
        "audit-report", "--bootstrap", "h:1", "--sasl-username", "acme",
        "--sasl-password", "token:x", "--security-protocol", "SASL_SSL",
        "--option", "kafka.ssl.ca.location=/ca.pem", "--oauth-scope", "kafka"])
    assert source_options(args) == {
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "acme",
        "kafka.sasl.password": "token:x", "oauth.scope": "kafka",
        "kafka.ssl.ca.location": "/ca.pem"}


def test_format_table() -> None:
    text = format_table("== t ==", ["name", "count"], [["a", 1], ["long-name", 12]])
    assert text.splitlines() == ["== t ==", "name       count", "---------  -----",
                                 "a              1", "long-name     12"]
    assert format_table("== e ==", ["x"], []).splitlines()[-1] == "(none)"


def test_a_task_finds_its_executor_link_on_the_stack_and_tells_a_cut_input() -> None:
    def task() -> socket.socket:  # what the sink calls, under the daemon's frame
        return executor_link()

    def daemon_worker(sock: socket.socket) -> socket.socket:
        return task()

    def tcp_pair() -> tuple[socket.socket, socket.socket]:
        with socket.create_server(("127.0.0.1", 0)) as server:
            executor = socket.create_connection(server.getsockname())
            return server.accept()[0], executor

    with pytest.raises(LinkNotFound, match=r"spark\.python\.use\.daemon"):
        task()
    for worker, executor in (socket.socketpair(socket.AF_UNIX), tcp_pair()):
        with worker, executor:
            link = daemon_worker(worker)
            assert link is worker
            assert not input_cut(link)  # open, nothing pending: the JVM awaits the answer
            executor.sendall(b"\xff\xff\xff\xfc")  # the end-of-stream message, unread
            assert not input_cut(link) and not input_cut(link)
            assert worker.recv(4) == b"\xff\xff\xff\xfc"  # the peeks took nothing
            executor.shutdown(socket.SHUT_WR)  # what the JVM's writer does on a failure
            assert input_cut(link)
            assert worker.fileno() >= 0  # the probe closed its own descriptor only
