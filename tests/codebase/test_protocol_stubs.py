"""The typed stubs of kafka-python's protocol classes (``typings/kafka``) are current.

The generated ones must equal what ``tools/protocol_stubs.py`` renders from the installed
kafka-python now (run ``python -m tools.protocol_stubs`` after upgrading it); the
hand-written base classes must only declare what kafka-python's classes have.
"""

from __future__ import annotations

import ast
import inspect
import shutil
from pathlib import Path

import pytest
from kafka.protocol.api_data import ApiData
from kafka.protocol.api_message import ApiMessage, VersionSubscriptable
from kafka.protocol.data_container import DataContainer
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.schemas.fields import BaseField

from tools import protocol_stubs


def test_the_committed_stubs_are_what_the_generator_renders_now() -> None:
    stale = protocol_stubs.stale()
    assert not stale, ("typings/ is out of date; run `python -m tools.protocol_stubs`: "
                       f"{stale}")


def test_a_changed_missing_or_unknown_stub_is_reported(tmp_path: Path) -> None:
    stubs = tmp_path / "typings"
    shutil.copytree(protocol_stubs.STUBS, stubs)
    assert protocol_stubs.stale(stubs) == []
    fetch = stubs / "kafka/protocol/consumer/fetch.pyi"
    fetch.write_text(fetch.read_text() + "\n")
    (stubs / "kafka/protocol/sasl.pyi").unlink()
    (stubs / "kafka/protocol/stray.pyi").write_text("")
    assert protocol_stubs.stale(stubs) == [
        "kafka/protocol/consumer/fetch.pyi", "kafka/protocol/sasl.pyi",
        "kafka/protocol/stray.pyi"]
    assert protocol_stubs.write(stubs) == [
        "kafka/protocol/consumer/fetch.pyi", "kafka/protocol/sasl.pyi"]
    assert protocol_stubs.stale(stubs) == ["kafka/protocol/stray.pyi"]


def _declared(stub: str) -> dict[str, dict[str, ast.FunctionDef | None]]:
    """Per class of a hand-written stub: its members, with the function of each method."""
    tree = ast.parse((protocol_stubs.STUBS / stub).read_text())
    classes: dict[str, dict[str, ast.FunctionDef | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members: dict[str, ast.FunctionDef | None] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = item
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = None
            classes[node.name] = members
    return classes


@pytest.mark.parametrize(("stub", "cls", "sample"), [
    ("kafka/protocol/data_container.pyi", DataContainer, None),
    ("kafka/protocol/api_data.pyi", ApiData, None),
    ("kafka/protocol/api_message.pyi", ApiMessage, None),
    ("kafka/protocol/api_message.pyi", VersionSubscriptable, None),
    ("kafka/protocol/schemas/fields/base.pyi", BaseField, ProduceRequest.fields["acks"]),
])
def test_the_hand_written_base_stubs_declare_only_what_kafka_python_has(
        stub: str, cls: type, sample: object) -> None:
    """Each declared member is on the class (a slot for instance fields, or an attribute of
    a ``sample`` instance), and each declared parameter of a method is one of its
    parameters (the class properties of the bases raise when read, so members are looked
    up without reading them)."""
    for name, function in _declared(stub)[cls.__name__].items():
        owner = next((k for k in cls.__mro__ if name in vars(k)
                      or name in getattr(k, "__slots__", ())), None)
        if owner is None and function is None and sample is not None:
            assert name in vars(sample), f"{cls.__name__}.{name} is not kafka-python's"
            continue
        assert owner is not None, f"{cls.__name__}.{name} is not kafka-python's"
        if function is None:
            continue
        member = vars(owner)[name]
        member = getattr(member, "__func__", getattr(member, "fget", member))
        actual = inspect.signature(member).parameters
        declared = [a.arg for a in function.args.args + function.args.kwonlyargs]
        missing = [p for p in declared if p not in actual]
        assert not missing, f"{cls.__name__}.{name} has no parameters {missing}"


def test_a_message_indexed_by_version_is_the_message_at_that_version() -> None:
    request = ProduceRequest[9](acks=1, timeout_ms=5, topic_data=[])
    assert isinstance(request, ProduceRequest)
    assert request.version == 9
    decoded = ProduceRequest.decode(request.encode(), version=9)
    assert (decoded.version, decoded.acks) == (9, 1)
