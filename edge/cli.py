"""The ``edge-broker`` command line.

- ``edge-broker [--config FILE] [--set key=value]...`` runs the broker (no subcommand);
- ``edge-broker token --issuer-url URL --credentials-url URL [--audience A] [--scope S]``
  prints an OAuth access token (client-credentials grant) for scripts;
- ``edge-broker dev-issuer [--port 0] [--client id:secret[:tenant]]...`` runs the
  development OAuth issuer on loopback until SIGTERM / Ctrl-C (SIGHUP rotates its key);
- ``edge-broker envoy-config [--config FILE] [--set key=value]... [options]`` writes an
  Envoy bootstrap, and ``edge-broker xds-server [...]`` serves listeners and clusters to
  Envoys over ADS (see ``edge.envoy.commands``);
- ``edge-broker certs [--dir certs] [--host H]... [--client CN] [--days N] [--force]`` writes
  a throw-away CA and a server certificate (and a client one) for trying TLS listeners;
- ``edge-broker cluster [--brokers 3] [--base-port 9092] [--data-dir DIR] [--config FILE]
  [--set key=value]...`` runs a throwaway PostgreSQL and brokers on it until Ctrl-C (see
  ``edge.cluster``);
- ``edge-broker check-config [--config FILE] [--set key=value]...`` validates the
  configuration and prints every key's effective value, secrets masked;
- ``edge-broker admin [connection options] GROUP VERB ...`` administers a running broker
  over the Kafka protocol (see ``edge.admin``);
- ``edge-broker --version`` prints the version.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from edge.config import BrokerConfig, ConfigError, load_config
from edge.log_limits import limit_repeated_warnings


def _add_token_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser(
        "token", help="print an OAuth access token (client-credentials grant)",
        description="Discover the issuer's token endpoint, get a token with the "
                    "client-credentials grant and print it on stdout.")
    token.add_argument("--issuer-url", required=True, help="the OAuth issuer (OIDC discovery)")
    token.add_argument("--credentials-url", required=True,
                       help="file:// or data:application/json;base64,... holding client_id, "
                            "client_secret and optionally tenant and group_id")
    token.add_argument("--audience", help="the audience to ask for")
    token.add_argument("--scope", help="the scope to ask for (space-separated)")
    token.add_argument("--auth-method", default="auto",
                       choices=("auto", "client_secret_basic", "client_secret_post"),
                       help="how the client authenticates to the token endpoint")
    token.add_argument("--json", action="store_true",
                       help="print token, expiry, principal and SASL extensions as JSON")


def _add_dev_issuer_parser(
        commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    issuer = commands.add_parser(
        "dev-issuer", help="run a development OAuth issuer on loopback",
        description="Serve OIDC discovery, a JWKS and a client-credentials token endpoint "
                    "on loopback; prints 'dev-issuer ready: URL'. POST /rotate (or SIGHUP) "
                    "rotates the signing key; GET /stats counts requests.")
    issuer.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    issuer.add_argument("--port", type=int, default=0, help="port (0 = any free port)")
    issuer.add_argument("--client", action="append", default=[], metavar="ID:SECRET[:TENANT]",
                        dest="clients", help="a client that may get tokens (repeatable)")
    issuer.add_argument("--audience", default="edge-broker", help="the tokens' 'aud'")
    issuer.add_argument("--token-lifetime-seconds", type=int, default=3600,
                        help="lifetime of issued tokens")
    issuer.add_argument("--tenant-claim",
                        help="put a client's tenant in this claim (e.g. 'tenant')")
    issuer.add_argument("--key-grace-seconds", type=float,
                        help="how long a rotated-out key stays in the JWKS "
                             "(default: the token lifetime)")


def _add_envoy_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edge.envoy.commands import add_envoy_config_arguments, add_xds_server_arguments

    add_envoy_config_arguments(commands.add_parser(
        "envoy-config", help="write an Envoy bootstrap (YAML) for the brokers",
        description="Write an Envoy bootstrap: one listener per broker at its advertised "
                    "address, proxying to its internal listener; or, with --xds, a dynamic "
                    "bootstrap served by xds-server."))
    add_xds_server_arguments(commands.add_parser(
        "xds-server", help="serve Envoy listeners and clusters over ADS (gRPC)",
        description="Serve the brokers' Envoy listeners and clusters over ADS; reload on "
                    "file change, SIGHUP or POST /reload; GET /status shows ACKs and NACKs."))


def _add_certs_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edge.certs import DEFAULT_HOSTS

    certs = commands.add_parser(
        "certs", help="write a throw-away CA and certificates for trying TLS listeners",
        description="Write ca.pem, server.pem and server.key (and client.pem, client.key "
                    "with --client) into a directory: a CA made for the occasion, whose "
                    "key is not kept, and certificates it signed. Not for production.")
    certs.add_argument("--dir", default="certs", help="where to write (default: certs)")
    certs.add_argument("--host", action="append", dest="hosts", metavar="HOST",
                       help="a name or IP address the server certificate is for (repeatable; "
                            f"default: {' '.join(DEFAULT_HOSTS)})")
    certs.add_argument("--client", metavar="CN",
                       help="also write a client certificate with this common name (the "
                            "principal on SSL listeners)")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    certs.add_argument("--force", action="store_true", help="replace files already there")


def _add_cluster_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from edge.cluster import add_cluster_arguments

    add_cluster_arguments(commands.add_parser(
        "cluster", help="run a throwaway PostgreSQL and brokers on it until Ctrl-C",
        description="Start a local PostgreSQL (Debian's server binaries, its own directory "
                    "and port) and N brokers on one database of it; print the bootstrap "
                    "address (host:port,...) on stdout and run until SIGINT or SIGTERM, "
                    "which stops the brokers, then PostgreSQL. --config and --set apply to "
                    "every broker; brokerId, kafkaListeners and storageUrl are set per "
                    "broker."))


def _add_check_config_parser(
        commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check-config", help="validate the configuration and print its effective values",
        description="Read --config and the --set overrides as the broker would, print "
                    "every key as key=value (the default where not set; secrets masked) "
                    "and exit 0; or print the error and exit 2.")
    check.add_argument("--config", metavar="FILE", dest="check_config",
                       help="a Java-style properties file with broker settings")
    check.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                       dest="check_overrides", help="override one setting (repeatable)")


def _add_admin_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                      used: bool) -> None:
    """The ``admin`` subcommand; its arguments only when the command line ``used`` it
    (they import the admin client, a fifth of a second of every broker's start)."""
    admin = commands.add_parser(
        "admin", help="administer a running broker (topics, groups, ACLs, quotas, tokens)",
        description="A Kafka client for operators: topics, consumer groups, ACLs, quotas, "
                    "the cluster, PLAIN tokens, and quick produce/consume checks. Exit 0 "
                    "when done, 1 when the broker refused or the call failed, 2 on a usage "
                    "error.")
    if used:
        from edge.admin.commands import add_admin_arguments

        add_admin_arguments(admin)


def version() -> str:
    """The installed package's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("edge-broker")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="edge-broker",
        description="A Kafka-protocol edge broker on a managed-ledger log. Without a "
                    "subcommand it runs the broker.",
    )
    parser.add_argument("--config", metavar="FILE",
                        help="a Java-style properties file with broker settings")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        dest="overrides", help="override one setting (repeatable)")
    parser.add_argument("--version", action="version", version=f"edge-broker {version()}")
    commands = parser.add_subparsers(
        dest="command",
        metavar="{admin,check-config,token,dev-issuer,envoy-config,xds-server,certs,cluster}")
    _add_admin_parser(commands, "admin" in (sys.argv[1:] if argv is None else argv))
    _add_check_config_parser(commands)
    _add_token_parser(commands)
    _add_dev_issuer_parser(commands)
    _add_envoy_parsers(commands)
    _add_certs_parser(commands)
    _add_cluster_parser(commands)
    return parser.parse_args(argv)


def run_broker(args: argparse.Namespace) -> int:
    """Load the config, then run the broker until SIGTERM or SIGINT."""
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"edge-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    from edge.log_thread import ThreadedLog

    with ThreadedLog(sys.stderr, config.log_format) as broker_log:
        logging.basicConfig(level=config.log_level, handlers=[broker_log.handler])
        limit_repeated_warnings()
        code, message = _run_app(config)
    if message:  # after the log's last lines
        print(f"edge-broker: {message}", file=sys.stderr)
    return code


def _run_app(config: BrokerConfig) -> tuple[int, str | None]:
    """Build the broker and run it until SIGTERM or SIGINT (the log is set up): the exit
    code, and what to tell the operator when it could not start."""
    import uvloop

    from broker_core.storage import DataDirLocked, SchemaTooNew
    from edge.app import BrokerApp, StartupError

    try:
        app = BrokerApp(config)
    except ConfigError as exc:
        return 2, f"configuration error: {exc}"
    except (DataDirLocked, SchemaTooNew) as exc:
        return 2, f"cannot start: {exc}"
    except (OSError, ValueError) as exc:
        logging.getLogger("edge.broker").error("cannot start: %s", exc)
        return 1, None
    try:
        clean = uvloop.run(app.run())
    except StartupError as exc:
        return 2, f"cannot start: {exc}"
    return (0 if clean else 1), None


def run_check_config(args: argparse.Namespace) -> int:
    """Print the effective configuration (secrets masked); exit 2 naming the first error
    (of a key, or of the security settings: TLS files, token keys, OAuth settings).

    ``--config``/``--set`` given before ``check-config`` count as well as those after it.
    """
    from edge.security import check_security

    path = args.check_config or args.config
    try:
        config = load_config(path, [*args.overrides, *args.check_overrides])
        check_security(config)
    except ConfigError as exc:
        print(f"edge-broker check-config: configuration error: {exc}", file=sys.stderr)
        return 2
    for name, value in config.shown_properties().items():
        print(f"{name}={value}")
    return 0


def run_token(args: argparse.Namespace) -> int:
    """Print a token (or its details as JSON); exit 1 with the issuer's error."""
    from oauth.errors import OAuthError
    from oauth.login import ClientCredentialsLogin

    try:
        login = ClientCredentialsLogin(args.issuer_url, args.credentials_url,
                                       audience=args.audience, scope=args.scope,
                                       auth_method=args.auth_method)
        token = login.token()
    except (OAuthError, ValueError) as exc:
        print(f"edge-broker token: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"access_token": token.value, "expires_at": token.expires_at,
                          "principal": token.principal, "scope": token.scope,
                          "extensions": login.extensions()}))
    else:
        print(token.value)
    return 0


def run_dev_issuer(args: argparse.Namespace) -> int:
    """Serve the development issuer until SIGTERM or SIGINT; SIGHUP rotates the key."""
    from oauth.dev_issuer import DevIssuer, parse_client_spec

    try:
        issuer = DevIssuer(args.host, args.port, [parse_client_spec(c) for c in args.clients],
                           audience=args.audience,
                           token_lifetime_seconds=args.token_lifetime_seconds,
                           tenant_claim=args.tenant_claim,
                           key_grace_seconds=args.key_grace_seconds)
        issuer.start()
    except (ValueError, OSError) as exc:
        print(f"edge-broker dev-issuer: {exc}", file=sys.stderr)
        return 2
    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    def rotate(_signum: int, _frame: FrameType | None) -> None:
        print(f"dev-issuer rotated: kid {issuer.rotate()}", flush=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, rotate)
    print(f"dev-issuer ready: {issuer.url}", flush=True)
    while not stopping.wait(0.5):
        pass
    issuer.stop()
    return 0


def run_certs(args: argparse.Namespace) -> int:
    """Write the certificates; name each file written; exit 2 on bad arguments or files
    that are already there."""
    from pathlib import Path

    from edge.certs import DEFAULT_HOSTS, make_certs

    try:
        files = make_certs(Path(args.dir), args.hosts or DEFAULT_HOSTS, args.client,
                           args.days, overwrite=args.force)
    except (ValueError, OSError) as exc:
        print(f"edge-broker certs: {exc}", file=sys.stderr)
        return 2
    for path in files.written():
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the broker, or the subcommand given."""
    args = parse_args(argv)
    if args.command == "admin":
        from edge.admin.commands import run_admin

        return run_admin(args)
    if args.command == "check-config":
        return run_check_config(args)
    if args.command == "token":
        return run_token(args)
    if args.command == "dev-issuer":
        return run_dev_issuer(args)
    if args.command == "certs":
        return run_certs(args)
    if args.command == "cluster":
        from edge.cluster import run_cluster

        return run_cluster(args)
    if args.command in ("envoy-config", "xds-server"):
        from edge.envoy.commands import run_command

        return run_command(args, sys.argv[1:] if argv is None else argv)
    return run_broker(args)


if __name__ == "__main__":
    sys.exit(main())
