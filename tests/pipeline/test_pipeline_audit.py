"""Pipeline acceptance 5 and the README's Spark examples: the audit job, fed by real failed
and successful logins, denials and a rejected connection against a broker with a
SASL_PLAINTEXT listener, reports the right counts and flags the password-guessing burst;
the streaming job publishes alerts; SASL/PLAIN options reach the source."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import jwt
import pytest
from pyspark.sql import SparkSession

from pipeline import cli
from pipeline.audit.analysis import BurstRule, bursts
from pipeline.audit.events import parse_events
from pipeline.audit.report import NO_EVENTS, ReportSettings, read_events, run_report
from tests.broker_process import REPO, BrokerProcess
from tests.clients import create_topic, present
from tests.pipeline_helpers import LoginFrom, consume, make_spark

pytestmark = pytest.mark.long_running(minutes=8)


SECRET = b"pipeline-audit-secret-of-32bytes"
README = (REPO / "README.md").read_text()
BURST_HOST, QUIET_HOST, LATE_HOST = "127.0.0.1", "127.0.0.2", "127.0.0.3"


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    yield from make_spark()


@pytest.fixture(scope="module")
def audit_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path_factory.mktemp("audit-broker"), {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0",
    }).start()
    yield broker
    broker.stop()


def plain(broker: BrokerProcess) -> str:
    return f"127.0.0.1:{broker.ports['PLAINTEXT']}"


def token(sub: str) -> str:
    return "token:" + jwt.encode({"sub": sub, "exp": int(time.time()) + 3600}, SECRET,
                                 algorithm="HS256")


def audit_count(bootstrap: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        _low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition("public/__kafka/__audit", 0), 10)
        return int(high)
    finally:
        consumer.close()


def guess_passwords(broker: BrokerProcess, source: str, count: int) -> None:
    for _ in range(count):
        LoginFrom(broker.ports["SASL_PLAINTEXT"], source).failed_login("acme", "token:guess")


def wait_for_audit(bootstrap: str, total: int) -> None:
    deadline = time.monotonic() + 20
    while audit_count(bootstrap) < total:
        assert time.monotonic() < deadline, "audit events did not arrive"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def activity(audit_broker: BrokerProcess) -> dict[str, int]:
    """Real logins against the SASL listener: 7 failures from one host (a burst), 3 from
    another, 3 good logins of acme/alice, a login of evil/mallory with 2 denials, and a
    request before login."""
    port = audit_broker.ports["SASL_PLAINTEXT"]
    for name in ("secret-a", "secret-b"):
        create_topic(plain(audit_broker), name, 1)
    guess_passwords(audit_broker, BURST_HOST, 7)
    guess_passwords(audit_broker, QUIET_HOST, 3)
    for _ in range(3):
        conn = LoginFrom(port, BURST_HOST)
        conn.login("acme", token("alice")[len("token:"):])
        conn.close()
    conn = LoginFrom(port, QUIET_HOST)
    conn.login("evil", token("mallory")[len("token:"):])
    assert conn.produce("public/default/secret-a") != 0
    assert conn.produce("public/default/secret-b") != 0
    conn.close()
    conn = LoginFrom(port, QUIET_HOST)
    assert conn.closed_after_request(*metadata_request())
    conn.close()
    wait_for_audit(plain(audit_broker), 17)
    return {"failures": 10, "successes": 4, "denials": 2, "rejected": 1}


def metadata_request() -> tuple[Any, int]:
    from kafka.protocol.metadata import MetadataRequest
    return MetadataRequest[1](topics=None), 1


def test_report_counts_and_flags_the_burst(spark: SparkSession, audit_broker: BrokerProcess,
                                           activity: dict[str, int], tmp_path: Path) -> None:
    report = run_report(spark, ReportSettings(
        bootstrap=plain(audit_broker), output=tmp_path / "report",
        rule=BurstRule(threshold=5, window_seconds=60), since_ms=int(time.time() * 1000)
        - 600_000))
    tenants = {row["tenant"]: row for row in report.tables["tenants"]}
    # Failed logins carry the tenant their username claimed; only the request before
    # login names none.
    assert tenants["-"]["login_failures"] == 0 and tenants["-"]["rejected_connections"] == 1
    assert tenants["acme"]["login_failures"] == 10
    assert tenants["acme"]["logins_ok"] == 3 and tenants["acme"]["denials"] == 0
    assert tenants["evil"]["logins_ok"] == 1 and tenants["evil"]["denials"] == 2
    assert sum(row["events"] for row in tenants.values()) == 17
    principals = {(r["tenant"], r["principal"]): r for r in report.tables["principals"]}
    assert principals["acme", "alice"]["logins_ok"] == 3
    assert principals["evil", "mallory"]["denials"] == 2
    assert report.tables["top_denied_principals"][0] | {"last_denial": None} == {
        "tenant": "evil", "principal": "mallory", "denials": 2, "resources": 2,
        "last_denial": None}
    sources = {row["source"]: row for row in report.tables["top_sources"]}
    assert sources[BURST_HOST]["login_failures"] == 7
    assert sources[QUIET_HOST]["login_failures"] == 3
    assert sources[QUIET_HOST]["denials"] == 2
    assert sources[QUIET_HOST]["rejected_connections"] == 1
    assert report.tables["top_sources"][0]["source"] == BURST_HOST
    assert sum(r["login_failures"] for r in report.tables["failures_per_minute"]) == 10
    [burst] = report.tables["bursts"]
    assert burst["source"] == BURST_HOST and burst["failures"] == 7
    assert burst["listeners"] == ["SASL_PLAINTEXT"]
    for name in report.tables:
        assert list((tmp_path / "report" / name).glob("*.parquet")), name
    assert report.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.text()
    assert "== bursts ==" in text and BURST_HOST in text
    events = read_events(spark, ReportSettings(bootstrap=plain(audit_broker)))
    assert bursts(events, BurstRule(threshold=8, window_seconds=60)).count() == 0


def test_failed_logins_left_out_of_the_audit_are_counted_whole(
        spark: SparkSession, tmp_path: Path) -> None:
    """The broker audits ``auditDenialsPerWindow`` failed logins per host and window and
    one summary event for the rest: the report counted rows, so 40 guesses were 11
    failures and no burst above the cap. The summary carries ``count`` (and the tenant
    the guesses named), and the report sums it; a record without ``count`` (written
    before the field) stands for one event."""
    broker = BrokerProcess(tmp_path / "flood", {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "failedAuthenticationDelayMs": "0", "auditDenialWindowMs": "1000"}).start()
    try:
        guess_passwords(broker, BURST_HOST, 40)
        wait_for_audit(plain(broker), 11)  # 10 events, then one counting 30 at 1 s
        report = run_report(spark, ReportSettings(
            bootstrap=plain(broker), output=tmp_path / "report",
            rule=BurstRule(threshold=20, window_seconds=60),
            since_ms=int(time.time() * 1000) - 600_000))
    finally:
        broker.stop()
    [tenant] = report.tables["tenants"]
    assert (tenant["tenant"], tenant["events"], tenant["login_failures"]) == ("acme", 40, 40)
    [source] = report.tables["top_sources"]
    assert (source["source"], source["login_failures"]) == (BURST_HOST, 40)
    assert sum(r["login_failures"] for r in report.tables["failures_per_minute"]) == 40
    [burst] = report.tables["bursts"]
    assert (burst["source"], burst["failures"]) == (BURST_HOST, 40)
    old = {"kind": "authentication", "outcome": "failure", "listener": "SASL_PLAINTEXT",
           "client": "10.0.0.1:5", "time": 1}
    [row] = parse_events(spark.createDataFrame(
        [(json.dumps(old).encode(), None)], "value binary, timestamp timestamp")).collect()
    assert (row["count"], row["login_failed"]) == (1, 1)


def example(name: str, kind: str) -> str:
    match = re.search(rf"<!-- example:{name} -->\n```{kind}\n(.*?)```", README, re.S)
    assert match, f"README has no {kind} example {name!r}"
    return match[1]


def test_readme_spark_quickstart(spark: SparkSession, audit_broker: BrokerProcess,
                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code = example("spark-quickstart", "python").replace("127.0.0.1:9092", plain(audit_broker))
    for run in (1, 2):
        exec(compile(code, "README:spark-quickstart", "exec"), {"__name__": "__main__"})
        printed = capsys.readouterr()
        assert printed.out.splitlines() == [f"batch: {10 * run}", f"stream: {10 * run}"]
        # not a silent minute: a line per finished stage on stderr
        assert re.search(r"^spark: stage \d+ done \(\d+ tasks?(, [\d.]+ s)?\): \S",
                         printed.err, re.M), printed.err


def cli_args(name: str, broker: BrokerProcess) -> list[str]:
    """The README's shell example as ``edge-broker-pipeline`` arguments."""
    words = shlex.split(example(name, "sh").replace("\\\n", " "))
    assert words[0] == ".venv/bin/edge-broker-pipeline"
    return [w.replace("127.0.0.1:9092", plain(broker)) for w in words[1:]]


def test_readme_audit_report(spark: SparkSession, audit_broker: BrokerProcess,
                             activity: dict[str, int], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(cli_args("audit-report", audit_broker)) == 0
    out = capsys.readouterr().out
    bursts = out[out.index("== bursts =="):].splitlines()
    assert re.match(rf"{re.escape(BURST_HOST)}\s+\S+ \S+\s+\S+ \S+\s+7\s+SASL_PLAINTEXT",
                    bursts[3]), bursts
    assert "== tenants ==" in out and "mallory" in out
    assert (tmp_path / "audit-report" / "failures_per_minute.png").exists()
    assert list((tmp_path / "audit-report" / "bursts").glob("*.parquet"))


def test_readme_audit_alerts_stream(spark: SparkSession, audit_broker: BrokerProcess,
                                    activity: dict[str, int], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*cli_args("audit-alerts", audit_broker), "--trigger-seconds", "1"]
    job = threading.Thread(target=cli.main, args=(args,), daemon=True)
    job.start()
    printed: list[str] = []

    def wait_for(source: str) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            printed.extend(capsys.readouterr().out.splitlines())
            found = [json.loads(line[len("ALERT "):]) for line in printed
                     if line.startswith("ALERT ")]
            mine = [a for a in found if a["source"] == source]
            if mine:
                return mine[-1]
            assert job.is_alive(), printed
            time.sleep(0.2)
        raise AssertionError(f"no alert for {source}: {printed}")

    try:
        first = wait_for(BURST_HOST)
        assert first["failures"] >= 5 and first["alert"] == "password-guessing"
        guess_passwords(audit_broker, LATE_HOST, 6)  # a new burst while the job runs
        late = wait_for(LATE_HOST)
        assert late["failures"] >= 5 and late["listeners"] == ["SASL_PLAINTEXT"]
    finally:
        for query in spark.streams.active:
            query.stop()
        job.join(60)
    assert not job.is_alive(), "the streaming job did not stop"
    alerts = [json.loads(line[len("ALERT "):]) for line in printed if line.startswith("ALERT ")]
    assert not [a for a in alerts if a["source"] == QUIET_HOST]
    assert (tmp_path / "audit-alerts-checkpoint" / "offsets").is_dir()
    published = consume(plain(audit_broker), "__audit_alerts", 1, len(alerts), timeout=20)
    assert sorted(json.loads(present(m.value()))["source"] for m in published) == \
        sorted(a["source"] for a in alerts)
    assert all(present(m.key()).decode().startswith(json.loads(present(m.value()))["source"] + "@")
               for m in published)


def test_ctrl_c_stops_the_stream_in_a_few_lines(audit_broker: BrokerProcess,
                                                tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group (the JVM, which PySpark makes ignore it, and
    the Python workers): the job stops its query and exits 130, without tracebacks."""
    job = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "audit-report", "--bootstrap",
         plain(audit_broker), "--stream", "--trigger-seconds", "1", "--output",
         str(tmp_path / "out")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert job.stdout is not None
    try:
        before = []
        for line in job.stdout:
            before.append(line)
            if line.startswith("watching "):
                break
        assert before and before[-1].startswith("watching "), "".join(before)
        assert "(Ctrl-C stops)" in before[-1]
        os.killpg(job.pid, signal.SIGINT)
        after = job.stdout.read()
        assert job.wait(120) == 130, after
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    assert "Traceback" not in after, after
    assert len(after.splitlines()) <= 15, after  # it was some 120 lines of Java and py4j
    assert "stopped by SIGINT" in after


@pytest.mark.parametrize("moment", ["spark: starting Spark", "spark: stage "])
def test_ctrl_c_stops_the_one_off_report_in_one_line(audit_broker: BrokerProcess,
                                                     tmp_path: Path, moment: str) -> None:
    """Ctrl-C to the whole process group of the one-off report, while Spark starts or
    while a job runs: the driver cancels its jobs (the Python workers, in their own
    process group, are not interrupted mid-task) and exits 130 with one line."""
    job = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "audit-report", "--bootstrap",
         plain(audit_broker), "--output", str(tmp_path / "out")],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert job.stdout is not None
    try:
        before = []
        for line in job.stdout:
            before.append(line)
            if line.startswith(moment):
                break
        assert before and before[-1].startswith(moment), "".join(before)
        os.killpg(job.pid, signal.SIGINT)
        after = job.stdout.read()
        assert job.wait(120) == 130, "".join(before) + after
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    assert "Traceback" not in after and "Exception" not in after, after
    assert " ERROR " not in after and "written to" not in after, after
    # the one line, last; before it at most Spark's start-up notes (a signal while the
    # JVM starts) and stage lines
    assert after.splitlines()[-1] == "audit-report: stopped by SIGINT", after
    assert len(after.splitlines()) <= 15, after


def test_a_report_without_events_says_where_they_come_from(
        spark: SparkSession, tmp_path: Path) -> None:
    """A broker with only a PLAINTEXT listener, as in the quick start, writes no audit
    events: the report says so instead of only printing empty tables."""
    broker = BrokerProcess(tmp_path / "quiet", {}).start()
    try:
        create_topic(broker.bootstrap, "busy", 1)  # traffic, but no login
        report = run_report(spark, ReportSettings(bootstrap=broker.bootstrap,
                                                  output=tmp_path / "report"))
    finally:
        broker.stop()
    assert report.events == 0
    assert report.text().endswith(NO_EVENTS)
    assert "where logins happen" in NO_EVENTS


def test_cli_entry_point() -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "audit-report", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--burst-threshold" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "pipeline.cli", "audit-report",
                          "--bootstrap", "x", "--since", "yesterday"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--since takes" in bad.stderr


def test_sasl_plain_options(spark: SparkSession, audit_broker: BrokerProcess) -> None:
    sasl = f"127.0.0.1:{audit_broker.ports['SASL_PLAINTEXT']}"
    options = {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.username": "acme",
               "kafka.sasl.password": token("alice")}
    frame = spark.createDataFrame([(f"order-{i}",) for i in range(4)], "value string")
    (frame.write.format("edgekafka").mode("append").options(**options)
     .option("kafka.bootstrap.servers", sasl).option("topic", "orders").save())
    rows = (spark.read.format("edgekafka").options(**options)
            .option("kafka.bootstrap.servers", sasl).option("subscribe", "orders").load()
            .collect())
    assert sorted(r.value for r in rows) == [f"order-{i}".encode() for i in range(4)]
    assert {r.topic for r in rows} == {"orders"}
