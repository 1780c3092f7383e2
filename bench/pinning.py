"""Which CPUs the brokers and the load generators run on.

On a machine with two or more CPUs the broker under test gets the first CPU and the
load generators (and this harness) the others, so clients never steal the broker's core.
Children inherit the affinity of the thread that starts them, which is how brokers and
workers get theirs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuPlan:
    """The CPU sets of the broker and of the load generators (``None`` = not pinned)."""

    broker: frozenset[int] | None
    load: frozenset[int] | None

    def describe(self) -> str:
        """One line for the report."""
        if self.broker is None or self.load is None:
            return f"not pinned ({os.cpu_count()} CPUs shared)"
        return f"broker on CPU {_cpus(self.broker)}, load generators on CPU {_cpus(self.load)}"


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


def plan_cpus(pin: bool) -> CpuPlan:
    """Split the CPUs this process may use; no pinning when asked or with one CPU."""
    available = sorted(os.sched_getaffinity(0))
    if not pin or len(available) < 2:
        return CpuPlan(None, None)
    return CpuPlan(frozenset(available[:1]), frozenset(available[1:]))


def pin_self(cpus: frozenset[int] | None) -> None:
    """Pin the calling thread (and so every child it starts later)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


@contextmanager
def inherited_affinity(cpus: frozenset[int] | None) -> Iterator[None]:
    """Within the block, children started by this thread inherit ``cpus``."""
    if cpus is None:
        yield
        return
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)
