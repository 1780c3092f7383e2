"""The Java client (kafka-clients) for tests: where its jars are, compiling
tests/java/KafkaFlows.java once, and running one of its flows against a broker.

kafka-clients 3.9 comes from PyPI inside the ``atoti-server-kafka`` wheel (its
``plugin.jar`` bundles kafka-clients with lz4-java); slf4j-api, which kafka-clients needs
at run time, comes from pyspark's jars. ``javac`` is the Debian JDK the Makefile installs.
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "java" / "KafkaFlows.java"
MAIN_CLASS = "KafkaFlows"


def _resource(package: str, *parts: str) -> Path:
    return Path(str(importlib.resources.files(package).joinpath(*parts)))


def client_jars() -> list[Path]:
    """kafka-clients (with lz4-java) and slf4j-api."""
    kafka = _resource("_atoti_server_kafka", "__resources__", "plugin.jar")
    slf4j = sorted(_resource("pyspark", "jars").glob("slf4j-api-*.jar"))
    if not kafka.is_file() or not slf4j:
        raise FileNotFoundError(f"kafka-clients jar ({kafka}) or slf4j-api jar missing")
    return [kafka, slf4j[-1]]


def _jdk_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: the Makefile installs openjdk-17-jdk-headless")
    return found


@dataclass(frozen=True)
class JavaFlows:
    """The compiled KafkaFlows program and the classpath it runs with."""

    classpath: str

    @classmethod
    def compile(cls, into: Path) -> JavaFlows:
        """Compile KafkaFlows.java into ``into``."""
        jars = os.pathsep.join(str(jar) for jar in client_jars())
        subprocess.run([_jdk_tool("javac"), "-cp", jars, "-d", str(into), str(SOURCE)],
                       check=True, capture_output=True, text=True, timeout=180)
        return cls(classpath=os.pathsep.join([str(into), jars]))

    def run(self, *args: str, timeout: float = 120.0) -> list[list[str]]:
        """Run one flow; its output lines split into words. A failed flow raises with the
        program's stderr (the Java exception) in the message."""
        done = subprocess.run([_jdk_tool("java"), "-cp", self.classpath, MAIN_CLASS, *args],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"java {MAIN_CLASS} {' '.join(args)} exited "
                                 f"{done.returncode}:\n{done.stderr[-4000:]}")
        return [line.split() for line in done.stdout.splitlines() if line.strip()]
