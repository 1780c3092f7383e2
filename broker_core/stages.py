"""The two stages of a request, and the rule that keeps one connection's requests in order.

A handler's coroutine is the request's *dispatch stage*: the listener runs the dispatch
stages of one connection strictly one after another, in arrival order, each to its end
(however many awaits it holds) before the next request is even decoded. Whatever a
request does to the broker's state (a produce's append that assigns offsets, a group
member joining, a transaction adding partitions, an offset commit and its fsync) belongs
in that stage, so no later request of the connection can overtake it. This is Kafka's
guarantee (its socket server mutes a connection while a request is handled), kept by the
structure rather than by where a handler happens to await.

A handler may end its dispatch stage early by returning :class:`Later`: the rest of the
work is a *waiting stage* that overlaps with the next requests of the connection. Only
waits that change nothing a later request could observe belong there: a produce's wait for
its commit or fsync (its offsets are assigned already), a fetch's long poll (it reads as
of when it answers, as any long poll does), a JoinGroup or SyncGroup member's wait for the
rest of its group (the member is registered already). These are also the waits that may
take long or depend on other requests; in a waiting stage they never hold up a heartbeat
behind them. Responses leave in request order whatever the stages take.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class Later(Generic[_T_co]):
    """A handler's answer whose dispatch stage is over: ``wait`` gives the response (None:
    none is due) and may overlap with the connection's next requests."""

    wait: Awaitable[_T_co]


async def _answered(waiting: Awaitable[_T], answer: Callable[[_T], _R]) -> _R:
    return answer(await waiting)


def answer_later(waiting: Awaitable[_T], answer: Callable[[_T], _R]) -> Later[_R]:
    """The waiting stage that answers with ``answer`` of what ``waiting`` gives."""
    return Later(_answered(waiting, answer))
