"""Small slot numbers for live brokers, kept in the storage's key-value area.

Broker ids are chosen by operators (5, 1001, ...); a topic with one partition per broker
(the audit topic) needs small numbers instead: partition ``slot`` for the broker holding
that slot. A broker takes a slot when it registers: the one it held before if nobody took
it meanwhile (a restart), else the lowest slot that is free or whose holder is not live (a
dead broker's slot is reused). The map ``slot -> broker id`` is one document changed by
``compare_and_set`` only, so two brokers never hold one slot; a broker keeps its slot while
it lives. Writing to the slot's partition is still fenced by that partition's ownership
epoch, so a broker that was declared dead while paused cannot write there after another
took its slot.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping

from broker_core.storage import KeyValueStore, StorageError

KEY = "broker-slots"
_ATTEMPTS = 100
"""Compare-and-set rounds before giving up (each lost round means another broker took a
slot meanwhile)."""


class SlotsBusy(StorageError):
    """The slot map kept changing while this broker tried to take a slot."""


def _decode(stored: bytes | None) -> dict[int, int]:
    if stored is None:
        return {}
    return {int(slot): int(broker) for slot, broker in json.loads(stored).items()}


def _encode(slots: Mapping[int, int]) -> bytes:
    return json.dumps({str(slot): broker for slot, broker in sorted(slots.items())},
                      separators=(",", ":")).encode()


class BrokerSlots:
    """The slot map of the brokers sharing a storage."""

    def __init__(self, kv: KeyValueStore) -> None:
        self.kv = kv

    def read(self) -> dict[int, int]:
        """slot -> broker id, as stored (holders may have died since)."""
        return _decode(self.kv.get(KEY))

    def take(self, me: int, live: Collection[int]) -> int:
        """This broker's slot: the one it holds, else the lowest one free or held by a
        broker not in ``live``. OSError if the storage fails, SlotsBusy if the map
        kept changing."""
        for _ in range(_ATTEMPTS):
            stored = self.kv.get(KEY)
            slots = _decode(stored)
            mine = [slot for slot, broker in slots.items() if broker == me]
            if mine:
                return min(mine)
            slot = next(slot for slot in range(len(slots) + 1)
                        if slot not in slots or (slots[slot] not in live))
            slots[slot] = me
            if self.kv.compare_and_set(KEY, stored, _encode(slots)):
                return slot
        raise SlotsBusy(f"broker {me} could not take a slot: the slot map kept changing")
