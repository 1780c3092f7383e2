"""``admin topics list|describe|create|delete|alter-config|add-partitions``."""

from __future__ import annotations

import argparse
import re

from kafka import TopicPartition
from kafka.admin import (
    AlterConfigOp,
    ConfigResource,
    ConfigResourceType,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from edge.admin.connection import Clients
from edge.admin.errors import CallFailed, UsageError, error_code_name
from edge.admin.output import Report
from edge.admin.parsing import SubParsers, key_values

Partitions = list[dict[str, object]]

_ERROR_TEXT = re.compile(r"\[Error (-?\d+)\] \w+:? ?(.*)", re.S)


def add_parsers(groups: SubParsers) -> None:
    """The ``topics`` group and its verbs."""
    topics = groups.add_parser("topics", help="list, describe, create, delete and alter topics")
    verbs = topics.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("list", help="topics and their partition counts").set_defaults(
        run=list_topics)
    describe = verbs.add_parser("describe", help="a topic's partitions, offsets and configs")
    describe.add_argument("name")
    describe.set_defaults(run=describe_topic)
    create = verbs.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1, help="partition count (1)")
    create.add_argument("--replication-factor", type=int, default=1,
                        help="accepted for Kafka compatibility (1)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config (repeatable)")
    create.set_defaults(run=create_topic)
    delete = verbs.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+", metavar="NAME")
    delete.set_defaults(run=delete_topics)
    alter = verbs.add_parser("alter-config", help="set or remove topic configs")
    alter.add_argument("name")
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       dest="set_configs", help="set a config (repeatable)")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       dest="delete_configs", help="back to the default (repeatable)")
    alter.set_defaults(run=alter_config)
    grow = verbs.add_parser("add-partitions", help="raise a topic's partition count")
    grow.add_argument("name")
    grow.add_argument("--partitions", type=int, required=True,
                      help="the new total partition count")
    grow.set_defaults(run=add_partitions)


def _described(clients: Clients, names: list[str] | None) -> list[dict[str, object]]:
    topics: list[dict[str, object]] = clients.admin().describe_topics(names)
    for topic in topics:
        code = topic.get("error_code")
        if isinstance(code, int) and code != 0:
            raise CallFailed(f"{error_code_name(code)}: topic {topic.get('name')}")
    return topics


def _partitions(topic: dict[str, object]) -> Partitions:
    partitions = topic.get("partitions")
    return partitions if isinstance(partitions, list) else []


def list_topics(args: argparse.Namespace, clients: Clients) -> Report:
    """Every topic the login may describe, with its partition count."""
    report = Report()
    table = report.table("topics", "name", "partitions", "internal")
    for topic in sorted(_described(clients, None), key=lambda t: str(t.get("name"))):
        table.add(str(topic.get("name")), len(_partitions(topic)),
                  bool(topic.get("is_internal")))
    return report


def describe_topic(args: argparse.Namespace, clients: Clients) -> Report:
    """Partitions with leader and offsets; every config with its source."""
    name: str = args.name
    topic = _described(clients, [name])[0]
    partitions = sorted(_partitions(topic), key=lambda p: int(str(p["partition_index"])))
    keys = [TopicPartition(name, int(str(p["partition_index"]))) for p in partitions]
    admin = clients.admin()
    earliest = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST for tp in keys})
    latest = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in keys})
    report = Report({"name": name, "topic_id": str(topic.get("topic_id")),
                     "partition_count": len(partitions)})
    table = report.table("partitions", "partition", "leader", "replicas", "isr",
                         "start_offset", "end_offset")
    for partition, tp in zip(partitions, keys, strict=True):
        table.add(tp.partition, _cell(partition.get("leader_id")),
                  _ids(partition.get("replica_nodes")), _ids(partition.get("isr_nodes")),
                  int(earliest[tp].offset), int(latest[tp].offset))
    configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)],
                                     config_filter="all")
    found: dict[str, dict[str, object]] = configs.get("topic", {}).get(name, {})
    config_table = report.table("configs", "name", "value", "source")
    for key in sorted(found):
        entry = found[key]
        config_table.add(key, _cell(entry.get("value")), _cell(entry.get("config_source")))
    return report


def _cell(value: object) -> str | int | None:
    return value if isinstance(value, str | int) or value is None else str(value)


def _ids(value: object) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else ""


def _result_table(report: Report, results: list[dict[str, object]]) -> Report:
    table = report.table("results", "name", "result")
    for result in results:
        code = result.get("error_code")
        name = error_code_name(code) if isinstance(code, int) else "NONE"
        message = result.get("error_message")
        table.add(str(result.get("name")), f"{name}: {message}" if message else name)
        report.failed |= name != "NONE"
    return report


def create_topic(args: argparse.Namespace, clients: Clients) -> Report:
    """CreateTopics; a refused topic is a failed call."""
    if args.partitions < 1:
        raise UsageError("--partitions must be at least 1")
    configs = key_values(args.config, "--config")
    response = clients.admin().create_topics(
        [NewTopic(args.name, args.partitions, args.replication_factor, topic_configs=configs)],
        raise_errors=False)
    return _result_table(Report(), list(response["topics"]))


def delete_topics(args: argparse.Namespace, clients: Clients) -> Report:
    """DeleteTopics."""
    response = clients.admin().delete_topics(list(args.names), raise_errors=False)
    return _result_table(Report(), list(response["topics"]))


def alter_config(args: argparse.Namespace, clients: Clients) -> Report:
    """IncrementalAlterConfigs: SET and DELETE operations on one topic."""
    changes: dict[str, tuple[object, str | None]] = {
        key: (AlterConfigOp.SET, value)
        for key, value in key_values(args.set_configs, "--set").items()}
    both = sorted(set(changes) & set(args.delete_configs))
    if both:
        raise UsageError(f"--set and --delete of the same key: {', '.join(both)}")
    changes.update({key: (AlterConfigOp.DELETE, None) for key in args.delete_configs})
    if not changes:
        raise UsageError("give at least one --set KEY=VALUE or --delete KEY")
    resource = ConfigResource(ConfigResourceType.TOPIC, args.name, configs=changes)
    results = clients.admin().alter_configs([resource], raise_on_unknown=False,
                                            incremental=True)
    report = Report()
    table = report.table("results", "name", "result")
    name = _outcome_name(results.get("topic", {}).get(args.name))
    table.add(args.name, name)
    report.failed = name != "NONE"
    return report


def _outcome_name(outcome: object) -> str:
    """kafka-python's outcome of altering a resource's configs: ``OK``, or the text
    ``[Error N] ClassName: message``, as ``NAME: message``."""
    text = str(outcome)
    if text == "OK":
        return "NONE"
    match = _ERROR_TEXT.fullmatch(text)
    if match is None:
        return text
    return f"{error_code_name(int(match[1]))}: {match[2]}" if match[2] else \
        error_code_name(int(match[1]))


def add_partitions(args: argparse.Namespace, clients: Clients) -> Report:
    """CreatePartitions to a new total."""
    response = clients.admin().create_partitions({args.name: NewPartitions(args.partitions)},
                                                 raise_errors=False)
    results = [{"name": r.name, "error_code": r.error_code, "error_message": r.error_message}
               for r in response.results]
    return _result_table(Report(), results)
