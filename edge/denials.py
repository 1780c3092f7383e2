"""Authorization denials, reported within bounds: a WARNING line and an audit event each,
at most ``auditDenialsPerWindow`` of them per tenant, principal and API per window of
``auditDenialWindowMs``; the ones beyond are counted, and when the window ends one line
and one audit event say how many were left out.

Each refused check is a denial, and one request may name thousands of resources (a
Metadata or DescribeGroups naming 20,000 names of another tenant wrote 20,000 events into
the audit topic, which no tenant's quota covers, and 20,000 log lines): so a client can
at most make the broker write ``auditDenialsPerWindow + 1`` events per API per window,
whatever it sends. (``edge.audit`` also writes an identical denial once per second.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_core.context import Operation, RequestContext, ResourceType
from common.log_fields import log_fields
from edge.audit import AuditEvent

log = logging.getLogger(__name__)
_MAX_WINDOWS = 10_000
"""Windows kept open at once (beyond, the oldest is closed early: its count reported)."""

_Subject = tuple[str, str, str]
"""Whose denials share a window: (tenant, principal, API)."""


@dataclass(slots=True)
class _Window:
    """One subject's denials since its window began."""

    ends: float
    written: int = 0
    left_out: int = 0
    listener: str = ""
    client: str = ""
    """Where the last left-out denial came from (for the event that counts them)."""


class DenialReports:
    """Reports the policy's denials (``Policy.on_denied``) to the log and the audit."""

    def __init__(self, record: Callable[[AuditEvent], None], per_window: int, window_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        """Where audit events go (``AuditLog.record``)."""
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        self._windows: dict[_Subject, _Window] = {}

    def denied(self, ctx: RequestContext, operation: Operation, resource: ResourceType,
               name: str, reason: str) -> None:
        """One refused check: reported, or counted when its window has had its share."""
        now = self.clock()
        subject = (ctx.home.tenant, ctx.principal, ctx.api)
        window = self._windows.get(subject)
        if window is not None and now >= window.ends:  # no timer closed it (no loop)
            self._close(subject, window)
            window = None
        if window is None:
            window = self._open(subject, now)
        if window.written < self.per_window:
            window.written += 1
            self._report(ctx, operation, resource, name, reason)
            return
        window.left_out += 1
        window.listener, window.client = ctx.listener, ctx.client_host
        if window.left_out == 1:
            # without an event loop (a tool) the next denial closes it
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(window.ends - now, self._close,
                                                      subject, window)

    def _open(self, subject: _Subject, now: float) -> _Window:
        if len(self._windows) >= _MAX_WINDOWS:
            for other, window in list(self._windows.items()):
                if now >= window.ends:
                    self._close(other, window)
            if len(self._windows) >= _MAX_WINDOWS:
                oldest = next(iter(self._windows))
                self._close(oldest, self._windows[oldest])
        window = self._windows[subject] = _Window(now + self.window_s)
        return window

    def _close(self, subject: _Subject, window: _Window) -> None:
        """End ``window`` (if it is still the subject's): report what it left out."""
        if self._windows.get(subject) is not window:
            return
        del self._windows[subject]
        if not window.left_out:
            return
        tenant, principal, api = subject
        log.warning("authorization denied: %d more denials of %s (tenant %s, %s) left out "
                    "of the log and the audit (%d reported per %g s)", window.left_out,
                    principal, tenant, api, self.per_window, self.window_s,
                    extra=log_fields(tenant=tenant, principal=principal,
                                      client=window.client or None,
                                      listener=window.listener))
        self.record(AuditEvent(
            kind="authorization", outcome="denied", listener=window.listener,
            client=window.client, principal=principal, tenant=tenant, api=api,
            reason=f"{window.left_out} more denials left out ({self.per_window} reported "
                   f"per {self.window_s:g} s)"))

    def close_all(self) -> None:
        """Report what every open window left out (the broker stops)."""
        for subject, window in list(self._windows.items()):
            self._close(subject, window)

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
