"""A Kafka Connect distributed worker (``ConnectDistributed``, a JVM) for tests: its
worker properties (the README's example with the test's broker, group and timings), its
start on a REST port the JVM picks, and the REST calls a test makes."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from common.json_types import JsonObject, JsonValue, json_field
from tests.broker_process import REPO, ChildProcess
from tests.java_client import JAVA, SHORT_LIVED_JVM, jdk_tool

MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectDistributed"
LOG_CONFIG = JAVA / "connect-log4j2.properties"
README_EXAMPLE = re.compile(r"<!-- example:connect-worker -->\n```properties\n(.*?)```", re.S)

TEST_SETTINGS = {
    # the FileStream connectors have ServiceLoader manifests: no scan of every class
    "plugin.discovery": "service_load",
    # offsets of source tasks and sink consumers committed twice a second
    "offset.flush.interval.ms": "500",
    # a worker or a sink's consumer killed with -9 leaves its group after 6 s, the broker's
    # groupMinSessionTimeoutMs (the defaults are 10 s and 45 s)
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "1000",
    "consumer.session.timeout.ms": "6000",
    "consumer.heartbeat.interval.ms": "1000",
    # the connectors and tasks of a departed worker are assigned again after 1 s (5 min)
    "scheduled.rebalance.max.delay.ms": "1000",
    # a source task killed with -9 in a transaction holds a restarted exactly-once worker
    # until the broker aborts it: its worker reads the offsets topic read_committed to the
    # end offsets of read_uncommitted, as on Kafka (60 s by default)
    "producer.transaction.timeout.ms": "5000",
}


def readme_worker_properties() -> dict[str, str]:
    """The worker properties of the README's Kafka Connect example."""
    match = README_EXAMPLE.search((REPO / "README.md").read_text())
    assert match, "README has no example connect-worker"
    pairs = (line.split("=", 1) for line in match[1].splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def write_worker_properties(path: Path, bootstrap: str, group: str,
                            exactly_once: bool) -> Path:
    """The README's worker properties for ``bootstrap``, a Connect group ``group`` with
    its own storage topics, a REST port the JVM picks, exactly-once source support on or
    off, and the test's settings; written to ``path``."""
    settings = {
        **readme_worker_properties(),
        "bootstrap.servers": bootstrap,
        "listeners": "http://127.0.0.1:0",
        "group.id": group,
        "config.storage.topic": f"{group}-configs",
        "offset.storage.topic": f"{group}-offsets",
        "status.storage.topic": f"{group}-status",
        "exactly.once.source.support": "enabled" if exactly_once else "disabled",
        **TEST_SETTINGS,
    }
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    return path


@dataclass(frozen=True)
class Placement:
    """Which worker runs a connector and each of its tasks."""

    state: str
    worker: str
    tasks: dict[int, str]
    task_states: tuple[str, ...]


class ConnectWorker(ChildProcess):
    """A ``ConnectDistributed`` JVM with its worker properties; ready once its REST server
    listens (the port it bound is its worker id's)."""

    ready_pattern = re.compile(r"REST server listening at http://127\.0\.0\.1:(\d+)/")
    what = "Kafka Connect worker"

    def __init__(self, classpath: str, properties: Path) -> None:
        super().__init__()
        self.classpath = classpath
        self.properties = properties
        self.port = 0

    def start(self, timeout: float = 120.0) -> ConnectWorker:
        """Start the JVM and wait until its REST server listens."""
        self.spawn([jdk_tool("java"), "-Xmx512m", *SHORT_LIVED_JVM,
                    f"-Dlog4j2.configurationFile={LOG_CONFIG}", "-cp", self.classpath,
                    MAIN_CLASS, str(self.properties)], timeout)
        return self

    def on_ready(self, match: re.Match[str]) -> None:
        self.port = int(match[1])

    @property
    def worker_id(self) -> str:
        """The id the Connect group knows this worker by (its REST host and port)."""
        return f"127.0.0.1:{self.port}"

    def wait_joined(self, timeout: float = 60.0) -> None:
        """Wait until the worker serves its REST resources (they come after the port) and
        has joined its Connect group, once since it started."""
        self.wait_for_log(r"INFO Kafka Connect started", timeout)
        self.wait_for_log(r"Joined group at generation \d+", timeout)

    def request(self, method: str, path: str, body: JsonObject | None = None) -> JsonValue:
        """One REST call; its JSON answer (HTTPError on an error status)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data,
                                         method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
        result: JsonValue = json.loads(text) if text else None
        return result

    def put_connector(self, name: str, config: dict[str, str],
                      timeout: float = 60.0) -> None:
        """Create (or reconfigure) connector ``name``; a 409 (the group is rebalancing, or
        this worker has not caught up with the config topic yet) is tried again."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("PUT", f"/connectors/{name}/config", {**config})
                return
            except urllib.error.HTTPError as error:
                if error.code != 409 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def placements(self) -> dict[str, Placement]:
        """Every connector's state and where it and its tasks run."""
        answer = self.request("GET", "/connectors?expand=status")
        assert isinstance(answer, dict)
        result = {}
        for name, entry in answer.items():
            status = json_field(entry, "status")
            connector = json_field(status, "connector")
            tasks = json_field(status, "tasks")
            assert isinstance(tasks, list)
            result[name] = Placement(
                state=str(json_field(connector, "state")),
                worker=str(json_field(connector, "worker_id")),
                tasks={int(str(json_field(task, "id"))): str(json_field(task, "worker_id"))
                       for task in tasks},
                task_states=tuple(str(json_field(task, "state")) for task in tasks))
        return result
