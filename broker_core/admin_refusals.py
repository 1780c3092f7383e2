"""Admin refusals to the log: one INFO line per topic or resource an admin request
(CreateTopics, CreatePartitions, DeleteTopics, AlterConfigs, IncrementalAlterConfigs,
DeleteRecords) refused, saying the API, the client's name for it, the error and who asked.

Bounded: the name and the message are cut to :data:`NAME_LIMIT` and :data:`MESSAGE_LIMIT`
characters (the broker's log formatter escapes them), and at most :data:`PER_WINDOW` lines
per tenant and API per window of :data:`WINDOW_S` (``common.windows``, the rule of the
authorization denials); the ones beyond are counted into one line when the window ends. So
an application that creates its topics at every start (TOPIC_ALREADY_EXISTS each time), or
a client that sends thousands of bad names, writes a few lines, not one per name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker_core.context import RequestContext
from broker_core.errors import ErrorCode, KafkaApiError
from common.log_fields import log_fields
from common.windows import Window, Windows

log = logging.getLogger(__name__)
PER_WINDOW = 20
"""Refusal lines written per tenant and API per window."""
WINDOW_S = 60.0
"""The window's length, in seconds."""
NAME_LIMIT = 200
"""The most characters of a client's name for a resource a line shows."""
MESSAGE_LIMIT = 300
"""The most characters of a refusal's message a line shows."""

_Subject = tuple[str, str]
"""Whose refusals share a window: (tenant, API)."""


def cut(text: str | None, limit: int) -> str:
    """``text`` cut to ``limit`` characters for a log line, saying how long it was."""
    text = "" if text is None else text
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class AdminRefusals:
    """The admin handlers' refusals, logged within bounds (:meth:`refused`)."""

    def __init__(self, per_window: int = PER_WINDOW, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.windows: Windows[_Subject] = Windows(per_window, window_s, self._left_out,
                                                  clock)

    def refused(self, ctx: RequestContext, what: str, name: str | None,
                error: KafkaApiError) -> None:
        """``ctx``'s request refused the ``what`` (topic, resource, ...) it calls ``name``
        with ``error``: one line, or counted when the window has had its share."""
        if not self.windows.take((ctx.home.tenant, ctx.api), ctx.listener, ctx.client_host):
            return
        log.info("%s refused %s %r: %s (%s) for %s from %s", ctx.api or "admin request",
                 what, cut(name, NAME_LIMIT), ErrorCode(error.code).name,
                 cut(error.message, MESSAGE_LIMIT), ctx.principal or "?",
                 ctx.client_host or "?", extra=log_fields(**ctx.who()))

    def _left_out(self, subject: _Subject, window: Window) -> None:
        tenant, api = subject
        log.info("%s: %d more refusals of tenant %s left out of the log (%s)", api or "admin",
                 window.left_out, tenant, self.windows.share(),
                 extra=log_fields(tenant=tenant, client=window.client or None,
                                  listener=window.listener))

    def close_all(self) -> None:
        """Log what every open window left out (the broker stops)."""
        self.windows.close_all()
