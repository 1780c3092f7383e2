"""The broker's helper threads give way to the event loop thread: ``SCHED_BATCH``.

The log writer (:mod:`edge.log_thread`) wakes for every line and the SASL steps' threads
(:class:`edge.app.BrokerApp`) for every token check. Under Linux's default policy a thread
woken on the CPU the event loop thread runs on preempts it at once, and then, needing the
GIL the loop holds, waits for it: two context switches per wake-up before any work is
done. ``bench.logins`` counted about 8.5 context switches of the broker's threads per
login (one log line and one token check), which cost a fifth of the broker's CPU in the
kernel's task switching.

A thread in ``SCHED_BATCH`` gets no wakeup preemption: it runs once the loop thread waits
(for I/O, or for the GIL, whose switch interval of 5 ms bounds that), and by then finds
the lines or token checks of several wake-ups queued. Its share of the CPU (its nice
value) is the same as before. Unprivileged threads may ask for it; elsewhere than on
Linux nothing changes.
"""

from __future__ import annotations

import os


def give_way_to_the_loop() -> bool:
    """Put the calling thread in ``SCHED_BATCH`` (its nice value kept); whether it is.
    Never raises (meant for a thread's start, e.g. an executor's initializer)."""
    setter = getattr(os, "sched_setscheduler", None)
    policy = getattr(os, "SCHED_BATCH", None)
    if setter is None or policy is None:
        return False
    try:
        setter(0, policy, os.sched_param(0))  # 0: the calling thread (Linux)
    except OSError:
        return False
    return True
