"""Shared fixtures: a real broker process per test module, and unique topic names."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with default settings, shared by the tests of one module."""
    process = BrokerProcess(Path(tmp_path_factory.mktemp("broker-data"))).start()
    yield process
    process.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique within the test session."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"{base}-{next(_names)}"
