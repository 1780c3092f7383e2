"""AlterClientQuotas is bounded, the quotas being one document every broker holds and
rewrites whole on each change: a new entity beyond ``maxQuotaEntitiesPerTenant`` of its
tenant answers POLICY_VIOLATION (changing or removing one always passes, other tenants
are apart), and a request of more than 1000 entries answers INVALID_REQUEST for each,
storing nothing. Raw AlterClientQuotas against a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.quota_helpers import alter, describe
from tests.raw import RawConnection

INVALID_REQUEST, POLICY_VIOLATION = 42, 44
CAP = 5
P = "producer_byte_rate"


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path / "data", {"maxQuotaEntitiesPerTenant": str(CAP)}).start()
    try:
        yield process
    finally:
        process.stop(30)


Entity = dict[str, str | None]


def _codes(conn: RawConnection, entities: list[Entity],
           value: float | None = 1000.0) -> list[int]:
    return [code for code, _ in alter(conn, [(entity, {P: value}) for entity in entities])]


def test_quota_entities_are_capped_per_tenant_and_per_request(broker: BrokerProcess) -> None:
    conn = RawConnection(broker.port)
    acme: list[Entity] = [{"namespace": f"acme/n{i}"} for i in range(CAP + 2)]
    assert _codes(conn, [*acme[:CAP - 1], {"tenant": "acme"}]) == [0] * CAP
    refused = alter(conn, [(acme[CAP - 1], {P: 1000.0})])
    print("the tenant's entity beyond the cap:", refused)
    assert refused[0][0] == POLICY_VIOLATION
    assert _codes(conn, [acme[0]], 2000.0) == [0]  # an existing one changes
    assert _codes(conn, [acme[0]], None) == [0]  # and goes
    assert _codes(conn, acme[CAP - 1:CAP + 1]) == [0, POLICY_VIOLATION]  # room for one
    assert _codes(conn, [{"namespace": "other/n"}, {"user": "u"}]) == [0, 0]  # apart

    flood: list[Entity] = [{"namespace": f"flood/n{i}"} for i in range(1001)]
    codes = _codes(conn, flood)
    print(f"1001 entries in one request: {set(codes)}")
    assert codes == [INVALID_REQUEST] * 1001
    _error, stored = describe(conn, [])
    assert not any(("namespace", f"flood/n{i}") in entity for i in range(1001)
                   for entity in stored)
    assert len(stored) == CAP + 2
