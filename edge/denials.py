"""Authorization denials and failed logins, reported within bounds: a WARNING line and an
audit event each, at most ``auditDenialsPerWindow`` of them per subject per window of
``auditDenialWindowMs``; the ones beyond are counted, and when the window ends one line
and one audit event say how many were left out (``common.windows.Windows``, the one home
of that rule).

A denial's subject is its tenant, principal and API. Each refused check is a denial, and
one request may name thousands of resources (a Metadata or DescribeGroups naming 20,000
names of another tenant wrote 20,000 events into the audit topic, which no tenant's quota
covers, and 20,000 log lines): so a client can at most make the broker write
``auditDenialsPerWindow + 1`` events per API per window, whatever it sends. (``edge.audit``
also writes an identical denial once per second.)

A rejected connection (a failed TLS handshake, a frame too large before a login, a
connection over a cap: :class:`Rejections`) is bounded the same way per peer host and
listener, and all of them together by ``auditRejectionsPerWindow``: one client looping
connections that fail their TLS handshake wrote 2,000 events in 0.6 s, and the sockets of
many addresses (an IPv6 prefix has more than enough) would each have their own share.
Those beyond are counted in ``kop_server_rejected_connections`` and summed up in one event
per window.

A failed login's subject is the peer's host and the listener (:class:`LoginFailures`):
a client with no credentials at all looping connect, SaslHandshake, SaslAuthenticate with
a bad token on 64 sockets wrote 206 events a second (5.5 GB of audit topic a day) and as
many log lines. A request before a login on a SASL listener counts as a failed login.
All hosts' failed logins together are bounded by ``auditLoginFailuresPerWindow``, as
rejected connections are: each of many addresses had its own share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_core.context import Operation, RequestContext, ResourceType
from common.log_fields import log_fields
from common.windows import Window, Windows
from edge.audit import AuditEvent

log = logging.getLogger(__name__)
_Subject = tuple[str, str, str]
"""Whose denials share a window: (tenant, principal, API)."""
_Peer = tuple[str, str]
"""Whose failed logins share a window: (peer host, listener)."""


class DenialReports:
    """Reports the policy's denials (``Policy.on_denied``) to the log and the audit."""

    def __init__(self, record: Callable[[AuditEvent], None], per_window: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        """Where audit events go (``AuditLog.record``)."""
        self.windows: Windows[_Subject] = Windows(per_window, window_s, self._left_out,
                                                  clock)

    def denied(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
               name: str, reason: str) -> None:
        """One refused check: reported, or counted when its window has had its share."""
        if self.windows.take((ctx.home.tenant, ctx.principal, ctx.api), ctx.listener,
                             ctx.client_host):
            self._report(ctx, operation, resource, name, reason)

    def _left_out(self, subject: _Subject, window: Window) -> None:
        tenant, principal, api = subject
        share = self.windows.share()
        log.warning("authorization denied: %d more denials of %s (tenant %s, %s) left out "
                    "of the log and the audit (%s)", window.left_out, principal, tenant, api,
                    share, extra=log_fields(tenant=tenant, principal=principal,
                                            client=window.client or None,
                                            listener=window.listener))
        self.record(AuditEvent(
            kind="authorization", outcome="denied", listener=window.listener,
            client=window.client, principal=principal, tenant=tenant, api=api,
            reason=f"{window.left_out} more denials left out ({share})",
            count=window.left_out))

    def close_all(self) -> None:
        """Report what every open window left out (the broker stops)."""
        self.windows.close_all()

    def _report(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
                name: str, reason: str) -> None:
        what = {ResourceType.TOPIC: "topic", ResourceType.GROUP: "group"}.get(resource)
        log.warning("authorization denied: %s from %s may not %s %s %s (%s)", ctx.principal,
                    ctx.client_host or "?", operation.value, resource.value, name, reason,
                    extra=log_fields(**{**ctx.who(), **({what: name} if what else {})}))
        self.record(AuditEvent(
            kind="authorization", outcome="denied", listener=ctx.listener,
            client=ctx.client_host, principal=ctx.principal, tenant=ctx.home.tenant,
            api=ctx.api, resource=f"{resource.value}:{name}",
            reason=f"{operation.value} {reason}"))


_EVERYONE = "*"
"""The subject of an :class:`Overall` window: every address together."""


@dataclass(frozen=True)
class _Kind:
    """What an :class:`Overall` bound counts, as its line and event name it."""

    kind: str
    outcome: str
    line: str
    plural: str
    left_out_of: str


_FAILED_LOGINS = _Kind("authentication", "failure", "authentication failed", "failed logins",
                       "the log and the audit")
_REJECTED = _Kind("connection", "rejected", "connection rejected", "rejected connections",
                  "the audit")


class Overall:
    """At most ``total_per_window`` reports of one kind from every address together
    (the events counting what a host's window left out included); the ones beyond are
    counted into one line and one event at the window's end."""

    def __init__(self, record: Callable[[AuditEvent], None], total_per_window: int,
                 window_s: float, kind: _Kind, clock: Callable[[], float]) -> None:
        self.record = record
        self.kind = kind
        self.windows: Windows[str] = Windows(total_per_window, window_s, self._left_out,
                                             clock)

    def take(self, listener: str, client: str, count: int = 1,
             tenant: str | None = None) -> bool:
        """Whether one more report (standing for ``count``, naming ``tenant``) is made;
        False: counted."""
        return self.windows.take(_EVERYONE, listener, client, count, tenant)

    def _left_out(self, _subject: str, window: Window) -> None:
        kind = self.kind
        share = f"{self.windows.share()} from all addresses"
        log.warning("%s: %d more %s left out of %s (%s; the last from %s on %s)", kind.line,
                    window.left_out, kind.plural, kind.left_out_of, share, window.client,
                    window.listener,
                    extra=log_fields(client=window.client or None, listener=window.listener))
        self.record(AuditEvent(
            kind=kind.kind, outcome=kind.outcome, listener=window.listener,
            client=window.client, tenant=window.tenant,
            reason=f"{window.left_out} more {kind.plural} left out ({share})",
            count=window.left_out))

    def close_all(self) -> None:
        """Report what the open window left out (the broker stops)."""
        self.windows.close_all()


class LoginFailures:
    """Failed logins (and requests before a login), within bounds per peer host and
    listener and of every address together (:class:`Overall`): :meth:`take` says whether
    one is reported (the session then writes its line and its audit event); the ones
    beyond are counted into one line and one event per window."""

    def __init__(self, record: Callable[[AuditEvent], None], per_window: int,
                 total_per_window: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        """Where audit events go (``AuditLog.record``)."""
        self.windows: Windows[_Peer] = Windows(per_window, window_s, self._left_out, clock)
        self.overall = Overall(record, total_per_window, window_s, _FAILED_LOGINS, clock)

    def take(self, host: str, listener: str, peer: str, tenant: str | None = None) -> bool:
        """Whether a failed login of ``peer`` (``host``'s address and port) on
        ``listener``, naming ``tenant`` (None: none named), is reported; False: it is
        counted instead."""
        return self.windows.take((host, listener), listener, peer, tenant=tenant) and \
            self.overall.take(listener, peer, tenant=tenant)

    def _left_out(self, subject: _Peer, window: Window) -> None:
        host, listener = subject
        if not self.overall.take(listener, window.client or host, window.left_out,
                                 window.tenant):
            return
        share = self.windows.share()
        log.warning("authentication failed: %d more failed logins from %s on %s left out of "
                    "the log and the audit (%s)", window.left_out, host, listener, share,
                    extra=log_fields(client=window.client or host, listener=listener))
        self.record(AuditEvent(
            kind="authentication", outcome="failure", listener=listener,
            client=window.client or host, tenant=window.tenant,
            reason=f"{window.left_out} more failed logins left out ({share})",
            count=window.left_out))

    def close_all(self) -> None:
        """Report what every open window left out (the broker stops)."""
        self.windows.close_all()
        self.overall.close_all()


class Rejections:
    """Rejected connections to the audit, within bounds: at most ``per_window`` per peer
    host and listener, and ``total_per_window`` of every address together (the events
    counting what a host's window left out included); the ones beyond are counted into
    one event (and one line) at the window's end. The listener writes the log line of
    each rejection itself (limited per cause by the log's own limiter)."""

    def __init__(self, record: Callable[[AuditEvent], None], per_window: int,
                 total_per_window: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        """Where audit events go (``AuditLog.record``)."""
        self.windows: Windows[_Peer] = Windows(per_window, window_s, self._left_out, clock)
        self.overall = Overall(record, total_per_window, window_s, _REJECTED, clock)

    def rejected(self, listener: str, peer: str, reason: str) -> None:
        """A connection from ``peer`` (address and port) on ``listener`` was refused or
        closed before it was served, for ``reason``: audited, or counted."""
        host = peer.rsplit(":", 1)[0]
        if self.windows.take((host, listener), listener, peer) and \
                self.overall.take(listener, peer):
            self.record(AuditEvent(kind="connection", outcome="rejected", listener=listener,
                                   client=peer, reason=reason))

    def _left_out(self, subject: _Peer, window: Window) -> None:
        host, listener = subject
        share = self.windows.share()
        log.warning("connection rejected: %d more rejected connections from %s on %s left "
                    "out of the audit (%s)", window.left_out, host, listener, share,
                    extra=log_fields(client=window.client or host, listener=listener))
        if self.overall.take(listener, window.client or host, window.left_out):
            self.record(AuditEvent(
                kind="connection", outcome="rejected", listener=listener,
                client=window.client or host,
                reason=f"{window.left_out} more rejected connections left out ({share})",
                count=window.left_out))

    def close_all(self) -> None:
        """Report what every open window left out (the broker stops)."""
        self.windows.close_all()
        self.overall.close_all()
