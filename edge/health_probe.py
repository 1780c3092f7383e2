"""``python -m edge.health_probe --config FILE [--set key=value]...``: the container's health
check. It reads the broker's own configuration (so the port is the broker's ``metricsPort``,
wherever the operator set it) and asks the broker's ``/healthz`` on that port: exit 0 when it
answers 200, else exit 1 with one line saying why. A wildcard ``metricsHost`` (``0.0.0.0``,
``::``) is reached on loopback."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from edge.config import BrokerConfig, ConfigError, load_config

HEALTH_PATH = "/healthz"
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def health_url(config: BrokerConfig) -> str | None:
    """The ``/healthz`` URL of the broker ``config`` describes (None: metrics are off)."""
    if not config.metrics_port:
        return None
    host = WILDCARDS.get(config.metrics_host, config.metrics_host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.metrics_port}{HEALTH_PATH}"


def probe(url: str, timeout: float) -> str | None:
    """None when ``url`` answers 200; else why not, in one line."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if status == 200 else f"{url}: HTTP {status}"


def main(argv: Sequence[str] | None = None) -> int:
    """Probe the broker's health endpoint; 0 healthy, 1 not (or not checkable)."""
    parser = argparse.ArgumentParser(
        prog="python -m edge.health_probe",
        description="Exit 0 when the broker's /healthz (on its metricsPort) answers 200.")
    parser.add_argument("--config", metavar="FILE", help="the broker's properties file")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        dest="overrides", help="a setting the broker was given (repeatable)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (5)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"health probe: configuration error: {exc}", file=sys.stderr)
        return 1
    url = health_url(config)
    if url is None:
        print("health probe: metricsPort is 0 (the metrics endpoint is off): nothing to ask",
              file=sys.stderr)
        return 1
    failure = probe(url, args.timeout)
    if failure is not None:
        print(f"health probe: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
