"""The Python worker daemon that Spark starts for the command line's jobs
(``spark.python.daemon.module``): PySpark's own daemon, in a process group of its own.

A Ctrl-C in a terminal goes to the foreground process group: the driver (which stops its
job itself, ``pipeline.cli``), the JVM (which PySpark makes ignore it) and, without this
module, the Python workers, which PySpark's daemon hands the default SIGINT handler. A
worker interrupted inside a running task fails it, and the JVM prints that failure as a
hundred lines of Java and Python tracebacks. In their own group the workers only end when
their JVM does (the daemon watches its stdin).
"""

from __future__ import annotations

import os

from pyspark import daemon

if __name__ == "__main__":
    os.setpgid(0, 0)
    daemon.manager()
