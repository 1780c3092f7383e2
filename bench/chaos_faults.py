"""The faults of a chaos run, one after another at seeded random moments: which kind, on
which broker, how long; each one recorded as a :class:`Fault` (its start and end on the
run's clock) for the summary and to name the fault just before a violation.

Kinds: ``kill9`` (kill -9 of a broker, restarted after a moment), ``sigterm`` (a clean
stop, restarted; a non-zero exit is noted), ``sigstop`` (a broker paused for longer than
``brokerSessionTimeoutMs``, so that the others take its partitions, then resumed), ``cut``
(a broker cut off from the database for as long, the others not: its statements still run
there but no answer comes back, then its connections are dropped), ``pg_restart``
(PostgreSQL stopped with a fast shutdown and started again) and ``pg_pause`` (every
PostgreSQL process paused briefly). A broker found dead that no fault killed is noted as
``exited`` and started again.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field

from bench.chaos_cluster import ChaosCluster

KINDS = ("kill9", "sigterm", "sigstop", "cut", "pg_restart", "pg_pause")


@dataclass
class Fault:
    """One fault: kind, the broker it hit (None: the database), when (seconds since the
    run's start) and what came of it."""

    kind: str
    broker: int | None
    started: float
    ended: float = 0.0
    detail: str = ""

    def label(self) -> str:
        """``kind`` with its target and time, for a violation's line."""
        target = "database" if self.broker is None else f"broker {self.broker}"
        note = f", {self.detail}" if self.detail else ""
        return f"{self.kind} of {target} at {self.started:.1f}-{self.ended:.1f} s{note}"


@dataclass
class FaultPlan:
    """How often and how hard: a gap of ``gap_s`` (min, max) between faults; a paused
    broker stays paused ``session_s`` plus up to 2 s."""

    seed: int
    gap_s: tuple[float, float]
    session_s: float
    kinds: tuple[str, ...] = KINDS
    faults: list[Fault] = field(default_factory=list)


class Injector(threading.Thread):
    """Injects faults into ``cluster`` until :meth:`finish`; the clock starts at ``t0``."""

    def __init__(self, cluster: ChaosCluster, plan: FaultPlan, t0: float) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.cluster, self.plan, self.t0 = cluster, plan, t0
        self.random = random.Random(plan.seed)
        self._done = threading.Event()
        self.error: BaseException | None = None

    def now(self) -> float:
        """Seconds since the run's start."""
        return time.monotonic() - self.t0

    def finish(self) -> None:
        """No new fault; the one under way ends (its broker or database back up)."""
        self._done.set()
        self.join(300)

    def run(self) -> None:
        try:
            while not self._done.wait(self.random.uniform(*self.plan.gap_s)):
                self._revive_the_dead()
                self.inject(self.random.choice(self.plan.kinds))
            self._revive_the_dead()
        except BaseException as exc:  # the run reports it; the load goes on meanwhile
            self.error = exc

    def _revive_the_dead(self) -> None:
        for broker_id in range(len(self.cluster.members)):
            member = self.cluster.broker(broker_id)
            if not member.alive():
                fault = Fault("exited", broker_id, self.now(),
                              detail=f"exit status {member.exit_code()}, no fault sent")
                self.cluster.restart(broker_id)
                fault.ended = self.now()
                self.plan.faults.append(fault)

    def inject(self, kind: str) -> Fault:
        """One fault of ``kind`` (on a random broker for the broker kinds), to its end."""
        rnd = self.random
        broker = rnd.randrange(len(self.cluster.members)) if not kind.startswith("pg_") else None
        fault = Fault(kind, broker, self.now())
        self.plan.faults.append(fault)
        if kind == "kill9" and broker is not None:
            self.cluster.kill(broker)
            time.sleep(rnd.uniform(0.2, 3.0))
            self.cluster.restart(broker)
        elif kind == "sigterm" and broker is not None:
            status = self.cluster.terminate(broker)
            if status != 0:
                fault.detail = f"exit status {status} after SIGTERM"
            time.sleep(rnd.uniform(0.2, 2.0))
            self.cluster.restart(broker)
        elif kind == "sigstop" and broker is not None:
            member = self.cluster.broker(broker)
            paused = self.plan.session_s + rnd.uniform(0.5, 2.0)
            member.signal(signal.SIGSTOP)
            try:
                time.sleep(paused)
            finally:
                member.signal(signal.SIGCONT)
            fault.detail = f"paused {paused:.1f} s"
        elif kind == "cut" and broker is not None:
            held = self.plan.session_s + rnd.uniform(0.5, 2.0)
            dropped = self.cluster.cut_off(broker, held)
            fault.detail = f"cut off {held:.1f} s, {dropped} connections dropped"
        elif kind == "pg_restart":
            down = rnd.uniform(0.2, 3.0)
            self.cluster.restart_database(down)
            fault.detail = f"down {down:.1f} s"
        elif kind == "pg_pause":
            paused = rnd.uniform(0.5, 3.0)
            count = self.cluster.pause_database(paused)
            fault.detail = f"{count} processes paused {paused:.1f} s"
        else:
            raise ValueError(f"unknown fault {kind!r} ({', '.join(KINDS)})")
        fault.ended = self.now()
        return fault
