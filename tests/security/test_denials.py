"""Denials are reported within bounds (``edge.denials``), driven by hand with a clock of
the test's: the first ``per_window`` of a tenant, principal and API are audit events, the
rest are counted into one event when the window ends; other subjects have windows of their
own. No event loop, so a window is closed by the next denial or by ``close_all``."""

from __future__ import annotations

from broker_core.context import Endpoint, Operation, RequestContext, ResourceType
from broker_core.naming import Namespace
from edge.audit import AuditEvent
from edge.denials import DenialReports, LoginFailures, Rejections


def context(principal: str, api: str, tenant: str = "b") -> RequestContext:
    return RequestContext(listener="SASL_PLAINTEXT", advertised=Endpoint("127.0.0.1", 9092),
                          principal=principal, home=Namespace(tenant, "default"),
                          client_id=None, api_version=0, client_host="10.0.0.9",
                          login_tenant=tenant, api=api)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_denials_beyond_the_window_share_are_counted_into_one_event() -> None:
    events: list[AuditEvent] = []
    clock = Clock()
    reports = DenialReports(events.append, per_window=3, window_s=10, clock=clock)
    bob, carol = context("bob", "Metadata"), context("carol", "Metadata")
    for i in range(1000):
        reports.denied(bob, Operation.DESCRIBE, ResourceType.TOPIC, f"a/default/x{i}",
                       "outside the login's tenant")
    reports.denied(context("bob", "Produce"), Operation.WRITE, ResourceType.TOPIC,
                   "a/default/y", "outside the login's tenant")
    reports.denied(carol, Operation.DESCRIBE, ResourceType.TOPIC, "a/default/z", "no")
    assert [e.resource for e in events] == [
        "Topic:a/default/x0", "Topic:a/default/x1", "Topic:a/default/x2",
        "Topic:a/default/y", "Topic:a/default/z"]
    assert [(e.principal, e.api) for e in events[3:]] == [("bob", "Produce"),
                                                        ("carol", "Metadata")]

    clock.now += 10  # the window ended: the next denial closes it first
    reports.denied(bob, Operation.DESCRIBE, ResourceType.TOPIC, "a/default/late", "no")
    summary, late = events[5:]
    assert (summary.kind, summary.outcome, summary.principal, summary.tenant,
            summary.api, summary.resource) == ("authorization", "denied", "bob", "b",
                                               "Metadata", None)
    assert summary.reason == "997 more denials left out (3 reported per 10 s)"
    assert summary.count == 997  # what the audit pipeline sums
    assert (summary.listener, summary.client) == ("SASL_PLAINTEXT", "10.0.0.9")
    assert late.resource == "Topic:a/default/late"

    for i in range(5):
        reports.denied(bob, Operation.DESCRIBE, ResourceType.TOPIC, f"a/default/w{i}", "no")
    reports.close_all()  # the broker stops: what was left out is still said
    assert [e.reason for e in events[-2:]] == [
        "Describe no", "3 more denials left out (3 reported per 10 s)"]
    reports.close_all()
    assert len(events) == 10  # nothing left out twice; windows without leftovers say nothing


def test_failed_logins_beyond_the_window_share_are_counted_per_host_and_listener() -> None:
    """The same bound, per peer host and listener: a client with no credentials looping
    failed logins gets ``per_window`` events, then one counting the rest; another host,
    or the same host on another listener, has a window of its own."""
    events: list[AuditEvent] = []
    clock = Clock()
    failures = LoginFailures(events.append, per_window=2, total_per_window=100, window_s=10,
                             clock=clock)
    taken = [failures.take("10.0.0.9", "SASL", f"10.0.0.9:{port}", "acme")
             for port in range(40000, 40500)]
    assert taken == [True, True] + [False] * 498 and events == []  # the session reports
    assert failures.take("10.0.0.8", "SASL", "10.0.0.8:1")
    assert failures.take("10.0.0.9", "OTHER", "10.0.0.9:2")
    clock.now += 10  # the window ended: the next failure closes it first
    assert failures.take("10.0.0.9", "SASL", "10.0.0.9:3")
    (summary,) = events
    assert (summary.kind, summary.outcome, summary.listener, summary.client,
            summary.principal, summary.tenant) == ("authentication", "failure", "SASL",
                                                   "10.0.0.9:40499", None, "acme")
    assert summary.reason == "498 more failed logins left out (2 reported per 10 s)"
    assert summary.count == 498  # what the audit pipeline sums, under the tenant named
    for tenant in ("acme", "acme", "acme", "other", "acme"):
        failures.take("10.0.0.9", "SASL", "10.0.0.9:4", tenant)
    failures.close_all()  # the broker stops: what was left out is still said
    assert events[-1].reason == "4 more failed logins left out (2 reported per 10 s)"
    assert (events[-1].count, events[-1].tenant) == (4, None)  # several tenants: none


def test_rejected_connections_are_bounded_per_host_and_listener_and_overall() -> None:
    """Rejected connections share ``per_window`` per peer host and listener, as failed
    logins do, and ``total_per_window`` across every address: the events counting what a
    host's window left out go through the overall window too, so many addresses cannot
    multiply the events; what the overall window left out is one event at its end."""
    events: list[AuditEvent] = []
    clock = Clock()
    rejections = Rejections(events.append, per_window=2, total_per_window=5, window_s=10,
                            clock=clock)
    for port in range(100):
        rejections.rejected("SSL", f"10.0.0.9:{port}", "TLS handshake failed")
    assert [e.client for e in events] == ["10.0.0.9:0", "10.0.0.9:1"]
    for host in range(20):
        rejections.rejected("SSL", f"10.0.1.{host}:7", "TLS handshake failed")
    assert len(events) == 5  # the overall share: three more hosts, then counted
    clock.now += 10  # every window ended: the next rejection closes its host's first,
    # whose summary closes the overall one
    rejections.rejected("SSL", "10.0.0.9:200", "TLS handshake failed")
    rejections.close_all()
    assert [e.reason for e in events[5:]] == [
        "17 more rejected connections left out (5 reported per 10 s from all addresses)",
        "98 more rejected connections left out (2 reported per 10 s)",
        "TLS handshake failed"]
    assert [e.count for e in events] == [1] * 5 + [17, 98, 1]
    assert all((e.kind, e.outcome, e.listener) == ("connection", "rejected", "SSL")
               for e in events)
    assert events[-1].client == "10.0.0.9:200"


def test_failed_logins_of_many_addresses_are_bounded_overall() -> None:
    """Each address had a share of its own: a client with many addresses (an IPv6 prefix
    holds more than enough) multiplied the failed-login lines and events. All of them
    together are bounded now, the per-host summaries included; what the overall window
    left out is one event (and one line) at its end."""
    events: list[AuditEvent] = []
    clock = Clock()
    failures = LoginFailures(events.append, per_window=2, total_per_window=5, window_s=10,
                             clock=clock)
    taken = [failures.take(f"2001:db8::{host:x}", "SASL", f"[2001:db8::{host:x}]:1")
             for host in range(1000)]
    assert taken == [True] * 5 + [False] * 995  # the session reports the five
    for _ in range(3):  # one host over its own share too: one more counted overall, two
        failures.take("2001:db8::1", "SASL", "[2001:db8::1]:2")  # in its own window
    clock.now += 10  # every window ended: the next failure closes its host's first
    assert failures.take("2001:db8::1", "SASL", "[2001:db8::1]:3")
    failures.close_all()
    assert [e.reason for e in events] == [
        "996 more failed logins left out (5 reported per 10 s from all addresses)",
        "2 more failed logins left out (2 reported per 10 s)"]
    assert sum(e.count for e in events) + 5 + 1 == 1004  # every failed login counted once
    assert all((e.kind, e.outcome, e.listener) == ("authentication", "failure", "SASL")
               for e in events)
