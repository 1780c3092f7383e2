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
import warnings
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


def _failures(stdout: str) -> str:
    """A failed run's assertion lines and failed test names first, then its tail (the
    captured client logs are at DEBUG, so long that the tail alone hides the assertion)."""
    lines = [line for line in stdout.splitlines() if line.startswith(("E ", "FAILED "))]
    return "\n".join(lines)[:8000] + "\n...\n" + stdout[-20000:]


def _pytest(suite: Path, broker: BrokerProcess, targets: list[str],
            deselect: list[str]) -> subprocess.CompletedProcess[str]:
    """kafka-python's pytest on ``targets`` (paths under ``test/integration``) against
    ``broker``."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
            "no:xdist", "--timeout", "120", "-o", "addopts=", "-rfs",
            *[f"test/integration/{target}" for target in targets]]
    for test in deselect:
        args += ["--deselect", f"test/integration/{test}"]
    return subprocess.run(
        args, cwd=suite, capture_output=True, text=True, timeout=600,
        env={**os.environ, "KAFKA_VERSION": "4.2.0",
             "KAFKA_URI": f"PLAINTEXT://{broker.bootstrap}",
             "KAFKA_ROOT": str(suite.parent / "kafka-root"), "PYTHONPATH": str(suite)})


_RERUN_AT_MOST = 2
"""Failed tests run once more, if at most this many failed. kafka-python 3.0.12 has a
start-up race of its own (``ClusterMetadata.set_topics``: "TODO: handle future when old
metadata request is currently in-flight"): a consumer that subscribes while its bootstrap
metadata request, naming no topics, is in flight takes that answer as the update it asked
for, keeps an empty assignment and waits 300 s for the next refresh, so a test polling for
9 s sees nothing (reproduced under CPU load, about 1 run in 15; the broker answered every
request right). A test failing twice, or more than two failing, is a failure."""


def _run(suite: Path, data: Path, settings: dict[str, str], modules: list[str],
         deselect: list[str], at_least: int, skips: tuple[str, ...] = ()) -> None:
    """Run kafka-python's test ``modules`` against a fresh broker; all must pass, at least
    ``at_least`` of them (fewer: tests went missing), and none be skipped but those of the
    reasons ``skips`` (KAFKA_VERSION is 4.2 and every codec is installed, so any other skip
    is a test lost). A test that fails is run once more (see ``_RERUN_AT_MOST``)."""
    broker = BrokerProcess(data, {"groupInitialRebalanceDelayMs": "0",
                                  "groupMinSessionTimeoutMs": "1000",
                                  "defaultNumPartitions": "4", **settings}).start()
    try:
        result = _pytest(suite, broker, modules, deselect)
        failed = re.findall(r"^FAILED (\S+)", result.stdout, re.M)
        assert result.returncode in (0, 1), _failures(result.stdout) + result.stderr[-2000:]
        assert len(failed) <= _RERUN_AT_MOST, _failures(result.stdout)
        if failed:
            warnings.warn(f"kafka-python tests failed once, run again: {failed}", stacklevel=1)
            print(_failures(result.stdout))  # shown if the second run fails too
            again = _pytest(suite, broker, [name.removeprefix("test/integration/")
                                            for name in failed], [])
            assert again.returncode == 0, _failures(again.stdout) + again.stderr[-2000:]
        outcomes = _outcomes(result.stdout)
        assert outcomes.pop("failed", 0) == len(failed), _failures(result.stdout)
        outcomes["passed"] = outcomes.get("passed", 0) + len(failed)
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
