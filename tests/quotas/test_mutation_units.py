"""KIP-599's controller mutation quota without a socket, with explicit clocks (no sleeping,
no timing): the token bucket (full at first, a burst of quota x samples x window, paid
back at the quota), a strict request refused once a bucket is below zero (one request may
take it there), a permissive one done and throttled, the tenant's bucket as a ceiling,
and a broker without quotas counting nothing."""

from __future__ import annotations

import asyncio

import pytest

from broker_core.context import Endpoint, RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.naming import Namespace
from broker_core.quotas import mutations
from broker_core.quotas.entities import (
    CLIENT_ID,
    CONTROLLER_MUTATION_RATE,
    NAMESPACE,
    TENANT,
    USER,
    QuotaEntity,
)
from broker_core.quotas.manager import QuotaManager
from broker_core.quotas.mutations import (
    CREATE_PARTITIONS_KEY,
    CREATE_TOPICS_KEY,
    DELETE_TOPICS_KEY,
    MutationQuotas,
)
from broker_core.quotas.rates import TokenBucket, Window
from broker_core.quotas.store import Alteration, QuotaStore
from broker_core.storage.memory import MemoryKeyValues

M = CONTROLLER_MUTATION_RATE
WINDOW = Window(samples=2, size_s=1.0)


def _ctx(principal: str = "alice", client_id: str = "app", version: int = 7) -> RequestContext:
    return RequestContext("PLAINTEXT", Endpoint("127.0.0.1", 9092), principal,
                          Namespace("acme", "prod"), client_id, version)


def _quotas(*values: tuple[tuple[tuple[str, str | None], ...], float]) -> MutationQuotas:
    store = QuotaStore(MemoryKeyValues())
    asyncio.run(store.alter([Alteration(QuotaEntity.of(parts), {M: value}, frozenset())
                             for parts, value in values]))
    return MutationQuotas(QuotaManager(store, {}, WINDOW))


def test_a_bucket_starts_full_and_pays_a_burst_back_at_the_quota() -> None:
    bucket = TokenBucket(WINDOW)
    assert not bucket.exhausted(2.0, now=10.0)  # full: 2/s x 2 samples x 1 s = 4
    bucket.take(4, 2.0, now=10.0)
    assert not bucket.exhausted(2.0, now=10.0)  # at zero: not exceeded yet
    bucket.take(3, 2.0, now=10.0)
    assert bucket.exhausted(2.0, now=10.0)
    assert bucket.throttle_ms(2.0, now=10.0) == 1500  # 3 credits at 2/s
    assert bucket.throttle_ms(2.0, now=11.0) == 500
    assert not bucket.exhausted(2.0, now=11.5)
    assert not bucket.full(11.5) and bucket.full(13.5)  # refilled up to the burst only
    bucket.take(4, 2.0, now=100.0)
    assert not bucket.exhausted(2.0, now=100.0)


def test_a_strict_request_is_accepted_until_the_quota_is_exceeded() -> None:
    quotas = _quotas((((USER, "alice"),), 1.0))  # a burst of 2
    quota = quotas.begin(_ctx(), CREATE_TOPICS_KEY, 6)
    quota.record(1, now=0.0)
    quota.record(2, now=0.0)  # not exceeded before: accepted, 1 below zero
    with pytest.raises(KafkaApiError) as refused:
        quota.record(1, now=0.0)
    assert refused.value.code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert "controller_mutation_rate 1 of user/alice exceeded" in refused.value.message
    assert quota.throttle_ms() == 1000  # what the refusal earned
    # the refused topic counted nothing: 1 s later a new request passes
    later = quotas.begin(_ctx(), CREATE_TOPICS_KEY, 7)
    later.record(1, now=1.0)
    assert later.throttle_ms() == 0  # accepted, so not throttled (as Kafka's strict quota)


def test_older_versions_are_recorded_and_throttled() -> None:
    quotas = _quotas((((USER, "alice"),), 1.0))
    for api_key, version in ((CREATE_TOPICS_KEY, 5), (CREATE_PARTITIONS_KEY, 2),
                             (DELETE_TOPICS_KEY, 4)):
        quota = quotas.begin(_ctx(version=version), api_key, version)
        for _ in range(3):
            quota.record(2, now=0.0)  # never refused
    # 2 - 18 = -16 credits at 1/s
    assert quota.throttle_ms() == 16_000


@pytest.mark.parametrize(("api_key", "strict_since"), [
    (CREATE_TOPICS_KEY, 6), (CREATE_PARTITIONS_KEY, 3), (DELETE_TOPICS_KEY, 5)])
def test_the_strict_versions_are_kip_599s(api_key: int, strict_since: int) -> None:
    quotas = _quotas((((USER, "alice"),), 1.0))
    assert quotas.begin(_ctx(), api_key, strict_since).strict
    assert not quotas.begin(_ctx(), api_key, strict_since - 1).strict


def test_the_tenant_bucket_is_a_ceiling_over_a_larger_namespace_quota() -> None:
    quotas = _quotas((((TENANT, "acme"),), 1.0), (((NAMESPACE, "acme/prod"),), 100.0))
    quota = quotas.begin(_ctx(), CREATE_TOPICS_KEY, 7)
    quota.record(5, now=0.0)
    with pytest.raises(KafkaApiError) as refused:
        quota.record(1, now=0.0)
    assert "of tenant/acme" in refused.value.message
    assert quota.throttle_ms() == 3000
    # another user of the tenant shares the tenant's bucket
    with pytest.raises(KafkaApiError):
        quotas.begin(_ctx(principal="bob"), CREATE_TOPICS_KEY, 7).record(1, now=0.0)


def test_the_most_specific_quota_and_its_sharer_apply() -> None:
    quotas = _quotas((((USER, "alice"),), 0.5), (((CLIENT_ID, "app"),), 1000.0),
                     (((USER, "alice"), (CLIENT_ID, "batch")), 1000.0))
    alice = quotas.begin(_ctx(), CREATE_TOPICS_KEY, 7)
    alice.record(2, now=0.0)  # the user's quota: a burst of 1
    with pytest.raises(KafkaApiError):
        alice.record(1, now=0.0)
    # the same user with another client id: its user and client id quota
    quotas.begin(_ctx(client_id="batch"), CREATE_TOPICS_KEY, 7).record(50, now=0.0)
    # another user with the client id: the client id's quota
    bob = quotas.begin(_ctx(principal="bob"), CREATE_TOPICS_KEY, 7)
    for _ in range(10):
        bob.record(100, now=0.0)
    assert bob.throttle_ms() == 0


def test_nothing_is_counted_without_quotas() -> None:
    quota = mutations.begin(None, _ctx(), CREATE_TOPICS_KEY, 7)
    for _ in range(100):
        quota.record(10_000, now=0.0)
    assert quota.throttle_ms() == 0
    unlimited = _quotas().begin(_ctx(), CREATE_TOPICS_KEY, 7)
    assert not unlimited.applied
