"""``eventLoopSliceUs`` (``edge.cpu_slice``): the event loop thread of a running broker
has the slice asked for (none by default: 0 leaves the thread as it was), a thread under
another policy is left alone, and a slice below the kernel's least is raised to it (the
key's bounds are among tests/operations/test_config.py's invalid cases)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from edge import cpu_slice
from tests.broker_process import BrokerProcess

_T = TypeVar("_T")


def _kernel_takes_slices() -> bool:
    """Linux 6.12 or later on a machine whose system call numbers the module knows."""
    if not sys.platform.startswith("linux") or cpu_slice.read() is None:
        return False
    release = os.uname().release.split("-")[0].split(".")
    try:
        return (int(release[0]), int(release[1])) >= (6, 12)
    except (IndexError, ValueError):
        return False


needs_slices = pytest.mark.skipif(not _kernel_takes_slices(),
                                  reason="needs Linux 6.12 on (custom slices of fair threads)")


def _on_thread(work: Callable[[], _T]) -> _T:
    """Run ``work`` on a fresh thread (so this test process's own thread keeps its
    attributes) and return what it gave."""
    results: list[_T] = []
    thread = threading.Thread(target=lambda: results.append(work()))
    thread.start()
    thread.join(60)
    assert results, "the thread did not finish"
    return results[0]


def _runtime() -> int:
    attr = cpu_slice.read()
    assert attr is not None
    return int(attr.sched_runtime)


def test_zero_asks_for_nothing() -> None:
    def work() -> tuple[int | None, int, int]:
        before = _runtime()
        return cpu_slice.apply(0), before, _runtime()

    applied, before, after = _on_thread(work)
    assert applied is None
    assert after == before


@needs_slices
def test_the_thread_gets_the_slice_asked_for() -> None:
    def work() -> tuple[int | None, int]:
        return cpu_slice.apply(250), _runtime()

    assert _on_thread(work) == (250, 250_000)


@needs_slices
def test_a_slice_below_the_kernels_least_is_raised_to_it() -> None:
    def work() -> tuple[int | None, int]:
        return cpu_slice.apply(20), _runtime()

    assert _on_thread(work) == (cpu_slice.MIN_US, cpu_slice.MIN_US * 1000)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or cpu_slice.read() is None,
                    reason="Linux scheduling policies")
def test_a_thread_under_another_policy_is_left_alone() -> None:
    def work() -> tuple[int | None, int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        applied = cpu_slice.apply(250)
        attr = cpu_slice.read()
        assert attr is not None
        return applied, int(attr.sched_policy)

    assert _on_thread(work) == (None, os.SCHED_BATCH)


@needs_slices
@pytest.mark.parametrize(("settings", "slice_us"), [
    ({"eventLoopSliceUs": "300"}, 300),
    ({"eventLoopSliceUs": "100"}, 100),
    ({}, None),  # the default: the kernel's own, as a thread of this process has
])
def test_a_running_brokers_event_loop_thread_has_the_slice(
        tmp_path: Path, settings: dict[str, str], slice_us: int | None) -> None:
    expected = _on_thread(_runtime) if slice_us is None else slice_us * 1000
    broker = BrokerProcess(tmp_path / "data", settings).start(timeout=60)
    try:
        pid = broker.proc.pid if broker.proc is not None else 0
        attr = cpu_slice.read(pid)  # the main thread, which runs the event loop
        assert attr is not None
        assert int(attr.sched_runtime) == expected
        assert int(attr.sched_policy) == cpu_slice.SCHED_OTHER
    finally:
        broker.stop()
