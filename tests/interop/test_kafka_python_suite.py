"""kafka-python's own integration tests (from its sdist) against this broker: a compliance
yardstick written by someone else. Its producer, consumer and admin modules must pass;
left out are the test that expects the broker to identify as Kafka 4.2 (we implement a
subset of 4.2's APIs, so the client rightly infers an older version) and the one of a
KRaft controller quorum."""

from __future__ import annotations

import os
import re
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


def _outcomes(stdout: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``12 passed, 3 deselected, 1 warning in
    9.1s``; the suite prints more after it)."""
    summaries = re.findall(r"^=* ?(\d+ [a-z]+(?:, \d+ [a-z]+)*) in [\d.]+s", stdout, re.M)
    assert summaries, f"no pytest summary: {stdout[-2000:]}"
    return {word: int(count) for count, word in re.findall(r"(\d+) ([a-z]+)", summaries[-1])}


def _run(suite: Path, data: Path, settings: dict[str, str], modules: list[str],
         deselect: list[str], at_least: int, skips: tuple[str, ...] = ()) -> None:
    """Run kafka-python's test ``modules`` against a fresh broker; all must pass, at least
    ``at_least`` of them (fewer: tests went missing), and none be skipped but those of the
    reasons ``skips`` (KAFKA_VERSION is 4.2 and every codec is installed, so any other skip
    is a test lost)."""
    broker = BrokerProcess(data, {"groupInitialRebalanceDelayMs": "0",
                                  "groupMinSessionTimeoutMs": "1000",
                                  "defaultNumPartitions": "4", **settings}).start()
    try:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                "no:xdist", "--timeout", "120", "-o", "addopts=", "-rs",
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
        outcomes = _outcomes(result.stdout)
        unexpected = set(outcomes) - {"passed", "skipped", "deselected", "warning", "warnings"}
        assert not unexpected, result.stdout[-5000:]
        skipped = re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", result.stdout, re.M)
        assert sorted(reason for count, reason in skipped for _ in range(int(count))) == sorted(
            skips), result.stdout[-5000:]
        assert outcomes.get("skipped", 0) == len(skips), result.stdout[-2000:]
        assert outcomes.get("passed", 0) >= at_least, result.stdout[-2000:]
        assert outcomes.get("deselected", 0) == len(deselect), result.stdout[-2000:]
    finally:
        broker.stop()


def test_kafka_python_integration_suite(suite: Path, tmp_path: Path) -> None:
    _run(suite, tmp_path, {},
         ["test_producer_integration.py", "test_consumer_integration.py"],
         ["test_consumer_integration.py::test_kafka_version_infer"], at_least=32,
         # test_kafka_consumer_offsets_for_time_old: a broker before 0.10.1 only
         skips=("Requires KAFKA_VERSION < 0.10.1",))


def test_kafka_python_admin_integration_suite(suite: Path, tmp_path: Path) -> None:
    """The admin module: topics, configs, groups, records, ACLs, log dirs, elections,
    reassignments, partition paging. Its ACL test needs an authorizer, as on Kafka: the
    anonymous PLAINTEXT principal is made a superuser. Left out: DescribeQuorum, which
    describes a KRaft controller quorum this broker does not have."""
    _run(suite, tmp_path, {"authorizationEnabled": "true", "superUserRoles": "ANONYMOUS"},
         ["test_admin_integration.py"],
         ["test_admin_integration.py::test_describe_metadata_quorum"], at_least=21)
