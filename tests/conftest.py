"""Shared fixtures: a real broker process per test module, and unique topic names.

A module marked ``pytest.mark.storage_engines`` runs its tests once per storage engine:
its broker fixtures take ``storage_engine`` and start with ``engine_settings`` of it.
``postgres`` runs on the session's PostgreSQL server (``tests/postgres_server.py``, started
on first use, stopped when the session ends), a new database per broker.

Spark's drivers, in-process and in the jobs the tests start, run with the JVM options of
``tests.java_client.SHORT_LIVED_JVM`` (``PYSPARK_SUBMIT_ARGS``, unless set already).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import Producer

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.java_client import SPARK_SUBMIT_ARGS
from tests.oauth_helpers import make_issuer
from tests.postgres_server import PostgresServer, shared_server, stop_shared_server
from tests.unit_rule import Reach, SpawnWatch, is_integration

_names = itertools.count()


STORAGE_ENGINES = ("file", "memory", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", SPARK_SUBMIT_ARGS)
    config.addinivalue_line(
        "markers", "storage_engines: run the module's tests once per storage engine")
    config.addinivalue_line(
        "markers", "unit: runs in the test process alone (set by tests/unit_rule.py)")
    config.addinivalue_line(
        "markers", "integration: starts a broker, PostgreSQL, Envoy, a JVM or another "
        "process (set by tests/unit_rule.py)")
    config.addinivalue_line(
        "markers", "long_running(minutes): a module whose tests take that many minutes in "
        "all on a loaded machine; the longest are scheduled first, so that they do not make "
        "the tail of a parallel run")


_reach = Reach()
_watch = SpawnWatch()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test ``unit`` or ``integration`` by the rule of ``tests/unit_rule.py``,
    and moves the ``long_running`` modules to the front, longest first (xdist hands the
    first work out in turn, so the longest start at once on every worker instead of last
    on one)."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        definitions = item._fixtureinfo.name2fixturedefs
        fixtures = [d.func for name in item.fixturenames for d in definitions.get(name, ())]
        unit = not is_integration(_reach, item.function, fixtures)
        item.add_marker("unit" if unit else "integration")
    items[:] = sorted(items, key=_work_order)


def _work_order(item: pytest.Item) -> int:
    """Sort key: a ``long_running`` test's minutes, negated (a stable sort keeps the
    collection's order within a module and among the rest: the heavy modules stay spread
    over the run, not all at its start)."""
    marker = item.get_closest_marker("long_running")
    return 0 if marker is None else -int(marker.kwargs["minutes"])


@functools.cache
def _grouped_modules() -> frozenset[str]:
    """The test modules (as node ids name them) that define a module-scoped fixture of
    their own: a benchmark's quick run, a Spark session, a cluster, an Envoy."""
    root = Path(__file__).parent
    return frozenset(path.relative_to(root.parent).as_posix()
                     for path in root.rglob("test_*.py")
                     if 'scope="module"' in path.read_text(encoding="utf-8"))


class ModuleGroups(LoadScopeScheduling):
    """xdist's scheduling with each of :func:`_grouped_modules` sent whole to one worker,
    so that its module fixtures are set up once (spread over two workers, a module paid
    for them on both: a benchmark's quick run twice, a Spark JVM twice); every other test
    goes alone to whichever worker is free, as ``--dist load`` sends them. In collection
    order (:func:`_work_order`), not xdist's largest-group-first."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in _grouped_modules() else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> ModuleGroups:
    """Schedule with :class:`ModuleGroups` (xdist's ``loadgroup`` marks do not reach
    pytest 9's node ids)."""
    return ModuleGroups(config, log)


@contextlib.contextmanager
def _no_process_of(item: pytest.Item) -> Iterator[None]:
    """Fails a ``unit`` test that starts a process: the rule missed what it does."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    _watch.spawned.clear()
    _watch.active = True
    try:
        yield
    finally:
        _watch.active = False
    if _watch.spawned:
        pytest.fail(f"marked unit but started a process ({_watch.spawned[0]}): teach "
                    "tests/unit_rule.py what it uses", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _no_process_of(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _no_process_of(item):
        return (yield)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stop_shared_server()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("storage_engines") \
            and "storage_engine" in metafunc.fixturenames:
        metafunc.parametrize("storage_engine", STORAGE_ENGINES, scope="module")


@pytest.fixture(scope="module")
def storage_engine() -> str:
    """The storage engine of the module's broker (each one in a marked module)."""
    return "file"


def engine_settings(engine: str) -> dict[str, str]:
    """Broker settings that select ``engine`` (the file engine is the default)."""
    if engine == "postgres":
        return {"storageUrl": shared_server().new_database_url()}
    return {"storageUrl": "memory://"} if engine == "memory" else {}


def check_engine_left(data_dir: Path, engine: str) -> None:
    """After the broker stopped: the memory and postgres engines wrote nothing to disk."""
    if engine in ("memory", "postgres"):
        assert not data_dir.exists(), f"memory://: {data_dir} was created"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           storage_engine: str) -> Iterator[BrokerProcess]:
    """A broker with default settings, shared by the tests of one module."""
    data = tmp_path_factory.mktemp("broker-data") / "data"  # only file:// creates it
    process = BrokerProcess(data, engine_settings(storage_engine)).start()
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


@pytest.fixture(scope="module")
def issuer_options() -> dict[str, object]:
    """Options of the module's dev issuer (``make_issuer``); a module overrides this fixture
    to change them."""
    return {}


@pytest.fixture(scope="module")
def issuer(issuer_options: dict[str, object]) -> Iterator[DevIssuer]:
    """A dev OAuth issuer on 127.0.0.1, shared by the tests of one module."""
    dev = make_issuer(**issuer_options)
    yield dev
    dev.stop()


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of its own, to stop and start under a broker."""
    server = PostgresServer.running()
    try:
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.remove()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique within the test session."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"{base}-{next(_names)}"
