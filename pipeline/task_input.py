"""Whether the running Spark task's input came whole, for a task that commits on its own
(the streaming sink's ``atomicity=partition``).

A Python task reads its rows from a socket its executor JVM writes. When the stage
feeding the task fails (an exception upstream, the source unreachable), the JVM's
writer shuts its side of that socket down; when the JVM is killed, the kernel closes it.
Either way the worker's row iterator can end at a batch boundary as if the input were
complete: PySpark's deserializers take the end of the stream for the end of the data.
A task that then commits its transaction (and its batch marker) publishes part of its
rows and tells the replay that the batch is written, so the rest would never be.

A whole input is followed by the JVM's end-of-stream message, and the JVM keeps the
socket open until it has read the task's answer; so once the rows are consumed, a socket
at end of file (or reset) means the input was cut short. The socket is the one PySpark's
worker daemon hands the task (``pyspark.daemon.worker(sock, ...)``, on the task's call
stack); it is peeked at without blocking and without taking a byte.
"""

from __future__ import annotations

import os
import socket
import sys
from types import FrameType

CHECKED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)


class LinkNotFound(RuntimeError):
    """No socket to the executor on the task's call stack (not run by PySpark's worker
    daemon, e.g. ``spark.python.use.daemon=false``)."""


def executor_link(frame: FrameType | None = None) -> socket.socket:
    """The socket from the executor JVM that the innermost caller holding one received
    (PySpark's daemon passes it to ``worker``); :class:`LinkNotFound` when none does."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if (isinstance(value, socket.socket) and value.fileno() >= 0
                    and value.family in CHECKED_FAMILIES
                    and value.type == socket.SOCK_STREAM):
                return value
        frame = frame.f_back
    raise LinkNotFound("edgekafka sink: atomicity=partition needs PySpark's worker daemon "
                       "(spark.python.use.daemon=true, the default on Linux and macOS): "
                       "no socket to the executor on the task's call stack")


def input_cut(link: socket.socket) -> bool:
    """Whether the executor closed (or reset) ``link``: the rows the task got may be only
    part of its input. Reads nothing."""
    with socket.socket(fileno=os.dup(link.fileno())) as probe:
        try:
            return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:  # reset by a killed JVM
            return True
