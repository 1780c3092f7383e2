"""``edge-broker-pipeline``: the Spark jobs' command line.

``edge-broker-pipeline audit-report --bootstrap HOST:PORT [--since 1h] [--output DIR]``
writes the audit report (Parquet tables, a PNG chart) and prints its tables;
``--stream`` instead watches the audit topic and publishes burst alerts to
``__audit_alerts`` until stopped (or for ``--run-seconds``).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TypeAlias

from pipeline.audit.alerts import ALERTS_TOPIC, AlertSettings, start_alerts
from pipeline.audit.analysis import BurstRule
from pipeline.audit.events import AUDIT_TOPIC
from pipeline.audit.report import ReportSettings, run_report

SignalHandler: TypeAlias = \
    "Callable[[int, FrameType | None], object] | int | signal.Handlers | None"
"""What ``signal.getsignal`` gives back (and ``signal.signal`` takes)."""

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SPARK_CONFIG = {"spark.python.daemon.module": "pipeline.spark_daemon"}
"""The command line's Spark settings: Python workers out of the terminal's process group
(``pipeline.spark_daemon``), so that a Ctrl-C reaches the driver alone."""
CANCEL_EVERY_S = 0.5
STOP_SETTLE_S = 30.0
"""How long a stream's stop waits for the query to be between triggers."""
STOP_POLL_S = 0.1


def parse_since(text: str, now: float | None = None) -> int:
    """``90s``, ``15m``, ``2h``, ``7d``, ``1w`` ago; an ISO-8601 time (UTC unless it says);
    or epoch milliseconds. Returns epoch milliseconds."""
    now = time.time() if now is None else now
    relative = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if relative:
        return int((now - int(relative[1]) * _UNITS[relative[2]]) * 1000)
    if re.fullmatch(r"\d{11,}", text.strip()):
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--since takes 15m / 2h / 7d, an ISO time or epoch ms, not {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option takes KEY=VALUE, not {text!r}")
    return key, value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``audit-report`` is the one command so far)."""
    parser = argparse.ArgumentParser(prog="edge-broker-pipeline",
                                     description="Spark jobs over the edge broker's topics.")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser(
        "audit-report", help="security analytics over the broker's audit events",
        description="Summarise the audit topic (failed logins, denials, rejected "
                    "connections, password-guessing bursts) or, with --stream, publish "
                    "burst alerts continuously.")
    report.add_argument("--bootstrap", required=True, help="bootstrap servers, HOST:PORT")
    report.add_argument("--topic", default=AUDIT_TOPIC, help=f"audit topic ({AUDIT_TOPIC})")
    report.add_argument("--since", type=parse_since,
                        help="only events since: 15m, 2h, 7d, an ISO time or epoch ms")
    report.add_argument("--output", type=Path, default=Path("audit-report"),
                        help="report directory (./audit-report)")
    report.add_argument("--burst-threshold", type=_positive, default=5,
                        help="failed logins from one source that make a burst (5)")
    report.add_argument("--burst-window", type=_positive, default=60,
                        help="within this many seconds (60)")
    report.add_argument("--top", type=_positive, default=10, help="rows of the top lists (10)")
    report.add_argument("--master", help="Spark master (default $SPARK_MASTER or local[*])")
    security = report.add_argument_group("security")
    security.add_argument("--security-protocol",
                          help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    security.add_argument("--sasl-username", help="SASL/PLAIN username")
    security.add_argument("--sasl-password", help="SASL/PLAIN password (e.g. token:...)")
    security.add_argument("--oauth-issuer-url", help="OAUTHBEARER: the issuer")
    security.add_argument("--oauth-credentials-url", help="OAUTHBEARER: client credentials URL")
    security.add_argument("--oauth-audience", help="OAUTHBEARER: audience to ask for")
    security.add_argument("--oauth-scope", help="OAUTHBEARER: scope to ask for")
    security.add_argument("--option", type=_key_value, action="append", default=[],
                          metavar="KEY=VALUE", help="any edgekafka option, repeatable")
    stream = report.add_argument_group("streaming")
    stream.add_argument("--stream", action="store_true",
                        help="run continuously and publish burst alerts")
    stream.add_argument("--alerts-topic", default=ALERTS_TOPIC,
                        help=f"where alerts go ({ALERTS_TOPIC}; created if missing)")
    stream.add_argument("--checkpoint", type=Path,
                        help="checkpoint directory (OUTPUT/alerts-checkpoint)")
    stream.add_argument("--starting-offsets", choices=("earliest", "latest"), default="latest",
                        help="where a new stream starts without --since (latest)")
    stream.add_argument("--trigger-seconds", type=float, default=5.0,
                        help="micro-batch interval (5)")
    stream.add_argument("--run-seconds", type=float,
                        help="stop after this long (default: until interrupted)")
    return parser


def source_options(args: argparse.Namespace) -> dict[str, str]:
    """``edgekafka`` options from the security flags and ``--option``."""
    options: dict[str, str] = {}
    for flag, key in (("security_protocol", "kafka.security.protocol"),
                      ("sasl_username", "kafka.sasl.username"),
                      ("sasl_password", "kafka.sasl.password"),
                      ("oauth_issuer_url", "oauth.issuerUrl"),
                      ("oauth_credentials_url", "oauth.credentialsUrl"),
                      ("oauth_audience", "oauth.audience"),
                      ("oauth_scope", "oauth.scope")):
        value = getattr(args, flag)
        if value:
            options[key] = value
    options.update(dict(args.option))
    return options


def _stream(args: argparse.Namespace, rule: BurstRule, options: dict[str, str]) -> int:
    from pipeline.spark_session import spark_session

    if args.since is not None:
        options = {"startingTimestamp": str(args.since), **options}
    settings = AlertSettings(
        bootstrap=args.bootstrap,
        checkpoint=(args.checkpoint or args.output / "alerts-checkpoint").resolve(),
        topic=args.topic, alerts_topic=args.alerts_topic, rule=rule,
        starting_offsets=args.starting_offsets, trigger_seconds=args.trigger_seconds,
        options=options)
    spark = spark_session(args.master, config=SPARK_CONFIG)
    spark.sparkContext.setLogLevel("WARN")

    def show(values: list[str]) -> None:
        for value in values:
            print("ALERT", value, flush=True)

    with StopSignals() as stop:
        query = start_alerts(spark, settings, show)
        print(f"watching {args.topic}; alerts go to {args.alerts_topic} (Ctrl-C stops)",
              flush=True)
        try:
            _await(query, args.run_seconds, stop)
        finally:
            _stop_between_triggers(query)
    if stop.signum is not None:
        print(f"stopped by {signal.Signals(stop.signum).name}; the checkpoint "
              f"{settings.checkpoint} resumes the stream", flush=True)
        return 128 + stop.signum
    return 0


def _await(query: StreamingQuery, run_seconds: float | None, stop: StopSignals) -> None:
    """Wait until the query ends, ``run_seconds`` pass or a stop signal arrives; the
    wait is cut into short calls, so a signal never lands inside a call to Spark."""
    deadline = None if run_seconds is None else time.monotonic() + run_seconds
    while stop.signum is None and query.isActive:
        if deadline is not None and time.monotonic() >= deadline:
            return
        if query.awaitTermination(1):
            return


def _stop_between_triggers(query: StreamingQuery) -> None:
    """Stop ``query`` once its sources are up and no trigger runs (or after
    :data:`STOP_SETTLE_S`), so that the stop ends the stream reader's Python process
    quietly.

    Spark serves the ``edgekafka`` stream reader from a Python process of its own
    (PySpark's ``python_streaming_source_runner``, a simple worker of the JVM: it ignores
    SIGINT like the JVM, whatever its process group), over a socket channel.
    ``StreamingQuery.stop`` interrupts the query's thread, and an interrupt that finds that
    thread talking to the process closes the channel (Java's interruptible channels).
    While the query initialises its sources, which it does after ``start()`` returns (a
    Ctrl-C right after "watching" lands there), that process is not yet one of the
    query's sources, so the stop never kills it: it answers into the closed socket, reads
    EOF, fails to report the ``EOFError`` (``BrokenPipeError``) and prints both as a
    traceback on its stderr, which the JVM copies to the terminal. During a trigger it
    races the stop's SIGTERM to do the same. Between triggers the query's thread only
    sleeps, and the stop's SIGTERM ends the process while it waits for its next call."""
    deadline = time.monotonic() + STOP_SETTLE_S
    while query.isActive and time.monotonic() < deadline:
        if query.lastProgress is not None and not query.status["isTriggerActive"]:
            break
        time.sleep(STOP_POLL_S)
    query.stop()


class StopSignals:
    """While entered (in the main thread), SIGINT and SIGTERM only note the signal: a
    Ctrl-C then stops the stream between calls to Spark, instead of PySpark's handler
    raising KeyboardInterrupt inside one (which dumps py4j and Java tracebacks).
    ``on_stop`` runs in a thread of its own at the first signal."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_stop: Callable[[], None] | None = None) -> None:
        self.signum: int | None = None
        self._previous: dict[int, SignalHandler] = {}
        self._on_stop = on_stop

    def _note(self, signum: int, _frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = signum
        if first and self._on_stop is not None:
            threading.Thread(target=self._on_stop, name="stop-spark", daemon=True).start()

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def reinstall(self) -> None:
        """Take the signals back (a new SparkContext sets its own SIGINT handler, which
        raises KeyboardInterrupt inside a call to Spark)."""
        for signum in self._previous:
            signal.signal(signum, self._note)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _cancel_jobs_until(done: threading.Event) -> Callable[[], None]:
    """A stop action: silence Spark's log (its tasks and writers report their cancellation
    as warnings and errors with Java stack traces) and the JVM's standard error (a
    cancelled job's futures completing while the JVM shuts Spark's thread pools down print
    ``RejectedExecutionException`` traces there, past any logger), then cancel every Spark
    job, again every :data:`CANCEL_EVERY_S` (a job the driver starts meanwhile too), until
    ``done`` is set."""
    def cancel() -> None:
        from pyspark import SparkContext

        silenced = False
        while not done.is_set():
            context = SparkContext._active_spark_context
            if context is not None:
                with suppress(Exception):  # the context is starting or going away
                    if not silenced:
                        context.setLogLevel("OFF")
                        jvm = context._jvm
                        if jvm is not None:
                            java = jvm.java
                            java.lang.System.setErr(
                                java.io.PrintStream(java.io.OutputStream.nullOutputStream()))
                        silenced = True
                    context.cancelAllJobs()
            done.wait(CANCEL_EVERY_S)
    return cancel


def _report(args: argparse.Namespace, rule: BurstRule, options: dict[str, str]) -> int:
    """The one-off report; a Ctrl-C (or SIGTERM) cancels its Spark jobs and ends it with
    one line and exit 128 + the signal's number, no report printed."""
    from pipeline.spark_session import spark_session

    done = threading.Event()
    with StopSignals(on_stop=_cancel_jobs_until(done)) as stop:
        try:
            spark: SparkSession = spark_session(args.master, config=SPARK_CONFIG)
            stop.reinstall()
            if stop.signum is None:
                spark.sparkContext.setLogLevel("WARN")
                report = run_report(spark, ReportSettings(
                    bootstrap=args.bootstrap, topic=args.topic, since_ms=args.since,
                    output=args.output.resolve(), rule=rule, top=args.top, options=options))
        except KeyboardInterrupt:  # from SparkContext's handler, before reinstall()
            stop.signum = stop.signum or signal.SIGINT
        except Exception:
            if stop.signum is None:
                raise
        finally:
            done.set()
    if stop.signum is not None:
        print(f"audit-report: stopped by {signal.Signals(stop.signum).name}", file=sys.stderr,
              flush=True)
        return 128 + stop.signum
    print(report.text())
    print(f"\nParquet tables and {report.chart.name} written to {report.output}")
    return 0


def audit_report(args: argparse.Namespace) -> int:
    """Run the ``audit-report`` command."""
    rule = BurstRule(threshold=args.burst_threshold, window_seconds=args.burst_window)
    options = source_options(args)
    if args.stream:
        return _stream(args, rule, options)
    return _report(args, rule, options)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``edge-broker-pipeline``."""
    args = build_parser().parse_args(argv)
    if args.command == "audit-report":
        return audit_report(args)
    return 2  # pragma: no cover (argparse requires a command)


if __name__ == "__main__":
    sys.exit(main())
