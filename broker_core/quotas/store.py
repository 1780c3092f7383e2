"""The client quotas, kept as JSON under ``quotas.json`` in the storage's key-value area.

A cluster shares them (every broker reads the same area, and takes in another broker's
change when the storage reports one, see ``Engine.kv_readers``); they apply without a
restart. Changes go through :class:`~broker_core.kv_document.KvDocument`, so concurrent
AlterClientQuotas on two brokers never lose one another's change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from broker_core.kv_document import KvDocument
from broker_core.quotas.entities import QuotaEntity
from broker_core.storage import KeyValueStore

KEY = "quotas.json"
"""The quotas' key in the storage's key-value area."""

Quotas = Mapping[QuotaEntity, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class Alteration:
    """One entity's changes: ``set`` these values, ``remove`` these keys."""

    entity: QuotaEntity
    set: Mapping[str, float]
    remove: frozenset[str]


def _parse(stored: bytes | None) -> Quotas:
    if stored is None:
        return MappingProxyType({})
    return MappingProxyType({
        QuotaEntity(tuple((kind, name) for kind, name in item["entity"])):
            MappingProxyType({str(k): float(v) for k, v in item["values"].items()})
        for item in json.loads(stored)})


def _encode(quotas: Quotas) -> bytes:
    document = [{"entity": [list(part) for part in entity.parts], "values": dict(values)}
                for entity, values in sorted(quotas.items(), key=lambda i: i[0].sort_key())]
    return json.dumps(document, indent=1).encode()


def _altered(current: Quotas, changes: Sequence[Alteration]) -> Quotas:
    result = {entity: dict(values) for entity, values in current.items()}
    for change in changes:
        values = result.setdefault(change.entity, {})
        for key in change.remove:
            values.pop(key, None)
        values.update(change.set)
        if not values:
            del result[change.entity]
    if result == {e: dict(v) for e, v in current.items()}:
        return current
    return MappingProxyType({e: MappingProxyType(v) for e, v in result.items()})


class QuotaStore:
    """Every entity's quota values, as last read or written."""

    def __init__(self, kv: KeyValueStore) -> None:
        self.document = KvDocument(kv, KEY, _parse, _encode)

    @property
    def quotas(self) -> Quotas:
        """Each entity's values (entities without values are not kept)."""
        return self.document.value

    async def read_again(self) -> None:
        """Take in another broker's changes."""
        await self.document.read_again()

    async def alter(self, changes: Sequence[Alteration]) -> None:
        """Apply ``changes`` in one write (in a worker thread: ``KvDocument.change``)."""
        if changes:
            await self.document.change(lambda current: _altered(current, changes))
