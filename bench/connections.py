"""``python -m bench.connections``: many idle, logged-in connections (issue 21's row).

One broker with a PLAINTEXT and a SASL_PLAINTEXT listener (SASL/PLAIN with HS256 tokens).
First the produce latency of one active client (``bench.worker latency`` on the PLAINTEXT
listener: fixed rate, each record's produce() to its delivery report) with no other
connection, and the broker's settled RSS; then ``--connections`` idle connections log in
(``bench.idle_clients``: ApiVersions, SaslHandshake, SaslAuthenticate on raw sockets, then
nothing) and the broker's settled RSS again, and the same latency run beside them. Reports
the broker's RSS per idle connection (target < 20 KiB), the logins' rate, and p50/p99 of
the active client without and with the idle connections. Saved to
``connections.json`` and ``connections.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import base64
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jwt

from bench import procstats
from bench.admin import create_topic
from bench.brokers import EdgeBroker
from bench.idle_clients import raise_file_limit
from bench.options import RESULTS
from bench.report import save_row
from edge.ready_line import parse_ready

KIB = 1024
TARGET_KIB_PER_CONNECTION = 20.0
TOPIC = "connections-latency"


class ListenersBroker(EdgeBroker):
    """This broker with every listener's port noted (``ports``, by listener name)."""

    def __init__(self, settings: dict[str, str]) -> None:
        super().__init__(settings)
        self.ports: dict[str, int] = {}

    def _on_line(self, line: str, ready: threading.Event) -> None:
        parsed = parse_ready(line)
        if parsed is not None and parsed.listeners:
            self.ports = {listener.name: listener.port for listener in parsed.listeners}
            self.port = self.ports["PLAINTEXT"]
            ready.set()


def settled_rss(pid: int, quiet_bytes: int = 256 * KIB, rounds: int = 40) -> int:
    """The broker's RSS once it stops moving (two readings 0.5 s apart within
    ``quiet_bytes``), or the last reading."""
    last = procstats.rss_bytes(pid)
    for _ in range(rounds):
        time.sleep(0.5)
        now = procstats.rss_bytes(pid)
        if abs(now - last) <= quiet_bytes:
            return now
        last = now
    return last


def latency(broker: ListenersBroker, args: argparse.Namespace) -> dict[str, Any]:
    """One fixed-rate latency run of ``bench.worker`` on the PLAINTEXT listener."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.worker", "latency", "--bootstrap", broker.bootstrap,
         "--topic", TOPIC, "--size", str(args.size), "--rate", str(args.rate),
         "--seconds", str(args.seconds), "--warmup", str(args.warmup),
         "--linger-ms", str(args.linger_ms), "--acks", "all"],
        capture_output=True, text=True, timeout=args.seconds + args.warmup + 120, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def idle_connections(broker: ListenersBroker, count: int,
                     token: str) -> tuple[subprocess.Popen[str], float]:
    """Start ``bench.idle_clients`` with ``count`` connections; once all logged in, the
    process (close its stdin to end it) and the seconds the logins took."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.idle_clients", "--port",
         str(broker.ports["SASL_PLAINTEXT"]), "--count", str(count), "--username", "bench",
         "--token", token],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "logged-in":
        proc.kill()
        raise RuntimeError(f"idle clients failed: {' '.join(line)}\n{broker.log_tail()}")
    return proc, float(line[2])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The row: latency and RSS without and with the idle connections."""
    raise_file_limit()  # the broker inherits it: one descriptor per connection
    secret = secrets.token_bytes(32)
    token = jwt.encode({"sub": "bench", "exp": int(time.time()) + 3600}, secret,
                       algorithm="HS256")
    broker = ListenersBroker({
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode(),
        "connectionMaxIdleMs": "0",
        "maxConnectionsPerListener": str(args.connections + 100),
    })
    broker.start(None, timeout=60)
    try:
        create_topic(broker.bootstrap, TOPIC, 1)
        alone = latency(broker, args)
        before = settled_rss(broker.pid)
        holder, login_seconds = idle_connections(broker, args.connections, token)
        try:
            after = settled_rss(broker.pid)
            beside = latency(broker, args)
            broker.check_alive()
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(60)
        peak = broker.peak_rss_bytes()
    finally:
        broker.stop(60)
    per_connection = (after - before) / args.connections
    return {
        "connections": args.connections,
        "rss_before_bytes": before, "rss_after_bytes": after, "peak_rss_bytes": peak,
        "rss_per_connection_bytes": per_connection,
        "login_seconds": login_seconds, "logins_per_second": args.connections / login_seconds,
        "latency_alone": alone, "latency_beside": beside,
        "target_kib_per_connection": TARGET_KIB_PER_CONNECTION,
        "target_met": per_connection / KIB < TARGET_KIB_PER_CONNECTION,
        "options": {k: v for k, v in vars(args).items() if k != "out"},
    }


def render(result: dict[str, Any]) -> str:
    """The row as a Markdown table."""
    alone, beside = result["latency_alone"], result["latency_beside"]
    per = result["rss_per_connection_bytes"] / KIB
    verdict = "met" if result["target_met"] else "NOT met"
    rate = result["options"]["rate"]
    size = result["options"]["size"]
    return "\n".join([
        f"### {result['connections']:,} idle SASL/PLAIN (token) connections",
        "",
        "| measure | value |",
        "|---|---|",
        f"| broker RSS before / after | {result['rss_before_bytes'] / 2**20:.1f} MiB / "
        f"{result['rss_after_bytes'] / 2**20:.1f} MiB |",
        f"| **RSS per idle connection** | **{per:.1f} KiB** (target < "
        f"{result['target_kib_per_connection']:.0f} KiB: {verdict}) |",
        f"| logins (200 at a time) | {result['logins_per_second']:,.0f}/s "
        f"({result['login_seconds']:.1f} s) |",
        f"| produce p50 / p99, alone ({rate:,.0f}/s x {size} B) | {alone['p50_ms']:.2f} / "
        f"{alone['p99_ms']:.2f} ms |",
        f"| produce p50 / p99, beside the idle connections | {beside['p50_ms']:.2f} / "
        f"{beside['p99_ms']:.2f} ms |",
        "",
    ])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.connections")
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=2_000.0, help="records/s of the client")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--linger-ms", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true",
                        help="50 connections, 2 s of latency (the smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.connections, args.seconds, args.warmup, args.rate = 50, 2.0, 0.5, 500.0
    result = run(args)
    text = render(result)
    print(text)
    save_row(args.out, "connections", result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
