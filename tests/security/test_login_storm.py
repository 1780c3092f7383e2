"""A login storm behind the login gate (``maxConcurrentLogins``, ``listeners.admission``):
hundreds of simultaneous SASL logins all succeed and are all audited while a logged-in
client's requests keep being answered; a failed login's delay holds no permit; and the
gate's own order (a login under way before new ones, FIFO, cancellation)."""

from __future__ import annotations

import asyncio
import fcntl
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from edge.ready_line import parse_ready
from listeners.admission import LoginGate
from tests.broker_process import REPO, BrokerProcess
from tests.security_helpers import (
    SASL_AUTHENTICATION_FAILED,
    SecureConnection,
    TokenIssuer,
    audit_events,
    plain_message,
)

TENANT = "acme"
_FAILED = r"SASL PLAIN login from \S+ .* failed"
STORM = 300
GATE = 4
LOGINS_BEFORE_STOP = 200


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> TokenIssuer:
    return TokenIssuer("rsa", Path(tmp_path_factory.mktemp("storm-keys")))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           issuer: TokenIssuer) -> Iterator[BrokerProcess]:
    """A SASL listener with a gate of four, a PLAINTEXT one to read the audit topic, and a
    failed login answered after a minute (longer than any client here waits)."""
    started = BrokerProcess(Path(tmp_path_factory.mktemp("storm")), {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "maxConcurrentLogins": str(GATE), "failedAuthenticationDelayMs": "60000",
        **issuer.settings}).start()
    yield started
    started.stop()


def _frame(request: Any, version: int, correlation: int) -> bytes:
    """A request frame with header v1 (the versions used here are not flexible)."""
    client = b"storm"
    body = struct.pack(">hhih", request.API_KEY, version, correlation, len(client)) + client
    body += bytes(request.encode(version=version))
    return struct.pack(">i", len(body)) + body


def login_frames(token: str) -> list[bytes]:
    """ApiVersions v0, SaslHandshake v1 (PLAIN), SaslAuthenticate v1: a client's login."""
    message = plain_message(TENANT, "token:" + token)
    return [_frame(ApiVersionsRequest[0](), 0, 1),
            _frame(SaslHandshakeRequest[1](mechanism="PLAIN"), 1, 2),
            _frame(SaslAuthenticateRequest[1](auth_bytes=message), 1, 3)]


async def _login(port: int, frames: list[bytes]) -> tuple[asyncio.StreamWriter, list[int]]:
    """Log in one step at a time; the open connection and each answer's error code."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    codes = []
    for request in frames:
        writer.write(request)
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        answer = await reader.readexactly(size)
        codes.append(struct.unpack_from(">h", answer, 4)[0])
    return writer, codes


async def _storm(port: int, logins: list[list[bytes]]) -> list[list[int]]:
    """Every login at once; each connection stays open until the last one is in."""
    done = await asyncio.wait_for(asyncio.gather(*(_login(port, f) for f in logins)), 120)
    for writer, _codes in done:
        writer.close()
    return [codes for _writer, codes in done]


class Answered:
    """A logged-in client asking for metadata over and over in a thread, counting answers."""

    def __init__(self, conn: SecureConnection) -> None:
        self.conn = conn
        self.count = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.conn.metadata()
            self.count += 1

    def __enter__(self) -> Answered:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the logged-in client did not stop"


def test_a_storm_of_logins_all_succeed_while_a_logged_in_client_is_answered(
        broker: BrokerProcess, issuer: TokenIssuer) -> None:
    port = broker.ports["SASL_PLAINTEXT"]
    tokens = [issuer.token(f"storm-{n}") for n in range(STORM)]
    client = SecureConnection(port, timeout=60)
    client.login(TENANT, issuer.token("steady"))
    with Answered(client) as steady:
        before = steady.count
        results = asyncio.run(_storm(port, [login_frames(token) for token in tokens]))
        during = steady.count - before
    client.close()
    assert all(codes == [0, 0, 0] for codes in results), [c for c in results if c != [0, 0, 0]]
    # answered between the storm's first connect and its last login (a storm of 300 takes
    # hundreds of ms of the broker's CPU; a metadata round trip a few ms)
    assert during >= 3, during
    logins = {event["principal"] for event in audit_events(broker.bootstrap)
              if event["kind"] == "authentication" and event["outcome"] == "success"}
    assert {f"storm-{n}" for n in range(STORM)} <= logins


def test_a_failed_login_waiting_out_its_delay_holds_no_permit(
        broker: BrokerProcess, issuer: TokenIssuer) -> None:
    """As many failed logins as the gate has permits wait out their minute; a good login
    meanwhile is answered (the delay is the waiting stage, not the dispatch stage: were it
    the dispatch stage, the good login would wait the minute and time out)."""
    port = broker.ports["SASL_PLAINTEXT"]
    failed_before = len(re.findall(_FAILED, broker.log_text()))
    failing = []
    for _ in range(GATE):
        conn = SecureConnection(port, timeout=60)
        assert conn.handshake("PLAIN").error_code == 0
        conn.send_frame(conn.request_bytes(SaslAuthenticateRequest[2](
            auth_bytes=plain_message(TENANT, "token:not-a-token")), 2))
        failing.append(conn)
    deadline = time.monotonic() + 30
    while len(re.findall(_FAILED, broker.log_text())) < failed_before + GATE:
        assert time.monotonic() < deadline, "the failed logins were not checked"
        time.sleep(0.05)
    good = SecureConnection(port, timeout=20)
    good.login(TENANT, issuer.token("after-failures"))
    assert good.metadata().brokers
    good.close()
    for conn in failing:
        conn.close()


def test_failed_logins_are_still_answered_after_the_delay(tmp_path: Path,
                                                          issuer: TokenIssuer) -> None:
    with_delay = BrokerProcess(tmp_path, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "maxConcurrentLogins": "1",
        "failedAuthenticationDelayMs": "200", **issuer.settings}).start()
    try:
        conn = SecureConnection(with_delay.port, timeout=30)
        assert conn.handshake("PLAIN").error_code == 0
        answer = conn.authenticate(plain_message(TENANT, "token:not-a-token"))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        conn.close()
    finally:
        with_delay.stop()


def test_a_log_reader_falling_behind_neither_stops_logins_nor_loses_lines_at_stop(
        tmp_path: Path, issuer: TokenIssuer) -> None:
    """The log is written by a thread (``edge.log_thread``). Here nobody reads the broker's
    stderr (a pipe of one page) during a storm: the logins still complete (the loop does
    not wait for the pipe), and after a SIGTERM right after the storm every login's line
    reaches the log, the queued ones written before the broker exits."""
    args = [sys.executable, "-m", "edge.cli", "--set", f"dataDir={tmp_path}",
            "--set", "kafkaListeners=SASL_PLAINTEXT://127.0.0.1:0",
            *(arg for key, value in issuer.settings.items()
              for arg in ("--set", f"{key}={value}"))]
    proc = subprocess.Popen(args, cwd=REPO, stderr=subprocess.PIPE, text=True,
                            stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    try:
        fcntl.fcntl(proc.stderr.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        head: list[str] = []
        while (ready := parse_ready(line := proc.stderr.readline())) is None:
            assert line, "\n".join(head)
            head.append(line)
        port = ready.listeners[0].port
        tokens = [issuer.token(f"last-{n}") for n in range(LOGINS_BEFORE_STOP)]
        results = asyncio.run(_storm(port, [login_frames(t) for t in tokens]))
        assert all(codes == [0, 0, 0] for codes in results)
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()  # reading again lets the writer thread go on
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    lines = rest.splitlines()
    logged_in = {n for n in range(LOGINS_BEFORE_STOP)
                 if any(f" logged in as last-{n} " in line for line in lines)}
    assert logged_in == set(range(LOGINS_BEFORE_STOP))
    assert "edge-broker stopped" in lines[-1]


# -- the gate itself ---------------------------------------------------------------------

def test_the_gate_serves_logins_under_way_then_new_ones_then_the_rest() -> None:
    async def scenario() -> list[str]:
        gate = LoginGate(2)
        order: list[str] = []
        await gate.enter(0)
        await gate.enter(0)
        assert gate.free == 0

        async def waiter(name: str, served: int) -> None:
            await gate.enter(served)
            order.append(name)

        tasks = [asyncio.create_task(waiter(name, served)) for name, served in
                 (("spamming", 9), ("new-1", 0), ("gone", 0), ("under-way-1", 1),
                  ("new-2", 0), ("under-way-2", 2))]
        await asyncio.sleep(0)
        assert gate.waiting == 6
        tasks[2].cancel()  # a client that went away while waiting
        await asyncio.gather(tasks[2], return_exceptions=True)
        assert gate.waiting == 5
        for _ in range(5):
            gate.leave()
            await asyncio.sleep(0)
        assert gate.free == 0 and gate.waiting == 0
        for _ in range(2):
            gate.leave()
        assert gate.free == 2
        return order

    assert asyncio.run(scenario()) == ["under-way-1", "under-way-2", "new-1", "new-2",
                                       "spamming"]


def test_a_permit_handed_to_a_cancelled_waiter_is_passed_on() -> None:
    async def scenario() -> bool:
        gate = LoginGate(1)
        await gate.enter(0)
        first = asyncio.create_task(gate.enter(0))
        second = asyncio.create_task(gate.enter(0))
        await asyncio.sleep(0)
        gate.leave()  # hands the permit to ``first``...
        first.cancel()  # ...which is cancelled before it runs
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(second, 5)
        return gate.free == 0 and gate.waiting == 0

    assert asyncio.run(scenario())
