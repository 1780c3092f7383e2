"""DESIGN's layers, enforced: which top-level packages each package may not import.

Every ``import`` and ``from … import`` in a package's modules (at any depth, also inside
functions and ``TYPE_CHECKING`` blocks) is read with ``ast``; relative imports stay inside
their package and so never cross a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_PROJECT = ("common", "edge", "listeners", "sasl", "oauth", "broker_core", "pipeline")

_FORBIDDEN: dict[str, frozenset[str]] = {
    # The shared name rule depends on nothing of ours; every layer may import it.
    "common": frozenset(_PROJECT) - {"common"},
    # The engine knows nothing of sockets, TLS, SASL or the composition root.
    "broker_core": frozenset({"sasl", "oauth", "edge", "listeners", "pipeline"}),
    # Logins and token validation know nothing of the engine or the composition root.
    "sasl": frozenset({"broker_core", "edge", "listeners", "pipeline"}),
    "oauth": frozenset({"broker_core", "edge", "listeners", "pipeline"}),
    # Listeners frame bytes without knowing what a request means.
    "listeners": frozenset({"broker_core", "edge", "sasl", "oauth", "pipeline"}),
    # The Spark side talks Kafka protocol, never broker internals.
    "pipeline": frozenset({"broker_core", "edge", "listeners", "sasl"}),
}


_CODEC = "broker_core/codec"
_CODEC_MAY_IMPORT = ("broker_core.codec", "broker_core.errors", "common")
"""The codec sits below everything else in the engine (storage may use it): of the
broker it knows only itself, the Kafka error codes and what every layer shares (`common`)."""


def imported_modules(source: str) -> set[str]:
    """The modules named by the absolute imports of one module's source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def imported_packages(source: str) -> set[str]:
    """The top-level packages named by the absolute imports of one module's source."""
    return {module.split(".")[0] for module in imported_modules(source)}


def layer_violations(package: str) -> list[str]:
    """``module imports package`` for each import of a forbidden package under ``package``."""
    forbidden = _FORBIDDEN[package]
    violations = []
    for path in sorted((_ROOT / package).rglob("*.py")):
        for imported in sorted(imported_packages(path.read_text()) & forbidden):
            violations.append(f"{path.relative_to(_ROOT)} imports {imported}")
    return violations


def test_the_import_reader_sees_every_form_of_import() -> None:
    source = (
        "import a.b\nfrom c.d import e\nfrom . import f\nfrom .g import h\n"
        "def later() -> None:\n    import i\n"
        "if TYPE_CHECKING:\n    from j import k\n"
    )
    assert imported_packages(source) == {"a", "c", "i", "j"}


@pytest.mark.parametrize("package", sorted(_FORBIDDEN))
def test_package_imports_no_layer_it_must_not_know(package: str) -> None:
    assert (_ROOT / package / "__init__.py").is_file()
    assert layer_violations(package) == []


def test_the_codec_imports_nothing_of_the_engine_above_it() -> None:
    violations = [
        f"{path.relative_to(_ROOT)} imports {module}"
        for path in sorted((_ROOT / _CODEC).rglob("*.py"))
        for module in sorted(imported_modules(path.read_text()))
        if module.split(".")[0] in _PROJECT
        and not any(module == allowed or module.startswith(allowed + ".")
                    for allowed in _CODEC_MAY_IMPORT)
    ]
    assert violations == []
