"""Which tests are unit tests (``make test-fast`` runs those): the rule, and its check.

A unit test runs in the test process alone: no broker, no PostgreSQL, no Envoy, no JVM, no
Spark, no child process of any kind. Everything else is an integration test.

The rule, applied at collection (``is_integration``): a test is an integration test when
the test function, or any fixture it uses, can reach a way of starting a process — a name
from ``subprocess``, ``multiprocessing``, pyspark or one of the helper modules that start
brokers, PostgreSQL or Envoy — directly or through the helper functions and classes of
``tests`` it calls (followed by the global names their code uses).

The check, at run time (``SpawnWatch``): an audit hook sees every process the test
process starts. A test marked ``unit`` that starts one fails, naming what it ran, so the
rule cannot drift silently: the full suite runs the check too.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

HEAVY_MODULES = (
    "subprocess", "multiprocessing", "pyspark", "edge.local_postgres",
    "tests.broker_process", "tests.cluster_process", "tests.cluster_helpers",
    "tests.postgres_server", "tests.envoy_helpers", "tests.java_client",
)
# Attribute names that start a process whatever module they were reached through.
SPAWNING_ATTRIBUTES = frozenset({
    "Popen", "create_subprocess_exec", "create_subprocess_shell", "fork", "forkpty",
    "posix_spawn", "posix_spawnp",
})
# Audit events of a new process (see the audit events table of the Python docs).
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty",
                          "os.posix_spawn", "os.exec", "os.spawn"})


def _heavy_module(name: str | None) -> bool:
    return bool(name) and any(name == m or name.startswith(m + ".")  # type: ignore[union-attr]
                              for m in HEAVY_MODULES)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


class Reach:
    """Whether an object can start a process, memoized over one collection."""

    def __init__(self) -> None:
        self._seen: dict[int, bool] = {}

    def heavy(self, obj: object) -> bool:
        key = id(obj)
        if key in self._seen:
            return self._seen[key]
        self._seen[key] = False  # a cycle reaches nothing new
        self._seen[key] = result = self._heavy(obj)
        return result

    def _heavy(self, obj: object) -> bool:
        if isinstance(obj, types.ModuleType):
            return _heavy_module(obj.__name__)
        if _heavy_module(getattr(obj, "__module__", None)):
            return True
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, type) and (obj.__module__ or "").startswith("tests"):
            return any(self.heavy(member) for member in vars(obj).values()
                       if isinstance(member, (types.FunctionType, property, staticmethod,
                                              classmethod)))
        if isinstance(obj, property):
            return obj.fget is not None and self.heavy(obj.fget)
        if isinstance(obj, (staticmethod, classmethod)):
            return self.heavy(obj.__func__)
        return False

    def _function(self, fn: types.FunctionType) -> bool:
        module = fn.__module__ or ""
        if not module.startswith("tests"):
            return False  # library code: only the heavy modules above count
        names = {name for code in _codes(fn.__code__) for name in code.co_names}
        if names & SPAWNING_ATTRIBUTES or any(_heavy_module(name) for name in names):
            return True  # a spawning call, or a heavy module imported inside the function
        return any(self.heavy(fn.__globals__[name]) for name in names
                   if name in fn.__globals__)


def is_integration(reach: Reach, test: Callable[..., Any],
                   fixtures: list[Callable[..., Any]]) -> bool:
    """The rule: the test or one of its fixtures can start a process."""
    return any(reach.heavy(inspect.unwrap(fn)) for fn in [test, *fixtures])


class SpawnWatch:
    """The processes started while a unit test runs (an audit hook; one per process)."""

    def __init__(self) -> None:
        self.active = False
        self.spawned: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.active and event in SPAWN_EVENTS:
            self.spawned.append(f"{event} {str(args[:2])[:200]}")
