"""Process-wide tuning of CPython's cyclic garbage collector, applied once by the
composition root when the broker is up (:meth:`edge.app.BrokerApp.start`).

Why: the collector runs on the thread that allocates, the event loop's, and a collection
walks every tracked object of the generations it collects; meanwhile no client is served.
A probe of ``gc.callbacks`` in the broker during storms of 1,000 logins at once
(``bench.logins --storm-only``) found a full collection over the storm's connections in
most storms, 30-60 ms of CPU each, all new connections being alive and tracked (about 60
objects each: tasks, coroutines, futures, queues, transport, session).

- **Freeze after start-up** (:func:`settle`): modules, protocol schemas, the recovered logs
  live as long as the process; ``gc.freeze()`` takes them out of the collector's view, so
  no collection walks them again (a full collection of them took 24-50 ms). The price: a
  reference cycle among them (say, of a topic recovered at start and deleted later) is
  never collected; reference counting still frees the rest.
- **Full collections considered 10 times less often** (:data:`THRESHOLDS`): CPython 3.11
  collects generation 0 every 700 net allocations of container objects, generation 1 every
  10 of those, and considers a full collection every 10 generation-1 collections (run only
  when what reached the oldest generation since the last one exceeds a quarter of what it
  holds, which a storm's new connections always do). At 100, the storms measured ran none
  (full collections: 2 in 3 storms before). A larger generation-0 threshold was measured and
  not kept: at 5,000 a generation-1 collection held a whole storm's connections and took
  40-47 ms.
- This is safe because connections leave no cyclic garbage: a closed connection's objects
  are freed by reference counting as it closes (``gc.DEBUG_SAVEALL`` over a storm of 1,000
  logins collected nothing; a failed login left its whole connection in a cycle, through
  a frame holding the error its traceback held, until this was fixed;
  ``tests/security/test_connection_garbage.py`` keeps it so), so the rarer full
  collections leave little memory waiting.
"""

from __future__ import annotations

import gc

THRESHOLDS = (700, 10, 100)
"""``gc.set_threshold``: CPython's defaults (700, 10, 10) but for the last."""


def settle() -> None:
    """Collect once, freeze what start-up built, set :data:`THRESHOLDS` (call once the
    broker is up, before it serves)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
