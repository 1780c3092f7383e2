"""The broker's limit on open files (``RLIMIT_NOFILE``), looked at once at start-up.

Every connection holds a file descriptor from its accept on, and so does every open
ledger file, PostgreSQL connection and socket of the broker's own. The soft limit is
raised to the hard one, as the JVM does for Kafka (``-XX:+MaxFDLimit``, on by default): a
shell's soft limit (often 1024) is no statement of what the broker should serve, the hard
limit is the operator's (``LimitNOFILE`` of the systemd unit, ``ulimit -Hn``). When even
the hard limit is below what the listeners may hold (the sum of their
``maxConnectionsPerListener``) plus :data:`MARGIN` for the broker's own files, one WARNING
line says so: the connection caps would then not be what stops a flood, running out of
descriptors would (storage writes failing with "Too many open files").
"""

from __future__ import annotations

import resource

MARGIN = 1024
"""Descriptors kept for the broker's own files and sockets (ledger files, the data
directory's lock, PostgreSQL connections, the metrics endpoint); a broker with thousands
of partitions open needs more."""


def raise_open_files(listener_caps: int) -> str | None:
    """Raise the soft limit to the hard one; a warning when the limit is below
    ``listener_caps`` (the connections the listeners may hold) plus :data:`MARGIN`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):  # a hard limit beyond the kernel's nr_open
            pass
    needed = listener_caps + MARGIN
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    return (f"the open-file limit is {soft} (RLIMIT_NOFILE), below the {listener_caps} "
            f"connections the listeners may hold (maxConnectionsPerListener) plus {MARGIN} "
            f"for the broker's own files: raise it (LimitNOFILE=, ulimit -n) to at least "
            f"{needed}, or lower maxConnectionsPerListener, or a flood of connections will "
            f"fail storage writes with 'Too many open files'")
