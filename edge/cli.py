"""The ``edge-broker`` command line: ``edge-broker [--config FILE] [--set key=value]...``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import uvloop

from edge.app import BrokerApp
from edge.config import ConfigError, load_config


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="edge-broker",
        description="A Kafka-protocol edge broker on a managed-ledger log.",
    )
    parser.add_argument("--config", metavar="FILE",
                        help="a Java-style properties file with broker settings")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        dest="overrides", help="override one setting (repeatable)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Load the config, then run the broker until SIGTERM or SIGINT."""
    args = parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"edge-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        app = BrokerApp(config)
    except ConfigError as exc:
        print(f"edge-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        logging.getLogger("edge.broker").error("cannot start: %s", exc)
        return 1
    uvloop.run(app.run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
