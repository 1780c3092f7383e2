"""The ACL index decides exactly as a scan of every binding does (Kafka's rule, as the
broker applied it before the index: DENY wins, implied operations, the LITERAL wildcard
``*``, PREFIXED patterns, host and principal wildcards, per tenant), on randomized bindings
and checks with a fixed seed, and it follows the bindings as they change: CreateAcls,
DeleteAcls and another broker's change read in. Pure Python, no broker."""

from __future__ import annotations

import asyncio
import random

from broker_core.storage.memory import MemoryKeyValues
from edge.acl_index import AclIndex
from edge.acl_store import AclStore
from edge.acls import (
    WILDCARD,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPattern,
    AclPermission,
    AclResource,
)

TENANTS = ("a", "b")
RESOURCES = (AclResource.TOPIC, AclResource.GROUP, AclResource.TRANSACTIONAL_ID)
PRINCIPALS = ("User:u1", "User:u2", "User:*")
HOSTS = ("10.0.0.1", "10.0.0.2", WILDCARD)
OPERATIONS = tuple(op for op in AclOperation if op != AclOperation.ANY)
ALPHABET = "ab/*"
"""Few letters, so that names and prefixes share starts and a radix tree splits edges."""

Check = tuple[str, AclResource, str, str, str, AclOperation]


def scanned(bindings: frozenset[AclBinding], tenant: str, resource: AclResource, name: str,
            principal: str, host: str, operation: AclOperation) -> bool:
    """The reference: every binding looked at, as the broker did before the index."""
    allowed = False
    for binding in bindings:
        if binding.tenant != tenant or binding.resource != resource:
            continue
        if binding.principal not in (principal, "User:*") or \
                binding.host not in (host, WILDCARD):
            continue
        if not binding.covers(name) or not binding.grants(operation):
            continue
        if binding.permission == AclPermission.DENY:
            return False
        allowed = True
    return allowed


def random_name(rng: random.Random, longest: int = 6) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest)))


def random_binding(rng: random.Random) -> AclBinding:
    pattern = rng.choice((AclPattern.LITERAL, AclPattern.PREFIXED))
    name = WILDCARD if rng.random() < 0.1 else random_name(rng)
    return AclBinding(rng.choice(TENANTS), rng.choice(RESOURCES), name, pattern,
                      rng.choice(PRINCIPALS), rng.choice(HOSTS), rng.choice(OPERATIONS),
                      rng.choice((AclPermission.ALLOW, AclPermission.DENY)))


def random_checks(rng: random.Random, bindings: frozenset[AclBinding],
                  count: int) -> list[Check]:
    """Checks on random names, and on names the bindings hold or extend (so that literal
    and prefixed bindings match often)."""
    stored = [b.name for b in bindings] or [""]
    checks: list[Check] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.4:
            name = rng.choice(stored) + (random_name(rng, 3) if roll < 0.2 else "")
        elif roll < 0.45:
            name = WILDCARD
        else:
            name = random_name(rng, 8)
        checks.append((rng.choice((*TENANTS, "c")), rng.choice(RESOURCES), name,
                       rng.choice((*PRINCIPALS, "User:u3")),
                       rng.choice((*HOSTS[:2], "10.0.0.3")), rng.choice(OPERATIONS)))
    return checks


def assert_decides_as_scan(store: AclStore, checks: list[Check]) -> None:
    bindings = store.bindings
    for check in checks:
        assert store.decide(*check) == scanned(bindings, *check), (check, sorted(
            (b for b in bindings if b.tenant == check[0] and b.resource == check[1]),
            key=repr))


def test_the_index_decides_as_a_scan_of_every_binding() -> None:
    rng = random.Random(20261127)
    for size in (0, 1, 5, 40, 300):
        for _ in range(8):
            bindings = frozenset(random_binding(rng) for _ in range(size))
            index = AclIndex(bindings)
            for check in random_checks(rng, bindings, 400):
                assert index.decide(*check) == scanned(bindings, *check), (check, bindings)


def test_nested_and_parting_prefixes() -> None:
    """Prefixes inside each other and parting inside an edge, added in every order."""
    rng = random.Random(7)
    names = ["", "a", "ab", "abc", "abd", "abcd", "b", "ba", "x/y/", "x/y/z", "x/", WILDCARD]
    for _ in range(50):
        rng.shuffle(names)
        bindings = frozenset(
            AclBinding("a", AclResource.TOPIC, name, AclPattern.PREFIXED, "User:u1", WILDCARD,
                       AclOperation.READ,
                       AclPermission.DENY if name == "abd" else AclPermission.ALLOW)
            for name in names)
        index = AclIndex(bindings)
        for name in ("", "a", "ab", "abc", "abcd", "abcde", "abd", "abdx", "ac", "b", "bab",
                     "x", "x/", "x/y", "x/y/", "x/y/zz", "*", "*a", "c"):
            check: Check = ("a", AclResource.TOPIC, name, "User:u1", "h", AclOperation.READ)
            assert index.decide(*check) == scanned(bindings, *check), name


def test_the_index_follows_the_bindings_as_they_change() -> None:
    """Two stores on one key-value area are two brokers: each one's CreateAcls and
    DeleteAcls, and the other's read in, are decided on at once."""
    rng = random.Random(11)
    kv = MemoryKeyValues()
    here, there = AclStore(kv), AclStore(kv)
    for _ in range(30):
        added = [random_binding(rng) for _ in range(rng.randint(1, 20))]
        asyncio.run((here if rng.random() < 0.5 else there).add(added))
        checks = random_checks(rng, here.bindings | there.bindings | frozenset(added), 100)
        assert_decides_as_scan(here, checks)  # decides, so the index is built now
        victim = rng.choice(added)
        asyncio.run(there.delete([AclFilter(victim.tenant, victim.resource, victim.name,
                                            victim.pattern, None, None, AclOperation.ANY,
                                            AclPermission.ANY)]))
        assert_decides_as_scan(there, checks)
        asyncio.run(here.read_again())
        assert here.bindings == there.bindings
        assert_decides_as_scan(here, checks)
