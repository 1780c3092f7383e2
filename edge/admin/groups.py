"""``admin groups list|describe|reset-offsets|delete-offsets|delete``: consumer groups,
their members, committed offsets and lag (the high watermark minus the committed
offset)."""

from __future__ import annotations

import argparse

from kafka import TopicPartition
from kafka.admin import OffsetSpec
from kafka.structs import OffsetAndMetadata

from edge.admin.connection import Clients
from edge.admin.errors import CallFailed, UsageError, error_code_name
from edge.admin.output import Report
from edge.admin.parsing import SubParsers

Offsets = dict[TopicPartition, int]


def add_parsers(groups: SubParsers) -> None:
    """The ``groups`` group and its verbs."""
    parser = groups.add_parser("groups", help="consumer groups: members, offsets, lag")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("list", help="every group with its state").set_defaults(run=list_groups)
    describe = verbs.add_parser("describe", help="members, committed offsets and lag")
    describe.add_argument("group")
    describe.set_defaults(run=describe_group)
    reset = verbs.add_parser(
        "reset-offsets", help="move a group's committed offsets (a dry run unless --execute)")
    reset.add_argument("group")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", action="append", metavar="TOPIC", dest="topics",
                       help="every partition of this topic (repeatable)")
    which.add_argument("--all-topics", action="store_true",
                       help="every partition the group has committed")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to the log start")
    target.add_argument("--to-latest", action="store_true", help="to the high watermark")
    target.add_argument("--to-offset", type=int, metavar="N",
                        help="to offset N (kept within the log)")
    reset.add_argument("--execute", action="store_true",
                       help="commit the new offsets (without it: show them only)")
    reset.set_defaults(run=reset_offsets)
    delete_offsets = verbs.add_parser(
        "delete-offsets", help="delete a group's offsets of topics it does not consume")
    delete_offsets.add_argument("group")
    delete_offsets.add_argument(
        "--topic", action="append", required=True, metavar="TOPIC[:P,...]", dest="topics",
        help="every partition of this topic, or the partitions listed (repeatable)")
    delete_offsets.set_defaults(run=delete_offsets_of)
    delete = verbs.add_parser("delete", help="delete empty groups and their offsets")
    delete.add_argument("groups", nargs="+", metavar="GROUP")
    delete.set_defaults(run=delete_groups)


def list_groups(args: argparse.Namespace, clients: Clients) -> Report:
    """ListGroups."""
    report = Report()
    table = report.table("groups", "group", "state", "protocol_type")
    found: list[dict[str, object]] = clients.admin().list_groups()
    for group in sorted(found, key=lambda g: str(g.get("group_id"))):
        table.add(str(group.get("group_id")), str(group.get("group_state") or ""),
                  str(group.get("protocol_type") or ""))
    return report


def _committed(clients: Clients, group: str) -> Offsets:
    found = clients.admin().list_group_offsets(group).get(group, {})
    return {tp: int(meta.offset) for tp, meta in found.items() if meta.offset >= 0}


def _log_offsets(clients: Clients, keys: list[TopicPartition], spec: object) -> Offsets:
    if not keys:
        return {}
    found = clients.admin().list_partition_offsets({tp: spec for tp in keys})
    return {tp: int(value.offset) for tp, value in found.items()}


def describe_group(args: argparse.Namespace, clients: Clients) -> Report:
    """DescribeGroups, OffsetFetch and ListOffsets: state, members, lag per partition."""
    group: str = args.group
    described = clients.admin().describe_groups([group]).get(group, {})
    error = described.get("error")
    if error is not None:
        raise CallFailed(f"{getattr(error, 'message', error)}: group {group}")
    committed = _committed(clients, group)
    keys = sorted(committed, key=lambda tp: (tp.topic, tp.partition))
    ends = _log_offsets(clients, keys, OffsetSpec.LATEST)
    members = described.get("members") or []
    report = Report({"group": group, "state": str(described.get("group_state") or ""),
                     "protocol_type": str(described.get("protocol_type") or ""),
                     "members": len(members)})
    member_table = report.table("members", "member_id", "client_id", "host")
    for member in members:
        member_table.add(str(member.get("member_id")), str(member.get("client_id")),
                         str(member.get("client_host")))
    offsets = report.table("offsets", "topic", "partition", "committed", "end_offset", "lag")
    for tp in keys:
        end = ends.get(tp)
        offsets.add(tp.topic, tp.partition, committed[tp], end,
                    None if end is None else max(end - committed[tp], 0))
    return report


def _partitions_of(clients: Clients, topics: list[str]) -> list[TopicPartition]:
    described: list[dict[str, object]] = clients.admin().describe_topics(topics)
    keys = []
    for topic in described:
        if topic.get("error_code"):
            raise CallFailed(f"cannot describe topic {topic.get('name')}: "
                             f"{error_code_name(int(str(topic.get('error_code'))))}")
        partitions = topic.get("partitions")
        for partition in partitions if isinstance(partitions, list) else []:
            keys.append(TopicPartition(str(topic.get("name")),
                                       int(partition["partition_index"])))
    return keys


_INACTIVE = ("Empty", "Dead")
"""The group states whose offsets may be reset (Kafka's tool: no live member)."""


def _require_inactive(clients: Clients, group: str) -> None:
    """CallFailed, as Kafka's tool words it, unless ``group`` has no live member (its
    commits would be refused member by member, UNKNOWN_MEMBER_ID per partition)."""
    described = clients.admin().describe_groups([group]).get(group, {})
    error = described.get("error")
    if error is not None:
        raise CallFailed(f"{getattr(error, 'message', error)}: group {group}")
    state = str(described.get("group_state") or "Dead")
    if state not in _INACTIVE:
        raise CallFailed(f"Assignments can only be reset if the group '{group}' is inactive, "
                         f"but the current state is {state}.")


def reset_offsets(args: argparse.Namespace, clients: Clients) -> Report:
    """New offsets within ``[log start, high watermark]``; committed with --execute, when
    the group has no live member (Kafka's rule: it checks the group's state first)."""
    group: str = args.group
    if args.execute:
        _require_inactive(clients, group)
    committed = _committed(clients, group)
    keys = (sorted(committed, key=lambda tp: (tp.topic, tp.partition)) if args.all_topics
            else _partitions_of(clients, list(args.topics)))
    if not keys:
        raise UsageError(f"group {group} has no committed offsets to reset")
    earliest = _log_offsets(clients, keys, OffsetSpec.EARLIEST)
    latest = _log_offsets(clients, keys, OffsetSpec.LATEST)
    wanted: Offsets = {}
    for tp in keys:
        chosen = (earliest[tp] if args.to_earliest else latest[tp] if args.to_latest
                  else args.to_offset)
        wanted[tp] = min(max(int(chosen), earliest[tp]), latest[tp])
    report = Report({"group": group, "executed": bool(args.execute)})
    table = report.table("offsets", "topic", "partition", "current", "new", "result")
    results: dict[TopicPartition, object] = {}
    if args.execute:
        results = clients.admin().alter_group_offsets(
            group, {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in wanted.items()})
    for tp in keys:
        outcome = results.get(tp)
        name = getattr(outcome, "message", None) or ("NONE" if args.execute else "dry run")
        name = "NONE" if name == "NO_ERROR" else str(name)
        report.failed |= args.execute and name != "NONE"
        table.add(tp.topic, tp.partition, committed.get(tp), wanted[tp], name)
    return report


def _topic_partitions(clients: Clients, specs: list[str]) -> list[TopicPartition]:
    """``T`` (every partition of T) or ``T:0,2`` (those listed), as Kafka's tool takes
    them (a name may hold a colon itself: ``persistent://tenant/ns/t``)."""
    listed: list[TopicPartition] = []
    whole: list[str] = []
    for spec in specs:
        name, colon, numbers = spec.rpartition(":")
        if colon and numbers and all(n.strip().isdigit() for n in numbers.split(",")):
            listed.extend(TopicPartition(name, int(n)) for n in numbers.split(","))
        else:
            whole.append(spec)
    return listed + (_partitions_of(clients, whole) if whole else [])


def delete_offsets_of(args: argparse.Namespace, clients: Clients) -> Report:
    """OffsetDelete (KIP-496): a partition of a topic the group subscribes to is refused
    (GROUP_SUBSCRIBED_TO_TOPIC); an unknown group fails the call (GROUP_ID_NOT_FOUND)."""
    group: str = args.group
    keys = _topic_partitions(clients, list(args.topics))
    results: dict[TopicPartition, type] = clients.admin().delete_group_offsets(group, keys)
    report = Report({"group": group})
    table = report.table("results", "topic", "partition", "result")
    for tp in sorted(results, key=lambda tp: (tp.topic, tp.partition)):
        message = getattr(results[tp], "message", None)
        name = "NONE" if message in (None, "NO_ERROR") else str(message)
        report.failed |= name != "NONE"
        table.add(tp.topic, tp.partition, name)
    return report


def delete_groups(args: argparse.Namespace, clients: Clients) -> Report:
    """DeleteGroups; a group with members (or unknown) is refused."""
    results: dict[str, str] = clients.admin().delete_groups(list(args.groups))
    report = Report()
    table = report.table("results", "group", "result")
    for group in args.groups:
        outcome = results.get(group, "UNKNOWN")
        name = "NONE" if outcome == "OK" else _error_name(outcome)
        report.failed |= name != "NONE"
        table.add(group, name)
    return report


def _error_name(class_name: str) -> str:
    """kafka-python's error class name (``GroupIdNotFoundError``) as Kafka's error name."""
    import kafka.errors

    found = getattr(kafka.errors, class_name, None)
    message = getattr(found, "message", None)
    return message if isinstance(message, str) else class_name
