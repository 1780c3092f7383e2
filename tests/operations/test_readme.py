"""The README's promises: `make run` serves on 127.0.0.1:9092 and the quick-start snippet works
as printed (and again when run twice), also against the cluster and brokers the README starts;
the configuration table and the topic config table are the ones the code generates, the
protocol table lists what ApiVersions answers, the admin CLI's synopsis every verb and flag
of its parser, and the PostgreSQL connections per broker are the pool's."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_core.producer_states import (
    SNAPSHOT_EVERY_BYTES,
    SNAPSHOT_EVERY_RECORDS,
    SNAPSHOT_MAX_AGE_S,
)
from broker_core.storage.pg_database import POOL_SIZE
from edge.admin.commands import add_admin_arguments
from edge.config import config_reference_markdown, topic_config_reference_markdown
from tests.broker_process import REPO, BrokerProcess
from tests.clients import consume_confluent
from tests.ports import free_port
from tests.postgres_server import shared_server
from tests.raw import RawConnection

README = (REPO / "README.md").read_text()


def example(name: str) -> str:
    """The Python block after ``<!-- example:NAME -->`` in the README."""
    match = re.search(rf"<!-- example:{name} -->\n```python\n(.*?)```", README, re.S)
    assert match, f"README has no example {name!r}"
    return match[1]


def run_example(name: str, cwd: Path) -> list[str]:
    result = subprocess.run([sys.executable, "-c", example(name)], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None
    assert README.index(first_block[0]) < README.index("## ")
    commands = [line.split("#")[0].strip() for line in first_block[1].splitlines()]
    assert commands == ["make run", "make test"]


def test_config_table_matches_the_code() -> None:
    match = re.search(r"<!-- config-table -->\n(.*?)<!-- /config-table -->", README, re.S)
    assert match is not None
    assert match[1].strip() == config_reference_markdown().strip()


def test_topic_config_table_matches_the_code() -> None:
    match = re.search(r"<!-- topic-config-table -->\n(.*?)<!-- /topic-config-table -->",
                      README, re.S)
    assert match is not None
    assert match[1].strip() == topic_config_reference_markdown().strip()


def test_make_run_then_quickstart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"ARGS=--set dataDir={data}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    assert make.stdout is not None
    try:
        deadline = time.monotonic() + 300
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = make.stdout.readline()
            assert line, "make run exited:\n" + "".join(seen)
            seen.append(line)
            if "edge-broker ready" in line:
                break
        assert "PLAINTEXT://127.0.0.1:9092" in seen[-1]
        rows = [line.split(" ", 2) for line in run_example("quickstart", tmp_path)]
        assert len(rows) == 10
        for partition in range(3):
            offsets = [int(r[1]) for r in rows if int(r[0]) == partition]
            assert offsets == list(range(len(offsets)))
        assert sorted(r[2] for r in rows) == sorted(f"hello {i}" for i in range(10))
        assert (data / "meta.properties").exists()
        grouped = run_example("groups", tmp_path)
        assert sorted(line.split(" ", 2)[2] for line in grouped[:-1]) == \
            sorted(f"hello {i}" for i in range(10))
        assert grouped[-1].startswith("committed") and "offset=" in grouped[-1]
        assert run_example("transactions", tmp_path) == ["True False"]
        assert run_example("alter-configs", tmp_path) == ["3600000"]
        # Run twice, the quick start finds its topic there and reads only its own records,
        # at the offsets after everything written so far.
        again = [line.split(" ", 2) for line in run_example("quickstart", tmp_path)]
        assert sorted(r[2] for r in again) == sorted(f"hello {i}" for i in range(10))
        for partition in range(3):
            before = max(int(r[1]) for r in rows if int(r[0]) == partition)
            offsets = [int(r[1]) for r in again if int(r[0]) == partition]
            assert offsets[0] > before
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        make.wait(30)


def shell_example(name: str) -> str:
    """The shell block after ``<!-- example:NAME -->``, run with this interpreter."""
    match = re.search(rf"<!-- example:{name} -->\n```sh\n(.*?)```", README, re.S)
    assert match, f"README has no shell example {name!r}"
    return match[1].replace(".venv/bin/edge-broker", f"{sys.executable} -m edge.cli")


def test_secure_broker_examples(tmp_path: Path) -> None:
    made = subprocess.run(["bash", "-c", shell_example("certs")], cwd=tmp_path, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == ["wrote", "certs/ca.pem", "wrote", "certs/server.pem",
                                   "wrote", "certs/server.key"]
    broker = subprocess.Popen(
        ["bash", "-c", "exec " + shell_example("secure-broker")], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    assert broker.stdout is not None
    try:
        seen: list[str] = []
        while True:
            line = broker.stdout.readline()
            assert line, "the secured broker exited:\n" + "".join(seen)
            seen.append(line)
            if "edge-broker ready" in line:
                break
        assert "SASL_SSL://127.0.0.1:9095" in line
        assert run_example("tokens-and-acls", tmp_path) == [
            "bob read order-1", "bob wrote: TOPIC_AUTHORIZATION_FAILED"]
        assert run_example("tls-client", tmp_path) == ["['orders']"]
        assert (tmp_path / "data-secure" / "acls.json").exists()
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        broker.wait(30)


def _start_shell_example(name: str, cwd: Path) -> subprocess.Popen[str]:
    """Run a README shell example that starts a broker; return once it is ready."""
    return _start_command(shell_example(name), name, cwd)


def _start_command(command: str, name: str, cwd: Path) -> subprocess.Popen[str]:
    """Run the shell ``command`` of example ``name``; return once its broker is ready."""
    broker = subprocess.Popen(
        ["bash", "-c", "exec " + command], cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    assert broker.stdout is not None
    seen: list[str] = []
    while True:
        line = broker.stdout.readline()
        if not line:
            broker.wait(30)
            raise AssertionError(f"example {name!r} exited:\n" + "".join(seen))
        seen.append(line)
        if "edge-broker ready" in line:
            return broker


def test_memory_broker_example_serves_the_quickstart_and_keeps_nothing(tmp_path: Path) -> None:
    quickstart = example("quickstart").replace("127.0.0.1:9092", "127.0.0.1:19096")
    for run in range(2):
        broker = _start_shell_example("memory-broker", tmp_path)
        try:
            result = subprocess.run([sys.executable, "-c", quickstart], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            rows = [line.split(" ", 2) for line in result.stdout.splitlines()]
            # a second broker starts empty: the same ten records at the same offsets again
            assert sorted((int(r[0]), int(r[1])) for r in rows) == sorted(
                (i % 3, i // 3) for i in range(10)), f"run {run}"
        finally:
            os.killpg(broker.pid, signal.SIGTERM)
            assert broker.wait(30) == 0
        assert list(tmp_path.iterdir()) == []  # no data directory, no file at all


def test_postgres_broker_example_keeps_the_quickstart_across_a_restart(tmp_path: Path) -> None:
    command = shell_example("postgres-broker")
    url = "postgres://edge@127.0.0.1:5432/edge"
    assert url in command
    command = command.replace(url, shared_server().new_database_url())
    quickstart = example("quickstart").replace("127.0.0.1:9092", "127.0.0.1:19097")
    expected = sorted((i % 3, i // 3, f"hello {i}") for i in range(10))
    for run in range(2):
        broker = _start_command(command, "postgres-broker", tmp_path)
        try:
            if run == 0:
                result = subprocess.run([sys.executable, "-c", quickstart], cwd=tmp_path,
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, result.stderr
            got = consume_confluent("127.0.0.1:19097", "quickstart", 10, partitions=3)
            assert sorted((g.partition, g.offset, (g.rec.value or b"").decode())
                          for g in got) == expected, f"run {run}"
        finally:
            os.killpg(broker.pid, signal.SIGTERM)
            assert broker.wait(30) == 0
    assert list(tmp_path.iterdir()) == []  # everything is in PostgreSQL


def test_cluster_example_serves_the_quickstart_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = tmp_path / "cluster.log"
    with log.open("w") as stderr:
        cluster = subprocess.Popen(
            ["bash", "-c", "exec " + shell_example("cluster")], cwd=run,
            stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    assert cluster.stdout is not None
    try:
        bootstrap = cluster.stdout.readline().strip()
        assert bootstrap == "127.0.0.1:19100,127.0.0.1:19101,127.0.0.1:19102", log.read_text()
        quickstart = example("quickstart").replace("127.0.0.1:9092", "127.0.0.1:19100")
        result = subprocess.run([sys.executable, "-c", quickstart], cwd=run,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        rows = [line.split(" ", 2) for line in result.stdout.splitlines()]
        assert sorted((int(r[0]), int(r[1]), r[2]) for r in rows) == sorted(
            (i % 3, i // 3, f"hello {i}") for i in range(10))
        os.killpg(cluster.pid, signal.SIGINT)  # Ctrl-C
        assert cluster.wait(60) == 0, log.read_text()
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait(30)
    assert log.read_text().splitlines()[-1] == "edge-broker cluster: stopped"
    assert list(run.iterdir()) == []  # everything was in the throwaway PostgreSQL


def test_cluster_broker_example_reaches_the_primary_of_a_multi_host_url(tmp_path: Path) -> None:
    command = shell_example("postgres-cluster-broker")
    server = shared_server()
    url = server.new_database_url()
    database = url.rsplit("/", 1)[1]
    for written, real in (("pg1:5432", f"127.0.0.1:{free_port()}"),  # down: skipped
                          ("pg2:5432", f"127.0.0.1:{server.port}"),
                          ("/edge?", f"/{database}?")):
        assert written in command
        command = command.replace(written, real)
    broker = _start_command(command, "postgres-cluster-broker", tmp_path)
    try:
        quickstart = example("quickstart").replace("127.0.0.1:9092", "127.0.0.1:19098")
        result = subprocess.run([sys.executable, "-c", quickstart], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.splitlines()) == 10
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        assert broker.wait(30) == 0
    with psycopg.connect(url) as conn:  # the records went to the database that answered
        assert conn.execute("SELECT count(*) FROM edge_entries").fetchone() != (0,)


def test_quota_examples_hold_a_producer_back(tmp_path: Path) -> None:
    broker = _start_shell_example("quota-broker", tmp_path)
    try:
        assert run_example("quota-producer", tmp_path) == ["throttled: True"]
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        assert broker.wait(30) == 0


def test_mutation_quota_examples_refuse_a_fourth_topic_then_take_it(tmp_path: Path) -> None:
    broker = _start_shell_example("mutation-broker", tmp_path)
    try:
        assert run_example("mutation-admin", tmp_path) == ["[0, 0, 0, 89]", "[0]"]
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        assert broker.wait(30) == 0


def test_admin_cli_and_health_examples(tmp_path: Path) -> None:
    broker = _start_shell_example("ops-broker", tmp_path)
    try:
        ran = subprocess.run(["bash", "-c", shell_example("admin-cli")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        assert ran.returncode == 0, ran.stderr
        out = ran.stdout
        assert out.startswith("NAME    RESULT\norders  NONE\n")
        assert "PARTITION  OFFSET\n0          0\n0          1\n0          2\n" in out
        assert '"value": "first"' in out and '"value": "second"' not in out
        assert "START_OFFSET  END_OFFSET" in out and "retention.ms" in out
        assert "orders  TOPIC_ALREADY_EXISTS" in out and "exit 1" in out
        assert "127.0.0.1  19110" in out
        assert out.endswith("ready\n")
        assert "edge-broker admin topics create: " not in ran.stderr  # a refusal in the table
    finally:
        os.killpg(broker.pid, signal.SIGTERM)
        assert broker.wait(30) == 0


def test_protocol_table_lists_what_api_versions_answers(tmp_path: Path) -> None:
    section = README.split("## Protocol support", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, tuple[int, int]] = {}
    dash = "\N{EN DASH}"
    for names, versions in re.findall(rf"^\| ([A-Z][\w, ]+) \| ([\d{dash}]+) \|$", section,
                                      re.M):
        low, _, high = versions.partition(dash)
        for name in names.split(", "):
            listed[name] = (int(low), int(high or low))
    broker = BrokerProcess(tmp_path, {"storageUrl": "memory://"}).start()
    try:
        conn = RawConnection(broker.port)
        answer = conn.call(ApiVersionsRequest[3](client_software_name="readme",
                                                 client_software_version="1"),
                           3, ApiVersionsResponse)
        conn.close()
    finally:
        broker.stop()
    served = {ApiKey(api.api_key).name: (api.min_version, api.max_version)
              for api in answer.api_keys}
    assert listed == served


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands of ``parser`` by name (none: empty)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options_in(block: str, parser: argparse.ArgumentParser, where: str) -> None:
    """Every option of ``parser`` is in ``block``, a choice-taking one with its choices."""
    flat = re.sub(r"\s*\|\s*", "|", block)
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            assert re.search(rf"{flag}\b(?!-)", block), f"{where}: {flag} not in the synopsis"
            if action.choices is not None:
                listed = re.search(rf"{flag} ([\w-]+(?:\|[\w-]+)+)", flat)
                assert listed, f"{where}: {flag} without its choices"
                assert set(listed[1].split("|")) == set(action.choices), (where, flag)


def test_admin_cli_synopsis_lists_every_verb_and_flag() -> None:
    synopsis = README.split("```\nedge-broker admin ", 1)[1].split("```", 1)[0]
    parser = argparse.ArgumentParser()
    add_admin_arguments(parser)
    head, _, body = synopsis.partition(" GROUP VERB ...\n")
    _options_in(head, parser, "admin")
    blocks = dict(re.findall(r"^  ([a-z]+) +(.*?)(?=^  [a-z]|\Z)", body, re.M | re.S))
    groups = _subparsers(parser)
    assert list(blocks) == list(groups)
    for name, group in groups.items():
        verbs = _subparsers(group)
        for verb in verbs:
            assert re.search(rf"(^|\| |\|){verb}\b(?!-)", blocks[name].lstrip(), re.M), \
                f"{name} {verb} not in the synopsis"
        for verb_name, verb_parser in (verbs or {"": group}).items():
            _options_in(blocks[name], verb_parser, f"{name} {verb_name}".strip())


def test_postgres_connection_budget_is_the_pools() -> None:
    """The ``max_connections`` a broker needs: its pool and the notification connection."""
    match = re.search(r"pool of up to (\d+) connections and one more that listens.*?"
                      r"must cover (\d+) per broker", README, re.S)
    assert match, "the README no longer states the connections per broker"
    assert (int(match[1]), int(match[2])) == (POOL_SIZE, POOL_SIZE + 1)


def test_producer_snapshot_triggers_are_the_codes() -> None:
    match = re.search(r"moved on by ([\d,]+) offsets or (\d+) MiB of log, or (\d+) seconds",
                      README)
    assert match, "the README no longer says when producer state is snapshotted"
    assert (int(match[1].replace(",", "")), int(match[2]) << 20, float(match[3])) == (
        SNAPSHOT_EVERY_RECORDS, SNAPSHOT_EVERY_BYTES, SNAPSHOT_MAX_AGE_S)


def _packages_make_installs(path: str) -> list[str]:
    """The Debian packages ``make deps-debian`` checks for, with ``path`` as PATH."""
    dry = subprocess.run(["make", "--no-print-directory", "-n", "deps-debian"], cwd=REPO,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": path})
    assert dry.returncode == 0, dry.stderr
    match = re.search(r"for pkg in (.*?); do", dry.stdout)
    assert match, dry.stdout
    return match[1].split()


def test_make_installs_what_a_bare_debian_needs(tmp_path: Path) -> None:
    """A fresh Debian has neither the venv module the Makefile's ``python3 -m venv`` needs
    nor curl, which the README uses; Debian 13 has no openjdk-17, whose place Debian's
    default JDK takes where openjdk-17 is not installed already."""
    here = _packages_make_installs(os.environ["PATH"])
    assert {"python3", "python3-venv", "curl", "gcc", "libc6-dev", "postgresql"} <= set(here)
    assert {"openjdk-17-jdk-headless", "default-jdk-headless"} & set(here)
    # a machine where dpkg knows of no openjdk-17 (a fresh Debian 13)
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")
    (bare / "dpkg-query").chmod(0o755)
    fresh = _packages_make_installs(f"{bare}:{os.environ['PATH']}")
    assert "default-jdk-headless" in fresh and "openjdk-17-jdk-headless" not in fresh
