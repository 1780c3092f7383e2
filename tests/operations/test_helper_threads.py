"""The helper threads of a running broker give way to its event loop thread
(``edge.helper_threads``): once a login has run, the log writer and the SASL steps' thread
are ``SCHED_BATCH`` while the event loop thread keeps the default policy."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edge.helper_threads import give_way_to_the_loop
from tests.broker_process import BrokerProcess
from tests.security_helpers import NONE, SecureConnection, TokenIssuer

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"),
                                reason="Linux scheduling policies")


def test_the_calling_thread_is_put_in_sched_batch() -> None:
    def work() -> tuple[bool, int]:
        return give_way_to_the_loop(), os.sched_getscheduler(0)

    with ThreadPoolExecutor(1) as fresh:  # a thread of its own, this one left as it is
        assert fresh.submit(work).result(60) == (True, os.SCHED_BATCH)
    assert os.sched_getscheduler(0) != os.SCHED_BATCH  # this thread is left as it was


def test_a_running_brokers_log_writer_and_sasl_steps_give_way_to_its_loop(
        tmp_path: Path) -> None:
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    broker = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", **issuer.settings}).start(timeout=60)
    try:
        conn = SecureConnection(broker.port, timeout=60)
        try:
            assert conn.attempt_login("acme", issuer.token()).error_code == NONE
        finally:
            conn.close()
        pid = broker.proc.pid if broker.proc is not None else 0
        policies = {int(tid): os.sched_getscheduler(int(tid))
                    for tid in os.listdir(f"/proc/{pid}/task")}
        assert policies[pid] == os.SCHED_OTHER  # the main thread: the event loop
        # the log writer and the SASL step's thread (the executor starts one per step
        # while none is idle: one here)
        assert sum(policy == os.SCHED_BATCH for policy in policies.values()) >= 2, policies
    finally:
        broker.stop()
