"""The ``edge-broker envoy-config`` and ``edge-broker xds-server`` subcommands.

``envoy-config`` writes an Envoy bootstrap (YAML): static, with one listener per broker,
or, with ``--xds HOST:PORT``, dynamic (listeners and clusters from the ADS server).
``xds-server`` serves the same listeners and clusters over ADS and pushes a new version
when the broker config or brokers file changes, when a broker joins or leaves the registry
(``--registry``), on ``SIGHUP`` or on ``POST /reload``.
Both take the broker inputs and edge options of :func:`add_plan_arguments`.

``xds-server`` logs with the broker's formatter (client text escaped and bounded, repeated
warnings limited).  It serves gRPC on a loopback address unless given mutual TLS
(``--xds-tls-cert``, ``--xds-tls-key``, ``--xds-client-ca``) or told ``--grpc-insecure``,
and its admin endpoint on a loopback address unless given ``--admin-token-file``;
``envoy-config --xds`` with ``--xds-tls-cert``, ``--xds-tls-key`` and ``--xds-ca`` writes a
bootstrap that connects to such a server over mutual TLS.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from broker_core.storage.postgres import public_url
from edge.envoy.contrib import CONTRIB_ONLY
from edge.envoy.model import (
    AccessLog,
    ConnectionRate,
    EdgeOptions,
    EnvoyConfigError,
    MutualTls,
    TlsTermination,
    parse_host_port,
)
from edge.envoy.registry import RegistryBrokers
from edge.envoy.source import PlanSource
from edge.log_format import broker_log_handler
from edge.log_limits import limit_repeated_warnings
from listeners.hosts import is_loopback

__all__ = [
    "COMMANDS",
    "add_envoy_config_arguments",
    "add_plan_arguments",
    "add_xds_server_arguments",
    "run_command",
    "run_envoy_config",
    "run_xds_server",
    "source_from_args",
]

COMMANDS = ("envoy-config", "xds-server")

_PLAN_DESTS = ("config", "overrides", "listener", "brokers", "brokers_file", "registry",
               "listen_host", "tls_cert", "tls_key", "tls_client_ca", "sni", "deny_cidrs",
               "allow_cidrs", "max_connections", "connection_rate", "access_log",
               "kafka_broker_filter")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Broker inputs and edge options shared by both subcommands."""
    brokers = parser.add_argument_group("brokers behind Envoy")
    brokers.add_argument("--config", metavar="FILE",
                         help="this broker's properties file (brokerId, listeners)")
    brokers.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                         dest="overrides", help="override one broker setting (repeatable)")
    brokers.add_argument("--listener", metavar="NAME",
                         help="the broker listener Envoy forwards to (default: the first;"
                         " with --registry, of every broker)")
    brokers.add_argument("--broker", metavar="ID=ADV_HOST:PORT@INTERNAL_HOST:PORT",
                         action="append", default=[], dest="brokers",
                         help="another broker: its id, advertised (Envoy) address and"
                         " internal address (repeatable)")
    brokers.add_argument("--brokers-file", metavar="FILE",
                         help="a file of ID=ADV@INTERNAL lines (watched by xds-server)")
    brokers.add_argument("--registry", metavar="postgres://USER@HOST:PORT/DB",
                         help="every live broker registered in this database (the brokers'"
                         " storageUrl), through its --listener (followed by xds-server)")
    edge = parser.add_argument_group("edge options")
    edge.add_argument("--listen-host", metavar="IP",
                      help="address Envoy binds (default: the advertised host if it is an"
                      " IP, else 0.0.0.0)")
    edge.add_argument("--tls-cert", metavar="FILE", help="terminate TLS at Envoy: PEM chain")
    edge.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    edge.add_argument("--tls-client-ca", metavar="FILE",
                      help="require client certificates signed by this CA")
    edge.add_argument("--sni", action="store_true",
                      help="all brokers on one port, routed by TLS server name")
    edge.add_argument("--deny-cidr", metavar="CIDR", action="append", default=[],
                      dest="deny_cidrs", help="close connections from this range (repeatable)")
    edge.add_argument("--allow-cidr", metavar="CIDR", action="append", default=[],
                      dest="allow_cidrs", help="accept only these ranges (repeatable)")
    edge.add_argument("--max-connections", metavar="N", type=int,
                      help="concurrent connections per broker listener")
    edge.add_argument("--connection-rate", metavar="N[/SECONDS]",
                      help="new connections per listener per period (default period 1 s)")
    edge.add_argument("--access-log", metavar="stdout|PATH",
                      help="log every connection to stdout or a file")
    edge.add_argument("--kafka-broker-filter", action="store_true",
                      help="add the contrib kafka_broker filter (envoyproxy/envoy-contrib"
                      " builds only) rewriting broker addresses by id")
    edge.add_argument("--proxy-protocol", action="store_true",
                      help="start each connection to a broker with a PROXY protocol v2 header"
                      " naming the client (the broker's proxyProtocolTrustedAddresses must"
                      " name Envoy's address on that listener)")


def add_envoy_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``envoy-config``."""
    add_plan_arguments(parser)
    out = parser.add_argument_group("bootstrap")
    out.add_argument("--output", metavar="FILE", default="-",
                     help="where to write the YAML (default: standard output)")
    out.add_argument("--admin-port", metavar="PORT", type=int, default=9901,
                     help="Envoy admin port, bound to 127.0.0.1 (default 9901)")
    out.add_argument("--node-id", metavar="ID", default="edge-broker-envoy",
                     help="Envoy node id (default edge-broker-envoy)")
    out.add_argument("--xds", metavar="HOST:PORT",
                     help="write a dynamic bootstrap taking everything from this xds-server")
    out.add_argument("--xds-tls-cert", metavar="FILE",
                     help="with --xds: connect over mutual TLS presenting this PEM chain")
    out.add_argument("--xds-tls-key", metavar="FILE", help="the PEM key of --xds-tls-cert")
    out.add_argument("--xds-ca", metavar="FILE",
                     help="the CA that signed the xds-server's certificate")


def add_xds_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``xds-server``."""
    add_plan_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:18000",
                        help="gRPC (ADS) address (default 127.0.0.1:18000; port 0: any)")
    server.add_argument("--admin", metavar="HOST:PORT", default="127.0.0.1:18001",
                        help="HTTP status/reload address (default 127.0.0.1:18001)")
    server.add_argument("--poll-interval", metavar="SECONDS", type=float, default=1.0,
                        help="how often watched files are checked (default 1)")
    server.add_argument("--log-level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    server.add_argument("--max-streams-per-peer", metavar="N", type=int,
                        help="ADS streams one client address may hold at once (default 16"
                        " of the server's 256)")
    secure = parser.add_argument_group("server security")
    secure.add_argument("--xds-tls-cert", metavar="FILE",
                        help="serve gRPC over TLS with this PEM chain (needs --xds-tls-key"
                        " and --xds-client-ca)")
    secure.add_argument("--xds-tls-key", metavar="FILE", help="the PEM key of --xds-tls-cert")
    secure.add_argument("--xds-client-ca", metavar="FILE",
                        help="require Envoy client certificates signed by this CA")
    secure.add_argument("--grpc-insecure", action="store_true",
                        help="allow gRPC in the clear on a non-loopback --listen (anyone"
                        " reaching it reads the broker addresses and can hold streams)")
    secure.add_argument("--admin-token-file", metavar="FILE",
                        help="admin requests must send Authorization: Bearer <the file's"
                        " text>; needed for a non-loopback --admin")


def _options(args: argparse.Namespace) -> EdgeOptions:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise EnvoyConfigError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise EnvoyConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    tls = TlsTermination(args.tls_cert, args.tls_key, args.tls_client_ca) \
        if args.tls_cert else None
    return EdgeOptions(
        listen_host=args.listen_host,
        tls=tls,
        sni=args.sni,
        deny_cidrs=tuple(_split(args.deny_cidrs)),
        allow_cidrs=tuple(_split(args.allow_cidrs)),
        max_connections=args.max_connections,
        connection_rate=ConnectionRate.parse(args.connection_rate)
        if args.connection_rate else None,
        access_log=AccessLog(args.access_log) if args.access_log else None,
        kafka_broker_filter=args.kafka_broker_filter,
        proxy_protocol=args.proxy_protocol,
    )


def _split(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def source_from_args(args: argparse.Namespace) -> PlanSource:
    """The plan inputs named on the command line; EnvoyConfigError if they name no broker."""
    registry = RegistryBrokers(args.registry, args.listener) if args.registry else None
    source = PlanSource(config_path=args.config, overrides=tuple(args.overrides),
                        listener=args.listener, broker_specs=tuple(args.brokers),
                        brokers_file=args.brokers_file, registry=registry,
                        options=_options(args))
    if not source.describes_brokers:
        raise EnvoyConfigError(
            "describe the brokers: --config/--set, --broker, --brokers-file or --registry")
    return source


def _header(argv: Sequence[str], contrib: bool) -> list[str]:
    shown: list[str] = []
    skip = after_registry = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--output":
            skip = True
        elif after_registry:  # a password in the URL stays out of the file
            shown.append(public_url(arg))
        elif arg.startswith("--registry="):
            shown.append("--registry=" + public_url(arg.partition("=")[2]))
        elif not arg.startswith("--output="):
            shown.append(arg)
        after_registry = arg == "--registry"
    lines = ["Envoy bootstrap generated by edge-broker; regenerate instead of editing:",
             "edge-broker envoy-config " + shlex.join(shown)]
    if contrib:
        lines += ["", *textwrap.wrap(f"Note: {CONTRIB_ONLY}.", 96)]
    return lines


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``args.command`` (one of :data:`COMMANDS`); ``argv`` is the whole command line."""
    if args.command == "envoy-config":
        words = list(argv)
        rest = words[words.index("envoy-config") + 1:] if "envoy-config" in words else []
        return run_envoy_config(args, rest)
    return run_xds_server(args)


def run_envoy_config(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Write the bootstrap; ``argv`` (the subcommand's arguments) goes into its header."""
    from edge.envoy.bootstrap import dynamic_bootstrap, message_yaml, static_bootstrap

    try:
        if args.xds:
            given = [d for d in _PLAN_DESTS if getattr(args, d) not in (None, False, [])]
            if given:
                raise EnvoyConfigError(
                    "--xds writes a dynamic bootstrap: give brokers and edge options to"
                    f" xds-server instead (got --{given[0].replace('_', '-')})")
            host, port = parse_host_port(args.xds, "--xds")
            message = dynamic_bootstrap(host, port, args.admin_port, args.node_id,
                                        _mutual_tls(args, _CLIENT_TLS))
        else:
            if args.xds_tls_cert or args.xds_tls_key or args.xds_ca:
                raise EnvoyConfigError(f"{', '.join(_CLIENT_TLS)} go with --xds")
            source = source_from_args(args)
            try:
                message = static_bootstrap(source.load(), args.admin_port, args.node_id)
            finally:
                if source.registry is not None:
                    source.registry.close()
    except EnvoyConfigError as exc:
        print(f"edge-broker envoy-config: {exc}", file=sys.stderr)
        return 2
    contrib = bool(args.kafka_broker_filter)
    if contrib:
        print(f"edge-broker envoy-config: warning: {CONTRIB_ONLY}", file=sys.stderr)
    text = message_yaml(message, _header(argv, contrib))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def _mutual_tls(args: argparse.Namespace, flags: tuple[str, str, str]) -> MutualTls | None:
    """The three TLS files named by ``flags`` (all or none), or None."""
    values = [getattr(args, flag[2:].replace("-", "_")) for flag in flags]
    if not any(values):
        return None
    if not all(values):
        raise EnvoyConfigError(f"{', '.join(flags[:-1])} and {flags[-1]} go together")
    return MutualTls(*values)


_SERVER_TLS = ("--xds-tls-cert", "--xds-tls-key", "--xds-client-ca")
_CLIENT_TLS = ("--xds-tls-cert", "--xds-tls-key", "--xds-ca")


def _admin_token(args: argparse.Namespace, admin_host: str) -> str | None:
    """The admin token (from ``--admin-token-file``); one is needed off loopback."""
    if args.admin_token_file is None:
        if not is_loopback(admin_host):
            raise EnvoyConfigError(
                f"--admin {args.admin} is not a loopback address: POST /reload and GET"
                " /status would answer anyone reaching it; give --admin-token-file")
        return None
    try:
        token = Path(args.admin_token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvoyConfigError(f"cannot read --admin-token-file: {exc}") from exc
    if len(token) < 16 or not token.isprintable():
        raise EnvoyConfigError("--admin-token-file: the token must be at least 16 printable"
                               " characters")
    return token


def _grpc_tls(args: argparse.Namespace, listen_host: str) -> MutualTls | None:
    """The gRPC port's mutual TLS; without it, a non-loopback --listen needs
    --grpc-insecure."""
    tls = _mutual_tls(args, _SERVER_TLS)
    if tls is None and not args.grpc_insecure and not is_loopback(listen_host):
        raise EnvoyConfigError(
            f"--listen {args.listen} is not a loopback address: anyone reaching it would"
            " read the broker addresses and could hold ADS streams; give --xds-tls-cert,"
            " --xds-tls-key and --xds-client-ca (mutual TLS), or --grpc-insecure")
    return tls


def run_xds_server(args: argparse.Namespace) -> int:
    """Serve ADS until SIGTERM or SIGINT; SIGHUP reloads."""
    from edge.envoy.xds_server import MAX_STREAMS_PER_PEER, XdsServer

    logging.basicConfig(level=args.log_level, handlers=[broker_log_handler(sys.stderr)])
    limit_repeated_warnings()
    try:
        source = source_from_args(args)
        listen = parse_host_port(args.listen, "--listen", allow_zero=True)
        admin = parse_host_port(args.admin, "--admin", allow_zero=True)
        per_peer = (MAX_STREAMS_PER_PEER if args.max_streams_per_peer is None
                    else args.max_streams_per_peer)
        if per_peer < 1:
            raise EnvoyConfigError("--max-streams-per-peer must be at least 1")
        server = XdsServer(source, listen, admin, args.poll_interval,
                           max_streams_per_peer=per_peer,
                           tls=_grpc_tls(args, listen[0]),
                           admin_token=_admin_token(args, admin[0]))
        server.start()
    except EnvoyConfigError as exc:
        print(f"edge-broker xds-server: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        print(f"edge-broker xds-server: cannot start: {exc}", file=sys.stderr)
        return 1
    done = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        done.set()

    def hup(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.reload, args=("SIGHUP",), daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, hup)
    if args.kafka_broker_filter:
        logging.getLogger("edge.envoy.xds").warning("%s", CONTRIB_ONLY)
    logging.getLogger("edge.envoy.xds").info(
        "edge-broker xds-server ready: grpc %s, admin http://%s, version %s",
        server.grpc_address, server.admin_address, server.store.version)
    while not done.wait(3600):
        pass
    server.stop()
    return 0
