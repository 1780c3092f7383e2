"""The event loop thread's CPU time slice, asked of Linux's scheduler (EEVDF, kernel 6.12
on) once the broker is up (:meth:`edge.app.BrokerApp.start`): ``eventLoopSliceUs``.

Why: the broker serves every request on one thread, which works in bursts of a fraction
of a millisecond and then waits. When other processes keep the same CPU busy, a request
that arrives waits until the scheduler lets that thread run again; with the kernel's
default slice (1.4 ms on the 2-core bench machine) a waking thread does not always preempt
the running one. Measured there (issue 21: ``bench.latency_probe``, 20,000 records/s of
1 KiB, ``linger.ms=1``, and a sampler of the broker thread's
``/proc/<pid>/task/<tid>/schedstat`` beside the client's per-record latencies): the
slowest 1% of records spent on average 3-50 ms with the event loop thread *runnable but
not running*, against 1-6 ms running; its worker threads (fsync, writeback) ran under
0.1 ms in those windows, no full collection ran, and the thread was blocked in the kernel
(state D) in 0.03% of samples. With other processes taking about 40% of the broker's CPU,
6 of 29 trials without a slice had a p99 over 100 ms (up to 268 ms), none of 28 with
100 us (worst 53 ms; Tansu, the Rust broker: 1 of 28, 106 ms); the p99 medians were 6.9,
6.5 and 6.1 ms, the p99.9 medians 12.4, 14.9 and 9.2 ms. With the machine quiet the slice
changes nothing measurable. The price: the thread is preempted more often mid-request
when the CPU is contended, so the produce handling time
(``kop_server_request_latency_seconds``) was over 1 ms for 1.15% of requests in those
runs, against 0.6% without (400 us: 0.3%, over 6 trials only).

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
