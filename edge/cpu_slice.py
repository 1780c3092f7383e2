"""The event loop thread's CPU time slice, asked of Linux's scheduler (EEVDF, kernel 6.12
on) once the broker is up (:meth:`edge.app.BrokerApp.start`): ``eventLoopSliceUs``.

Why: the broker serves every request on one thread, which works in bursts of a fraction
of a millisecond and then waits. When other processes keep the same CPU busy, a request
that arrives waits until the scheduler lets that thread run again, and with the kernel's
default slice (about 1.4 ms on the bench machine, scaled by the CPU count) a waking thread
does not always preempt the running one. Measured on the 2-core bench machine with other
work on the broker's CPU (issue 21, ``bench.latency_probe`` and a sampler of the broker
thread's ``/proc/<pid>/task/<tid>/schedstat`` beside the client's per-record latencies,
20,000 records/s of 1 KiB, ``linger.ms=1``): the records of the slowest 1% spent on average
3-50 ms with the event loop thread *runnable but not running*, against 1-6 ms running,
and the slowest 0.1% were almost all such waits. Garbage collection, the periodic fsync
and the writeback (both in worker threads) were not in those windows.

A slice of ``sched_runtime`` nanoseconds on a ``SCHED_OTHER`` thread (``sched_setattr``)
gives the thread an earlier virtual deadline, so on wakeup it preempts a thread that has
used more of its slice; its share of the CPU (its weight, the nice value) is unchanged.
No privilege is needed. The scheduling policy and nice value are kept; a thread the
operator put under another policy (``chrt``) is left alone. Kernels before 6.12 ignore the
request; the read-back then differs and :func:`apply` says so (None).
"""

from __future__ import annotations

import ctypes
import platform
import sys

SCHED_OTHER = 0
MIN_US, MAX_US = 100, 100_000
"""The slices Linux accepts (it clamps ``sched_runtime`` of a fair thread to these)."""
_RESET_ON_FORK = 0x01
"""The one flag kept from the thread's attributes (``SCHED_FLAG_RESET_ON_FORK``)."""
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
"""``(sched_setattr, sched_getattr)`` system call numbers by machine."""


class SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (``SCHED_ATTR_SIZE_VER1``)."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
                ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32)]


def _syscalls() -> tuple[int, int] | None:
    if not sys.platform.startswith("linux"):
        return None
    return _SYSCALLS.get(platform.machine())


def read(tid: int = 0) -> SchedAttr | None:
    """The scheduling attributes of thread ``tid`` (0: the calling thread); None where
    ``sched_getattr`` is not available."""
    numbers = _syscalls()
    if numbers is None:
        return None
    attr = SchedAttr()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[1], tid, ctypes.byref(attr), ctypes.sizeof(SchedAttr), 0) != 0:
        return None
    return attr


def apply(slice_us: int) -> int | None:
    """Ask for a slice of ``slice_us`` microseconds for the calling thread; the slice in
    microseconds the kernel reports afterwards, or None when nothing was asked (0), the
    system cannot, the thread is not under ``SCHED_OTHER``, or the kernel did not take it
    (it keeps slices of 100 us to 100 ms: ``slice_us`` is brought within)."""
    numbers = _syscalls()
    current = read()
    slice_us = min(max(slice_us, MIN_US), MAX_US) if slice_us > 0 else 0
    if slice_us <= 0 or numbers is None or current is None \
            or current.sched_policy != SCHED_OTHER:
        return None
    wanted = SchedAttr(size=ctypes.sizeof(SchedAttr), sched_policy=SCHED_OTHER,
                       sched_flags=current.sched_flags & _RESET_ON_FORK,
                       sched_nice=current.sched_nice, sched_runtime=slice_us * 1000)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[0], 0, ctypes.byref(wanted), 0) != 0:
        return None
    after = read()
    if after is None or after.sched_runtime != slice_us * 1000:
        return None
    return slice_us
