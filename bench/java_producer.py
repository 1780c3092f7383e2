"""The partitions row's Java producer: ``bench/java/PartitionsProducer.java`` compiled
against kafka-clients (where its jars are and which JDK compiles it is
``tests/java_client.py``'s), and the command line of one producer.

The Java client packs the batches of many partitions into one ProduceRequest, where
librdkafka sends one partition's batch per request (librdkafka#1700): with it the row
measures the broker's cost per partition rather than per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.java_client import compile_java, jdk_tool

SOURCE = Path(__file__).resolve().parent / "java" / "PartitionsProducer.java"
MAIN_CLASS = "PartitionsProducer"


@dataclass(frozen=True)
class JavaProducer:
    """The compiled program and the classpath it runs with."""

    classpath: str

    @classmethod
    def compile(cls, into: Path) -> JavaProducer:
        """Compile the program into ``into`` (FileNotFoundError without a JDK or the jars)."""
        return cls(classpath=compile_java(SOURCE, into, timeout=300))

    def command(self, bootstrap: str, prefix: str, topics: int, per_topic: int, count: int,
                first: int, size: int, linger_ms: float) -> list[str]:
        """One producer: ``count`` records round-robin from partition ``first`` over
        ``topics`` topics of ``per_topic`` partitions (0 topics: the one topic ``prefix``);
        it prints one JSON line as ``python -m bench.partitions produce`` does."""
        return [jdk_tool("java"), "-Xmx256m", "-cp", self.classpath, MAIN_CLASS, bootstrap,
                prefix, str(topics), str(per_topic), str(count), str(first), str(size),
                f"{linger_ms:g}"]
