"""``admin cluster describe``: the cluster id, the controller and the live brokers."""

from __future__ import annotations

import argparse

from edge.admin.connection import Clients
from edge.admin.output import Report
from edge.admin.parsing import SubParsers


def add_parsers(groups: SubParsers) -> None:
    """The ``cluster`` group and its verb."""
    parser = groups.add_parser("cluster", help="the cluster and its brokers")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("describe", help="cluster id, controller, brokers").set_defaults(
        run=describe_cluster)


def describe_cluster(args: argparse.Namespace, clients: Clients) -> Report:
    """DescribeCluster."""
    found: dict[str, object] = clients.admin().describe_cluster()
    report = Report({"cluster_id": str(found.get("cluster_id")),
                     "controller_id": _number(found.get("controller_id"))})
    table = report.table("brokers", "id", "host", "port", "rack")
    brokers = found.get("brokers")
    for broker in sorted(brokers if isinstance(brokers, list) else [],
                         key=lambda b: int(b["broker_id"])):
        rack = broker.get("rack")
        table.add(int(broker["broker_id"]), str(broker["host"]), int(broker["port"]),
                  None if rack is None else str(rack))
    return report


def _number(value: object) -> int | None:
    return value if isinstance(value, int) else None
