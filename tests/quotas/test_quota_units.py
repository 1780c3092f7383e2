"""Client quotas without a socket: entities and Kafka's precedence (plus tenants and
namespaces), the store shared through the key-value area, and the sliding-window rate and
throttle time (with explicit clocks: no sleeping, no timing)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.quotas.admission import Admission
from broker_core.quotas.entities import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONTROLLER_MUTATION_RATE,
    IP,
    MAX_CONNECTIONS,
    MAX_PARTITIONS,
    MAX_STORED_BYTES,
    MAX_TOPICS,
    NAMESPACE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    TENANT,
    USER,
    Caller,
    EntityError,
    QuotaEntity,
    check_value,
    ip_value,
    resolve,
    tenant_values,
)
from broker_core.quotas.limits import TenantLimits
from broker_core.quotas.manager import QuotaManager
from broker_core.quotas.notices import Intervals, Notices
from broker_core.quotas.rates import SlidingRate, Window
from broker_core.quotas.store import Alteration, QuotaStore
from broker_core.storage.config import LogConfig
from broker_core.storage.file_kv import FileKeyValues
from broker_core.storage.memory import MemoryKeyValues, MemoryStorage
from tests.storage_helpers import TopicReadsCounted

WHO = Caller(user="alice", client_id="app", tenant="acme", namespace="acme/prod")
P = PRODUCER_BYTE_RATE

LEVELS = [  # most specific first, with who shares the measured rate
    (((USER, "alice"), (CLIENT_ID, "app")), (USER, "alice", CLIENT_ID, "app")),
    (((USER, "alice"), (CLIENT_ID, None)), (USER, "alice", CLIENT_ID, "app")),
    (((USER, "alice"),), (USER, "alice")),
    (((USER, None), (CLIENT_ID, "app")), (USER, "alice", CLIENT_ID, "app")),
    (((USER, None), (CLIENT_ID, None)), (USER, "alice", CLIENT_ID, "app")),
    (((USER, None),), (USER, "alice")),
    (((CLIENT_ID, "app"),), (CLIENT_ID, "app")),
    (((CLIENT_ID, None),), (CLIENT_ID, "app")),
    (((NAMESPACE, "acme/prod"),), (NAMESPACE, "acme/prod")),
    (((NAMESPACE, None),), (NAMESPACE, "acme/prod")),
    (((TENANT, "acme"),), (TENANT, "acme")),
    (((TENANT, None),), (TENANT, "acme")),
]


def test_the_most_specific_entity_wins_at_every_level() -> None:
    quotas = {QuotaEntity.of(parts): {P: float(1000 + level)}
              for level, (parts, _) in enumerate(LEVELS)}
    for level, (parts, shared_by) in enumerate(LEVELS):
        applied = resolve(quotas, WHO, {P: 1.0})[P]
        assert (applied[0].value, applied[0].shared_by) == (1000 + level, shared_by), parts
        # the tenant's own value (its quota, then the default tenant's) is a ceiling
        tenant = 1010.0 if level <= 10 else 1011.0
        assert [(a.value, a.shared_by) for a in applied[1:]] == (
            [(tenant, (TENANT, "acme"))] if level < 10 else []), parts
        del quotas[QuotaEntity.of(parts)]
    applied = resolve(quotas, WHO, {P: 1.0})[P]
    assert [(a.value, a.shared_by) for a in applied] == [(1.0, (TENANT, "acme"))]
    assert resolve(quotas, WHO, {}) == {}


def test_a_namespace_quota_cannot_lift_the_tenants() -> None:
    quotas = {QuotaEntity.of([(TENANT, "acme")]): {P: 1000.0},
              QuotaEntity.of([(NAMESPACE, "acme/prod")]): {P: 10_000.0}}
    applied = resolve(quotas, WHO, {P: 5.0})[P]
    assert [(a.value, a.shared_by) for a in applied] == [
        (10_000.0, (NAMESPACE, "acme/prod")), (1000.0, (TENANT, "acme"))]
    # without a tenant quota, the configured default is the ceiling
    del quotas[QuotaEntity.of([(TENANT, "acme")])]
    assert [a.value for a in resolve(quotas, WHO, {P: 5.0})[P]] == [10_000.0, 5.0]


def test_the_tenant_ceiling_binds_over_every_namespace_together() -> None:
    store = QuotaStore(MemoryKeyValues())
    asyncio.run(store.alter([
        Alteration(QuotaEntity.of([(TENANT, "acme")]), {P: 1000.0}, frozenset()),
        Alteration(QuotaEntity.of([(NAMESPACE, None)]), {P: 10_000.0}, frozenset())]))
    manager = QuotaManager(store, {}, Window(samples=2, size_s=1.0))
    prod = WHO
    dev = Caller("bob", "app", "acme", "acme/dev")
    # each namespace alone is within its own 10 000/s, the tenant together is not
    assert manager.charge_caller(prod, P, 800, now=0.0) is None
    throttle = manager.charge_caller(dev, P, 800, now=0.0)
    assert throttle is not None and throttle.shared_by == (TENANT, "acme")


def test_each_key_resolves_on_its_own_and_other_callers_are_not_matched() -> None:
    quotas = {QuotaEntity.of([(USER, "alice")]): {REQUEST_PERCENTAGE: 20.0},
              QuotaEntity.of([(TENANT, "acme")]): {P: 500.0},
              QuotaEntity.of([(TENANT, "other")]): {P: 1.0}}
    found = resolve(quotas, WHO, {})
    assert found[REQUEST_PERCENTAGE][0].value == 20 and found[P][0].value == 500
    stranger = Caller("bob", "x", "other", "other/default")
    assert set(resolve(quotas, stranger, {})) == {P}


@pytest.mark.parametrize("parts", [
    [("ip", "not-an-address")], [("ip", "1.2.3.4"), (USER, "a")],
    [("group", "g")], [(USER, "a"), (USER, "b")],
    [(TENANT, "a"), (USER, "b")], [(NAMESPACE, "no-slash")], [(TENANT, "bad name")], [],
])
def test_entities_kafka_would_refuse_are_refused(parts: list[tuple[str, str | None]]) -> None:
    with pytest.raises(EntityError):
        QuotaEntity.of(parts)


USER_BOB = QuotaEntity.of([(USER, "bob")])
AN_IP = QuotaEntity.of([(IP, "10.0.0.1")])
A_TENANT = QuotaEntity.of([(TENANT, "acme")])


@pytest.mark.parametrize(("entity", "key", "value"), [
    (USER_BOB, "unknown_rate", 1.0), (USER_BOB, P, 0.0), (USER_BOB, P, -5.0),
    (USER_BOB, P, 1.5), (USER_BOB, REQUEST_PERCENTAGE, -1.0),
    (AN_IP, CONTROLLER_MUTATION_RATE, 10.0), (USER_BOB, CONTROLLER_MUTATION_RATE, 0.0),
    (USER_BOB, P, float("inf")),
    (USER_BOB, P, float("nan")), (AN_IP, P, 100.0), (USER_BOB, MAX_TOPICS, 5.0),
    (QuotaEntity.of([(NAMESPACE, "acme/prod")]), MAX_STORED_BYTES, 5.0),
    (A_TENANT, MAX_PARTITIONS, 2.5), (AN_IP, CONNECTION_CREATION_RATE, 0.0),
])
def test_values_kafka_would_refuse_are_refused(entity: QuotaEntity, key: str,
                                               value: float) -> None:
    with pytest.raises(EntityError):
        check_value(entity, key, value)


@pytest.mark.parametrize(("entity", "key", "value"), [
    (USER_BOB, REQUEST_PERCENTAGE, 12.5), (AN_IP, CONNECTION_CREATION_RATE, 0.5),
    (QuotaEntity.of([(IP, None)]), CONNECTION_CREATION_RATE, 10.0),
    (A_TENANT, CONNECTION_CREATION_RATE, 3.0), (A_TENANT, MAX_CONNECTIONS, 10.0),
    (QuotaEntity.of([(TENANT, None)]), MAX_STORED_BYTES, 1e9),
    (QuotaEntity.of([(IP, "::1")]), CONNECTION_CREATION_RATE, 1.0),
    (USER_BOB, CONTROLLER_MUTATION_RATE, 0.5), (A_TENANT, CONTROLLER_MUTATION_RATE, 10.0),
    (QuotaEntity.of([(USER, None), (CLIENT_ID, "app")]), CONTROLLER_MUTATION_RATE, 2.0),
])
def test_values_a_broker_keeps(entity: QuotaEntity, key: str, value: float) -> None:
    check_value(entity, key, value)


def test_an_ip_quota_falls_back_to_the_default_ip() -> None:
    quotas = {AN_IP: {CONNECTION_CREATION_RATE: 1.0},
              QuotaEntity.of([(IP, None)]): {CONNECTION_CREATION_RATE: 5.0}}
    assert ip_value(quotas, "10.0.0.1") == 1.0 and ip_value(quotas, "10.0.0.2") == 5.0
    assert ip_value({}, "10.0.0.1") is None


def test_the_tenant_caps_resolve_over_the_tenant_levels() -> None:
    quotas = {QuotaEntity.of([(TENANT, None)]): {MAX_TOPICS: 10.0},
              A_TENANT: {MAX_TOPICS: 20.0}}
    assert tenant_values(quotas, "acme", {MAX_TOPICS: 5.0, MAX_PARTITIONS: 50.0}) == {
        MAX_TOPICS: 20.0, MAX_PARTITIONS: 50.0}
    assert tenant_values(quotas, "other", {MAX_TOPICS: 5.0}) == {MAX_TOPICS: 10.0}


def test_two_stores_on_one_area_see_each_others_changes(tmp_path: Path) -> None:
    first, second = QuotaStore(FileKeyValues(tmp_path)), QuotaStore(FileKeyValues(tmp_path))
    user = QuotaEntity.of([(USER, "alice")])
    tenant = QuotaEntity.of([(TENANT, "acme")])
    asyncio.run(first.alter([Alteration(user, {P: 100.0}, frozenset())]))
    # read-modify-write: kept
    asyncio.run(second.alter([Alteration(tenant, {P: 200.0}, frozenset())]))
    asyncio.run(first.read_again())
    assert dict(first.quotas) == {user: {P: 100.0}, tenant: {P: 200.0}}
    asyncio.run(first.alter([Alteration(user, {}, frozenset({P}))]))
    asyncio.run(second.read_again())
    assert dict(second.quotas) == {tenant: {P: 200.0}}
    assert dict(QuotaStore(FileKeyValues(tmp_path)).quotas) == {tenant: {P: 200.0}}


def test_a_rate_is_measured_over_at_least_the_whole_window() -> None:
    rate = SlidingRate(Window(samples=11, size_s=1.0))
    rate.record(5_000, now=100.0)
    # 0.5 s elapsed, counted with 10 more whole windows (Kafka's Rate)
    assert rate.rate(100.5) == pytest.approx(5_000 / 10.5)
    assert rate.throttle_ms(1000, 100.5) == 0
    rate.record(15_000, now=100.6)  # 20000 bytes over 10.6 s: the quota is 1000/s
    # until the rate is back at the quota: (R - Q) / Q * elapsed
    assert rate.throttle_ms(1000, 100.6) == int((20_000 / 10.6 - 1000) / 1000 * 10.6 * 1000)
    assert rate.rate(112.0) == 0  # every sample has left the window


def test_a_throttle_is_at_most_the_whole_window() -> None:
    rate = SlidingRate(Window(samples=3, size_s=1.0))
    rate.record(1e9, now=0.0)
    assert rate.throttle_ms(1.0, 0.0) == 3000
    rate.record(-1e9, now=0.1)  # taken back
    assert rate.throttle_ms(1.0, 0.1) == 0


def test_a_throttle_fits_the_answers_int32_field() -> None:
    """3600 samples of 3600 s span 12,960,000,000 ms: the throttle stops at 2**31 - 1."""
    rate = SlidingRate(Window(samples=3600, size_s=3600.0))
    rate.record(1e15, now=0.0)
    assert rate.throttle_ms(1.0, 0.0) == 2**31 - 1


def test_peek_reads_the_rate_without_changing_it() -> None:
    rate = SlidingRate(Window(samples=3, size_s=1.0))
    rate.record(3000, now=10.0)
    rate.record(1000, now=11.5)
    assert rate.peek(11.5) == pytest.approx(rate.rate(11.5))
    assert rate.peek(20.0) == 0 and rate.rate(11.6) > 0


def _manager(*changes: Alteration) -> QuotaManager:
    store = QuotaStore(MemoryKeyValues())
    asyncio.run(store.alter(list(changes)))
    return QuotaManager(store, {}, Window(samples=2, size_s=1.0))


def test_max_connections_admits_until_the_cap_and_counts_closes() -> None:
    admission = Admission(_manager(Alteration(A_TENANT, {MAX_CONNECTIONS: 2.0}, frozenset())))
    assert admission.admit(WHO, now=0.0) is None and admission.admit(WHO, now=0.0) is None
    refused = admission.admit(WHO, now=0.0)
    assert refused is not None and str(refused) == "max_connections 2 of tenant/acme reached"
    assert admission.admit(Caller("bob", "", "other", "other/default"), now=0.0) is None
    admission.release(WHO)
    assert admission.admit(WHO, now=0.0) is None and admission.open["acme"] == 2


def test_a_refused_connection_counts_for_nothing() -> None:
    manager = _manager(
        Alteration(A_TENANT, {CONNECTION_CREATION_RATE: 2.0}, frozenset()),
        Alteration(QuotaEntity.of([(IP, None)]), {CONNECTION_CREATION_RATE: 1.0}, frozenset()))
    admission = Admission(manager)
    assert [admission.admit(WHO, now=0.0) is None for _ in range(4)] == [
        True, True, False, False]
    assert admission.admit(WHO, now=1.5) is None  # the window moved on; refusals not kept
    assert manager.connect_from("10.0.0.9", now=0.0) is None
    assert manager.connect_from("10.0.0.9", now=0.0) == 1.0
    assert manager.connect_from("10.0.0.8", now=0.0) is None  # one rate per address


def test_notices_log_one_line_per_subject_per_interval(caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    notices = Notices(logging.getLogger("test.notices"), interval_s=10.0)
    with caplog.at_level(logging.WARNING, "test.notices"):
        for at in (0.0, 1.0, 2.0, 11.0):
            notices.warn("a", "refused a", now=at)
        notices.warn("b", "refused b", now=2.0)
    assert [r.getMessage() for r in caplog.records] == [
        "refused a", "refused a (2 more like it since the last line)", "refused b"]


def test_max_connections_counts_the_other_brokers_connections() -> None:
    elsewhere = {"acme": 2}  # as the other brokers of a cluster last published
    admission = Admission(_manager(Alteration(A_TENANT, {MAX_CONNECTIONS: 3.0}, frozenset())),
                          lambda tenant: elsewhere.get(tenant, 0))
    assert admission.admit(WHO, now=0.0) is None
    refused = admission.admit(WHO, now=0.0)
    assert refused is not None and str(refused) == "max_connections 3 of tenant/acme reached"
    elsewhere["acme"] = 1  # one closed on another broker
    assert admission.admit(WHO, now=0.0) is None and admission.open["acme"] == 2


def test_intervals_let_the_first_event_per_subject_and_interval_through() -> None:
    intervals = Intervals(interval_s=5.0)
    assert [intervals.due("a", now=at) for at in (0.0, 1.0, 4.9, 5.0, 6.0, 10.5)] == [
        0, None, None, 2, None, 1]
    assert intervals.due(("b", 1), now=1.0) == 0  # subjects are apart


def test_stored_bytes_are_summed_per_tenant_without_the_brokers_own_topics() -> None:
    storage = MemoryStorage(LogConfig(), lambda: 0)
    limits = TenantLimits(_manager(Alteration(A_TENANT, {MAX_STORED_BYTES: 100.0},
                                              frozenset())),
                          storage, lambda name: name.startswith("public/__kafka/"), 1.0)
    limits.took_sizes({"acme/a/t": 60, "acme/b/u": 50, "other/a/t": 500,
                       "public/__kafka/__audit": 10_000})
    assert limits.stored == {"acme": 110, "other": 500}
    with pytest.raises(KafkaApiError) as refused:
        limits.check_produce("acme/a/t", 10)
    assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    limits.check_produce("other/a/t", 10)  # no cap
    limits.count_produced("other/a/t", 10)
    assert limits.stored["other"] == 510


def test_a_request_counts_the_tenants_topics_once() -> None:
    """A CreateTopics or CreatePartitions request checks each of its topics against its
    tenant's caps from one count of the topic list (not one per topic: O(its topics x all
    topics)), changed by what the request itself grows."""
    storage = TopicReadsCounted(LogConfig(), lambda: 0)
    for i in range(3):
        storage.create_topic(f"acme/a/t{i}", 2, {})
    storage.create_topic("other/a/t", 5, {})
    storage.create_topic("public/__kafka/__audit", 1, {})
    limits = TenantLimits(_manager(Alteration(A_TENANT, {MAX_TOPICS: 5.0,
                                                         MAX_PARTITIONS: 10.0},
                                              frozenset())),
                          storage, lambda name: name.startswith("public/__kafka/"), 1.0)
    counts = limits.topic_counts()
    assert storage.reads == 0  # counted when first asked for
    for _ in range(100):
        limits.check_create("acme/a/new", 2, 4, counts=counts)
    limits.check_create("other/a/new", 1000, 1000, counts=counts)  # no cap: not counted
    assert storage.reads == 1
    assert (counts.of("acme"), counts.of("other"), counts.of("public")) == (
        (3, 6), (1, 5), (0, 0))
    counts.add("acme", 0, 4)  # the request grew one of its topics by 4 partitions
    with pytest.raises(KafkaApiError) as refused:
        limits.check_create("acme/a/t0", 0, 1, counts=counts)
    assert refused.value.code == ErrorCode.POLICY_VIOLATION
    assert refused.value.message == ("tenant acme has 10 partitions; 1 more would exceed its "
                                     "max_partitions of 10")
    assert storage.reads == 1
    limits.check_create("acme/a/new", 2, 4)  # a check on its own counts for itself
    assert storage.reads == 2


def test_the_cluster_confirms_a_capped_tenants_connection() -> None:
    asked: list[tuple[str, int, int]] = []
    answer: list[bool | Exception] = [True]

    async def reserve(tenant: str, count: int, cap: int) -> bool:
        asked.append((tenant, count, cap))
        if isinstance(answer[0], Exception):
            raise answer[0]
        return answer[0]

    admission = Admission(_manager(Alteration(A_TENANT, {MAX_CONNECTIONS: 5.0}, frozenset())),
                          reserve=reserve)
    other = Caller("bob", "", "other", "other/default")
    assert asyncio.run(admission.admit_in_cluster(WHO)) is None
    assert asyncio.run(admission.admit_in_cluster(other)) is None  # no cap: nobody asked
    assert asked == [("acme", 1, 5)]
    answer[0] = False  # another broker took the last places meanwhile
    refused = asyncio.run(admission.admit_in_cluster(WHO))
    assert refused is not None and str(refused) == "max_connections 5 of tenant/acme reached"
    assert asked[-1] == ("acme", 2, 5) and admission.open["acme"] == 1
    answer[0] = OSError("the registry is away")  # this broker's own check decides
    assert asyncio.run(admission.admit_in_cluster(WHO)) is None
    assert admission.open["acme"] == 2
