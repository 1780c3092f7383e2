"""CPU seconds and resident memory of a process, read from ``/proc/<pid>``."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of all threads of ``pid`` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        text = handle.read()
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _TICKS


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(f"{key} not in /proc/{pid}/status")


def peak_rss_bytes(pid: int) -> int:
    """The high-water mark of the resident set (``VmHWM``), in bytes."""
    return _status_kib(pid, "VmHWM") * 1024


def rss_bytes(pid: int) -> int:
    """The current resident set (``VmRSS``), in bytes."""
    return _status_kib(pid, "VmRSS") * 1024


def user_system_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        text = handle.read()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def busy_seconds(cpus: frozenset[int] | None) -> float:
    """Non-idle seconds of ``cpus`` (all CPUs when ``None``) since boot, from /proc/stat."""
    total = 0
    with open("/proc/stat", encoding="ascii") as handle:
        for line in handle:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            if cpus is not None and int(name[3:]) not in cpus:
                continue
            ticks = [int(v) for v in values]
            # user nice system idle iowait irq softirq steal (guest is inside user)
            total += sum(ticks[:8]) - ticks[3] - ticks[4]
    return total / _TICKS
