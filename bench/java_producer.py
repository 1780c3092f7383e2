"""The partitions row's Java producer: ``bench/java/PartitionsProducer.java`` compiled
against kafka-clients (where its jars are and which JDK compiles it is
``tests/java_client.py``'s), and the command line of one producer.

The Java client packs the batches of many partitions into one ProduceRequest, where
librdkafka sends one partition's batch per request (librdkafka#1700): with it the row
measures the broker's cost per partition rather than per request.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.java_client import client_jars, jdk_tool

SOURCE = Path(__file__).resolve().parent / "java" / "PartitionsProducer.java"
MAIN_CLASS = "PartitionsProducer"


@dataclass(frozen=True)
class JavaProducer:
    """The compiled program and the classpath it runs with."""

    classpath: str

    @classmethod
    def compile(cls, into: Path) -> JavaProducer:
        """Compile the program into ``into`` (FileNotFoundError without a JDK or the jars)."""
        jars = os.pathsep.join(str(jar) for jar in client_jars())
        subprocess.run([jdk_tool("javac"), "-cp", jars, "-d", str(into), str(SOURCE)],
                       check=True, capture_output=True, text=True, timeout=300)
        return cls(classpath=os.pathsep.join([str(into), jars]))

    def command(self, bootstrap: str, prefix: str, topics: int, per_topic: int, count: int,
                first: int, size: int, linger_ms: float) -> list[str]:
        """One producer: ``count`` records round-robin from partition ``first`` over
        ``topics`` topics of ``per_topic`` partitions (0 topics: the one topic ``prefix``);
        it prints one JSON line as ``python -m bench.partitions produce`` does."""
        return [jdk_tool("java"), "-Xmx256m", "-cp", self.classpath, MAIN_CLASS, bootstrap,
                prefix, str(topics), str(per_topic), str(count), str(first), str(size),
                f"{linger_ms:g}"]
