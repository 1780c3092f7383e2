"""``admin acls list|create|delete``: ACL bindings (principal, host, operation,
permission on a resource pattern), as Kafka's ``kafka-acls`` names them."""

from __future__ import annotations

import argparse
from enum import IntEnum

from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)

from edge.admin.connection import Clients
from edge.admin.errors import CallFailed, UsageError
from edge.admin.output import Report, Table
from edge.admin.parsing import SubParsers

_RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
              "cluster": ResourceType.CLUSTER,
              "transactional-id": ResourceType.TRANSACTIONAL_ID}
_OPERATIONS = [op.name.lower().replace("_", "-") for op in ACLOperation
               if op.name not in ("UNKNOWN", "ANY")]
_PATTERNS = ("literal", "prefixed")


def _add_binding_flags(parser: argparse.ArgumentParser, filtering: bool) -> None:
    required = not filtering
    parser.add_argument("--principal", required=required, metavar="User:NAME",
                        help="whose ACL (Kafka's form User:role)")
    parser.add_argument("--host", default=None if filtering else "*",
                        help="client host ('*': any, the default)")
    parser.add_argument("--operation", required=required, choices=_OPERATIONS)
    parser.add_argument("--permission", choices=("allow", "deny"),
                        default=None if filtering else "allow")
    parser.add_argument("--resource-type", required=required, choices=sorted(_RESOURCES))
    parser.add_argument("--resource-name", metavar="NAME",
                        help="topic, group or transactional id (kafka-cluster for the "
                             "cluster)")
    parser.add_argument("--pattern", choices=_PATTERNS,
                        default=None if filtering else "literal",
                        help="literal name, or prefix of names")


def add_parsers(groups: SubParsers) -> None:
    """The ``acls`` group and its verbs."""
    parser = groups.add_parser("acls", help="list, create and delete ACLs")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="ACLs matching the filter flags (all by default)")
    _add_binding_flags(listing, filtering=True)
    listing.set_defaults(run=list_acls)
    create = verbs.add_parser("create", help="create one ACL")
    _add_binding_flags(create, filtering=False)
    create.set_defaults(run=create_acl)
    delete = verbs.add_parser("delete", help="delete the ACLs matching the filter flags")
    _add_binding_flags(delete, filtering=True)
    delete.set_defaults(run=delete_acls)


def _enum_name(value: IntEnum) -> str:
    return value.name.lower().replace("_", "-")


def _filter(args: argparse.Namespace) -> ACLFilter:
    resource = _RESOURCES[args.resource_type] if args.resource_type else ResourceType.ANY
    pattern = (ACLResourcePatternType[args.pattern.upper()] if args.pattern
               else ACLResourcePatternType.ANY)
    return ACLFilter(
        principal=args.principal, host=args.host,
        operation=(ACLOperation[args.operation.upper().replace("-", "_")] if args.operation
                   else ACLOperation.ANY),
        permission_type=(ACLPermissionType[args.permission.upper()] if args.permission
                         else ACLPermissionType.ANY),
        resource_pattern=ResourcePatternFilter(resource, args.resource_name, pattern))


def _acl_table(report: Report, name: str) -> Table:
    return report.table(name, "principal", "host", "operation", "permission",
                        "resource_type", "resource_name", "pattern")


def _add(table: Table, acl: ACL) -> None:
    pattern = acl.resource_pattern
    table.add(str(acl.principal), str(acl.host), _enum_name(acl.operation),
              _enum_name(acl.permission_type), _enum_name(pattern.resource_type),
              str(pattern.resource_name), _enum_name(pattern.pattern_type))


def list_acls(args: argparse.Namespace, clients: Clients) -> Report:
    """DescribeAcls."""
    found, _error = clients.admin().describe_acls(_filter(args))
    report = Report()
    table = _acl_table(report, "acls")
    for acl in found:
        _add(table, acl)
    return report


def create_acl(args: argparse.Namespace, clients: Clients) -> Report:
    """CreateAcls of one binding."""
    name = args.resource_name
    if name is None:
        if args.resource_type != "cluster":
            raise UsageError("--resource-name is required (but for --resource-type cluster)")
        name = "kafka-cluster"
    if not args.principal.startswith("User:"):
        raise UsageError(f"--principal {args.principal!r}: expected User:NAME")
    acl = ACL(principal=args.principal, host=args.host,
              operation=ACLOperation[args.operation.upper().replace("-", "_")],
              permission_type=ACLPermissionType[args.permission.upper()],
              resource_pattern=ResourcePattern(_RESOURCES[args.resource_type], name,
                                               ACLResourcePatternType[args.pattern.upper()]))
    results = clients.admin().create_acls([acl])
    failed = results.get("failed") or []
    if failed:
        error = failed[0]
        raise CallFailed(f"{getattr(error, 'message', error)}: "
                         f"{getattr(error, 'description', '')}")
    report = Report()
    _add(_acl_table(report, "created"), acl)
    return report


def delete_acls(args: argparse.Namespace, clients: Clients) -> Report:
    """DeleteAcls of one filter; the ACLs it removed."""
    results = clients.admin().delete_acls([_filter(args)])
    report = Report()
    table = _acl_table(report, "deleted")
    for _filter_used, matched, error in results:
        message = getattr(error, "message", "NO_ERROR")
        if message != "NO_ERROR":
            raise CallFailed(f"{message}: {getattr(error, 'description', '')}")
        for acl in matched:
            _add(table, acl)
    return report
