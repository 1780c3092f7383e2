"""The pacer of connection teardowns (``listeners.pacing.TurnPacer``): at most
``per_turn`` callers pass per turn of the event loop, the others in order in later turns,
and a caller cancelled while it waits gives up its place."""

from __future__ import annotations

import asyncio

from listeners.pacing import TurnPacer


def test_callers_pass_a_few_per_turn_in_order() -> None:
    async def scenario() -> tuple[list[list[int]], list[int]]:
        pacer = TurnPacer(3)
        order: list[int] = []
        turns: list[list[int]] = []

        async def caller(n: int) -> None:
            await pacer.turn()
            order.append(n)

        tasks = [asyncio.create_task(caller(n)) for n in range(10)]
        while not all(task.done() for task in tasks):
            seen = len(order)
            await asyncio.sleep(0)  # one turn of the loop
            if len(order) > seen:
                turns.append(order[seen:])
        return turns, order

    turns, order = asyncio.run(scenario())
    assert order == list(range(10))
    assert all(len(turn) <= 3 for turn in turns), turns


def test_a_cancelled_waiter_gives_up_its_place_and_the_pacer_goes_on() -> None:
    async def scenario() -> list[str]:
        pacer = TurnPacer(1)
        order: list[str] = []

        async def caller(name: str) -> None:
            await pacer.turn()
            order.append(name)

        first = asyncio.create_task(caller("first"))
        gone = asyncio.create_task(caller("gone"))
        last = asyncio.create_task(caller("last"))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(first, gone, last, return_exceptions=True)
        await pacer.turn()  # an idle pacer lets a caller through at once
        order.append("later")
        return order

    assert asyncio.run(scenario()) == ["first", "last", "later"]
