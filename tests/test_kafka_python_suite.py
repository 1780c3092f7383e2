"""kafka-python's own integration tests (from its sdist) against this broker: a compliance
yardstick written by someone else. Its producer and consumer modules must pass; only the
test that expects the broker to identify as Kafka 4.2 is left out (we implement a subset
of 4.2's APIs, so the client rightly infers an older version)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess

# The sdist ships fixtures that import a module it leaves out; for an external broker
# they only need these two names.
_SERVICE_STUB = '''"""Stand-ins for an external broker's fixtures."""


class ExternalService:
    def __init__(self, host, port):
        self.host, self.port = host, port

    def open(self):
        pass

    def close(self):
        pass


class SpawnedService:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("only an external broker is used")
'''


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kafka-python's sdist, matching the installed version, unpacked."""
    where = tmp_path_factory.mktemp("kafka-python-sdist")
    release = version("kafka-python")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--no-binary", ":all:", "--dest", str(where), f"kafka-python=={release}"],
                   check=True, timeout=300, capture_output=True)
    archive = next(where.glob("kafka*python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(where, filter="data")
    root = next(p for p in where.iterdir() if p.is_dir())
    (root / "test" / "__init__.py").touch()
    (root / "test" / "service.py").write_text(_SERVICE_STUB)
    (where / "kafka-root").mkdir()
    return root


def test_kafka_python_integration_suite(suite: Path, tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, {"groupInitialRebalanceDelayMs": "0",
                                      "groupMinSessionTimeoutMs": "1000",
                                      "defaultNumPartitions": "4"}).start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
             "no:xdist", "--timeout", "120", "-o", "addopts=",
             "test/integration/test_producer_integration.py",
             "test/integration/test_consumer_integration.py",
             "--deselect",
             "test/integration/test_consumer_integration.py::test_kafka_version_infer"],
            cwd=suite, capture_output=True, text=True, timeout=600,
            env={**os.environ, "KAFKA_VERSION": "4.2.0",
                 "KAFKA_URI": f"PLAINTEXT://{broker.bootstrap}",
                 "KAFKA_ROOT": str(suite.parent / "kafka-root"), "PYTHONPATH": str(suite)})
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        summary = [line for line in result.stdout.splitlines() if " passed" in line]
        assert summary and "failed" not in summary[-1], result.stdout[-2000:]
    finally:
        broker.stop()
