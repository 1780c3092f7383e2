"""The broker's persisted ACL store: the bindings kept as one JSON document in the storage's
key-value area, shared by every broker of a cluster, and decided against through an
index (``edge.acl_index``) rebuilt whenever the bindings change, here or on another broker.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import fields

from broker_core.kv_document import KvDocument
from broker_core.storage import KeyValueStore
from edge.acl_index import AclIndex
from edge.acls import AclBinding, AclFilter, AclOperation, AclPattern, AclPermission, AclResource

KEY = "acls.json"
"""The ACLs' key in the storage's key-value area."""


def _parse(stored: bytes | None) -> frozenset[AclBinding]:
    if stored is None:
        return frozenset()
    return frozenset(AclBinding(
        item["tenant"], AclResource(item["resource"]), item["name"],
        AclPattern(item["pattern"]), item["principal"], item["host"],
        AclOperation(item["operation"]), AclPermission(item["permission"]))
        for item in json.loads(stored))


_FIELDS = tuple(field.name for field in fields(AclBinding))


def _encode(bindings: Iterable[AclBinding]) -> bytes:
    """One binding per line, in a stable order (each line by the C encoder: an indented
    document goes through the pure-Python one, which took seconds for 20,000 bindings)."""
    rows = sorted((b.tenant, int(b.resource), b.name, int(b.pattern), b.principal, b.host,
                   int(b.operation), int(b.permission)) for b in bindings)
    lines = ",\n".join(json.dumps(dict(zip(_FIELDS, row, strict=True))) for row in rows)
    return f"[\n{lines}\n]".encode() if rows else b"[]"


class AclStore:
    """The ACL bindings, kept as JSON under ``acls.json`` in the storage's key-value area
    (a :class:`~broker_core.kv_document.KvDocument`: changes by compare-and-set, so no
    change is lost; :meth:`read_again` takes in other brokers' changes)."""

    def __init__(self, kv: KeyValueStore) -> None:
        self.document = KvDocument(kv, KEY, _parse, _encode)
        self._indexed: frozenset[AclBinding] | None = None
        """The bindings ``_index`` was built from."""
        self._index = AclIndex(())
        self._counted: frozenset[AclBinding] | None = None
        """The bindings ``_counts`` were counted from."""
        self._counts: Counter[str] = Counter()

    @property
    def bindings(self) -> frozenset[AclBinding]:
        """The bindings as last read or written."""
        return self.document.value

    async def read_again(self) -> None:
        """Take in the stored bindings if another broker changed them."""
        await self.document.read_again()

    async def add(self, bindings: Iterable[AclBinding]) -> None:
        """Add bindings (adding an existing one changes nothing), in a worker thread
        (``KvDocument.change``)."""
        added = frozenset(bindings)
        await self.document.change(lambda current: current | added)

    def tenant_counts(self) -> Counter[str]:
        """The bindings of each tenant (a copy to change; counted again only after the
        bindings change, as the index is built again)."""
        bindings = self.bindings
        if bindings is not self._counted:
            self._counts, self._counted = Counter(b.tenant for b in bindings), bindings
        return self._counts.copy()

    def find(self, selector: AclFilter) -> list[AclBinding]:
        """Bindings selected by the filter, in a stable order."""
        return self._sorted(b for b in self.bindings if selector.matches(b))

    @staticmethod
    def _sorted(bindings: Iterable[AclBinding]) -> list[AclBinding]:
        return sorted(bindings, key=lambda b: (b.resource, b.name, b.pattern, b.principal,
                                               b.host, b.operation, b.permission))

    async def delete(self, selectors: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Remove the bindings selected by any of the filters, in one change (a DeleteAcls
        of many filters stored the whole document once per filter); return each filter's,
        a binding under the first filter that selects it."""
        doomed: list[list[AclBinding]] = []

        def without(current: frozenset[AclBinding]) -> frozenset[AclBinding]:
            doomed[:] = [[] for _ in selectors]
            for binding in current:
                for selected, selector in zip(doomed, selectors, strict=True):
                    if selector.matches(binding):
                        selected.append(binding)
                        break
            return current.difference(b for selected in doomed for b in selected)
        if selectors:
            await self.document.change(without)
        return [self._sorted(selected) for selected in doomed]

    @property
    def index(self) -> AclIndex:
        """The bindings indexed. It follows them: every change, made here or read in from
        another broker, replaces them, and the first check after it rebuilds the index."""
        bindings = self.bindings
        if bindings is not self._indexed:
            self._index, self._indexed = AclIndex(bindings), bindings
        return self._index

    def decide(self, tenant: str, resource: AclResource, name: str, principal: str,
               host: str, operation: AclOperation) -> bool:
        """Kafka's rule: any matching DENY refuses; else any matching ALLOW grants (see
        :meth:`AclIndex.decide`)."""
        return self.index.decide(tenant, resource, name, principal, host, operation)

    def allows_something(self, tenant: str, principal: str, host: str) -> bool:
        """Whether any ALLOW binding of ``tenant`` applies to ``principal`` from ``host``:
        what a login to the tenant needs (the bindings as they stand, so a change applies
        to the next login)."""
        return self.index.allows_something(tenant, principal, host)

    def decide_any(self, tenant: str | None, resource: AclResource, principal: str,
                   host: str, operation: AclOperation) -> bool:
        """Kafka's ``authorizeByResourceType`` (see :meth:`AclIndex.decide_any`)."""
        return self.index.decide_any(tenant, resource, principal, host, operation)
