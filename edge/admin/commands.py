"""The ``edge-broker admin`` command line: connection flags, the verb groups, and how a
verb's outcome becomes output and an exit code (0 done, 1 refused or failed, 2 usage).

A verb is a function ``(args, clients) -> Report`` set as ``run`` on its parser; it
raises :class:`UsageError` or :class:`CallFailed`, or lets a kafka-python error through,
and each becomes one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable

from kafka.errors import KafkaError

from edge.admin import acls, cluster, groups, quotas, records, tokens, topics
from edge.admin.connection import Clients, client_settings
from edge.admin.errors import CallFailed, UsageError, kafka_error_line
from edge.admin.output import Report, emit

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Verb = Callable[[argparse.Namespace, Clients], Report]


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """The connection and output flags, then the verb groups."""
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT",
                        help="a broker to connect to (default: bootstrap.servers of "
                             "--command-config, else 127.0.0.1:9092)")
    parser.add_argument("--command-config", metavar="FILE",
                        help="Kafka client properties: bootstrap.servers, security.protocol, "
                             "sasl.mechanism (PLAIN, OAUTHBEARER), sasl.username, "
                             "sasl.password (or sasl.jaas.config with PlainLoginModule), "
                             "sasl.oauthbearer.*, ssl.ca.location, "
                             "...")
    parser.add_argument("--output", choices=("table", "json"), default="table",
                        help="aligned tables (default) or JSON for scripts")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="how long a call may take (default 30)")
    # not dest="group": the groups verbs name their positional group id so
    verb_groups = parser.add_subparsers(dest="verb_group", required=True, metavar="GROUP")
    for module in (topics, groups, acls, quotas, cluster, tokens, records):
        module.add_parsers(verb_groups)


def run_admin(args: argparse.Namespace) -> int:
    """Run the verb; print its report; the exit code."""
    run: Verb = args.run
    warnings.showwarning = _warning_line
    clients: Clients | None = None
    try:
        clients = Clients(client_settings(args.bootstrap_server, args.command_config,
                                          args.timeout))
        report = run(args, clients)
    except UsageError as exc:
        return _fail(args, str(exc), EXIT_USAGE)
    except CallFailed as exc:
        return _fail(args, str(exc), EXIT_FAILED)
    except KafkaError as exc:
        return _fail(args, kafka_error_line(exc), EXIT_FAILED)
    except OSError as exc:
        return _fail(args, f"{type(exc).__name__}: {exc}", EXIT_FAILED)
    finally:
        if clients is not None:
            clients.close()
    emit(report, args.output, sys.stdout)
    return EXIT_FAILED if report.failed else EXIT_OK


def _warning_line(message: Warning | str, category: type[Warning], filename: str,
                  lineno: int, file: object = None, line: str | None = None) -> None:
    """A library's warning (a short HMAC key, say) as one line, without source lines."""
    print(f"edge-broker admin: warning: {message}", file=sys.stderr)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    verb = getattr(args, "verb", None)
    where = " ".join(part for part in ("edge-broker admin", args.verb_group, verb) if part)
    print(f"{where}: {message}", file=sys.stderr)
    return code
