"""kafka-python's own integration tests (from its sdist) against this broker: a compliance
yardstick written by someone else. Its producer, consumer and admin modules must pass;
left out are the test that expects the broker to identify as Kafka 4.2 (we implement a
subset of 4.2's APIs, so the client rightly infers an older version) and the one of a
KRaft controller quorum."""

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


def _run(suite: Path, data: Path, settings: dict[str, str], modules: list[str],
         deselect: list[str]) -> None:
    """Run kafka-python's test ``modules`` against a fresh broker; all must pass."""
    broker = BrokerProcess(data, {"groupInitialRebalanceDelayMs": "0",
                                  "groupMinSessionTimeoutMs": "1000",
                                  "defaultNumPartitions": "4", **settings}).start()
    try:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                "no:xdist", "--timeout", "120", "-o", "addopts=",
                *[f"test/integration/{module}" for module in modules]]
        for test in deselect:
            args += ["--deselect", f"test/integration/{test}"]
        result = subprocess.run(
            args, cwd=suite, capture_output=True, text=True, timeout=600,
            env={**os.environ, "KAFKA_VERSION": "4.2.0",
                 "KAFKA_URI": f"PLAINTEXT://{broker.bootstrap}",
                 "KAFKA_ROOT": str(suite.parent / "kafka-root"), "PYTHONPATH": str(suite)})
        # the failures with their captured client logs (DEBUG, so long)
        assert result.returncode == 0, result.stdout[-30000:] + result.stderr[-2000:]
        summary = [line for line in result.stdout.splitlines() if " passed" in line]
        assert summary and "failed" not in summary[-1], result.stdout[-2000:]
    finally:
        broker.stop()


def test_kafka_python_integration_suite(suite: Path, tmp_path: Path) -> None:
    _run(suite, tmp_path, {},
         ["test_producer_integration.py", "test_consumer_integration.py"],
         ["test_consumer_integration.py::test_kafka_version_infer"])


def test_kafka_python_admin_integration_suite(suite: Path, tmp_path: Path) -> None:
    """The admin module: topics, configs, groups, records, ACLs, log dirs, elections,
    reassignments, partition paging. Its ACL test needs an authorizer, as on Kafka: the
    anonymous PLAINTEXT principal is made a superuser. Left out: DescribeQuorum, which
    describes a KRaft controller quorum this broker does not have."""
    _run(suite, tmp_path, {"authorizationEnabled": "true", "superUserRoles": "ANONYMOUS"},
         ["test_admin_integration.py"],
         ["test_admin_integration.py::test_describe_metadata_quorum"])
