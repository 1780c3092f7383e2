"""``admin quotas describe|alter``: client quotas through DescribeClientQuotas (API key
48) and AlterClientQuotas (49), sent as kafka-python's protocol classes over the admin
client's connection (its admin API has no call for them).

An entity is ``--entity TYPE=NAME`` (types ``user``, ``client-id``, ``tenant``,
``namespace``); ``TYPE=`` or ``TYPE=<default>`` is the type's default entity, and for
``describe`` a bare ``TYPE`` matches any name of the type.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest

from edge.admin.connection import Clients
from edge.admin.errors import CallFailed, UsageError, error_code_name
from edge.admin.output import Report
from edge.admin.parsing import SubParsers, key_values

DEFAULT = "<default>"
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2

Entity = list[tuple[str, str | None]]


def add_parsers(groups: SubParsers) -> None:
    """The ``quotas`` group and its verbs."""
    parser = groups.add_parser("quotas", help="describe and alter client quotas")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    describe = verbs.add_parser("describe", help="quotas of the entities matched (all "
                                                 "by default)")
    describe.add_argument("--entity", action="append", default=[], metavar="TYPE[=NAME]",
                          help="match this entity type, name or default (repeatable)")
    describe.add_argument("--strict", action="store_true",
                          help="only entities of exactly the types given")
    describe.set_defaults(run=describe_quotas)
    alter = verbs.add_parser("alter", help="set or remove quotas of one entity")
    alter.add_argument("--entity", action="append", required=True, metavar="TYPE=NAME",
                       help="the entity (repeat for user and client-id together)")
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       dest="set_quotas",
                       help="producer_byte_rate, consumer_byte_rate or request_percentage")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       dest="delete_quotas", help="remove this quota (repeatable)")
    alter.add_argument("--validate-only", action="store_true",
                       help="let the broker check it without changing anything")
    alter.set_defaults(run=alter_quotas)


def _entity_name(name: str | None) -> str:
    return DEFAULT if name is None else name


def _shown(entity: Sequence[tuple[str, str | None]]) -> str:
    return ",".join(f"{kind}={_entity_name(name)}" for kind, name in entity)


def _components(specs: Sequence[str]) -> list[DescribeClientQuotasRequest.ComponentData]:
    components = []
    for spec in specs:
        kind, sep, name = spec.partition("=")
        if not kind:
            raise UsageError(f"--entity {spec!r}: expected TYPE or TYPE=NAME")
        if not sep:
            match, text = MATCH_ANY, None
        elif name in ("", DEFAULT):
            match, text = MATCH_DEFAULT, None
        else:
            match, text = MATCH_EXACT, name
        components.append(DescribeClientQuotasRequest.ComponentData(
            entity_type=kind, match_type=match, match=text))
    return components


def describe_quotas(args: argparse.Namespace, clients: Clients) -> Report:
    """DescribeClientQuotas: one row per entity and quota key."""
    admin = clients.admin()
    request = DescribeClientQuotasRequest(components=_components(args.entity),
                                          strict=bool(args.strict))
    response = admin._manager.run(admin._manager.send, request)
    if response.error_code:
        raise CallFailed(f"{error_code_name(response.error_code)}: "
                         f"{response.error_message or 'quotas not described'}")
    report = Report()
    table = report.table("quotas", "entity", "key", "value")
    rows = []
    for entry in response.entries or []:
        entity = [(e.entity_type, e.entity_name) for e in entry.entity]
        for value in entry.values:
            rows.append((_shown(entity), str(value.key), float(value.value)))
    for row in sorted(rows):
        table.add(*row)
    return report


def _entity(specs: Sequence[str]) -> Entity:
    entity: Entity = []
    for spec in specs:
        kind, sep, name = spec.partition("=")
        if not kind or not sep:
            raise UsageError(f"--entity {spec!r}: expected TYPE=NAME (TYPE= for the default)")
        entity.append((kind, None if name in ("", DEFAULT) else name))
    return entity


def alter_quotas(args: argparse.Namespace, clients: Clients) -> Report:
    """AlterClientQuotas of one entity."""
    entity = _entity(args.entity)
    entry = AlterClientQuotasRequest.EntryData
    ops = []
    for key, text in key_values(args.set_quotas, "--set").items():
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"--set {key}={text!r}: expected a number") from None
        ops.append(entry.OpData(key=key, value=value, remove=False))
    ops += [entry.OpData(key=key, value=0.0, remove=True) for key in args.delete_quotas]
    if not ops:
        raise UsageError("give at least one --set KEY=VALUE or --delete KEY")
    request = AlterClientQuotasRequest(
        entries=[entry(entity=[entry.EntityData(entity_type=kind, entity_name=name)
                               for kind, name in entity], ops=ops)],
        validate_only=bool(args.validate_only))
    admin = clients.admin()
    response = admin._manager.run(admin._manager.send, request)
    report = Report()
    table = report.table("results", "entity", "result")
    for result in response.entries:
        name = error_code_name(result.error_code)
        if result.error_message:
            name = f"{name}: {result.error_message}"
        report.failed |= result.error_code != 0
        table.add(_shown([(e.entity_type, e.entity_name) for e in result.entity]), name)
    return report
