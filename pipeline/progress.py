"""One line per Spark stage on stderr, so a job that runs for a minute is not a silent
minute: ``spark: stage 4 done (2 tasks, 3.1 s): save at ...`` when a stage finishes, and
``spark: stage 4 running for 30 s: 1/2 tasks done`` every ``heartbeat`` seconds while one
runs. A daemon thread polls the SparkContext's status tracker (py4j gives each Python
thread its own connection, so it does not disturb the driver's calls) and ends with the
context. Spark's own console progress bar stays off: it redraws one line with carriage
returns, which logs and pipes turn into noise."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from pyspark import SparkContext
from pyspark.core.status import SparkStageInfo

POLL_SECONDS = 0.5
HEARTBEAT_SECONDS = 15.0
KEEP_OPEN = 200
"""Stages followed at once (a skipped stage never completes: the oldest are let go)."""


def describe(info: SparkStageInfo, seconds: float) -> str:
    """The line for a finished stage."""
    took = f", {seconds:.1f} s" if seconds >= 0.1 else ""
    tasks = "1 task" if info.numTasks == 1 else f"{info.numTasks} tasks"
    failed = f", {info.numFailedTasks} failed" if info.numFailedTasks else ""
    return f"spark: stage {info.stageId} done ({tasks}{failed}{took}): {info.name}"


class StageProgress:
    """Prints a line when a stage of ``context`` completes, and a heartbeat line while one
    runs long; ``out`` defaults to the ``sys.stderr`` of the moment of each line."""

    def __init__(self, context: SparkContext, out: TextIO | None = None,
                 heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.context = context
        self.out = out
        self.heartbeat = heartbeat
        self.next_stage = 0
        self.open: dict[int, float] = {}  # stage id -> when first seen (monotonic)
        self.spoken: dict[int, float] = {}  # running stage id -> when last reported
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-stage-progress",
                                        daemon=True)

    def start(self) -> StageProgress:
        """Skip the stages already run, then follow the new ones in the background."""
        tracker = self.context.statusTracker()
        active = set(tracker.getActiveStageIds())
        while self.next_stage not in active and \
                tracker.getStageInfo(self.next_stage) is not None:
            self.next_stage += 1
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _say(self, line: str) -> None:
        out = self.out if self.out is not None else sys.stderr
        print(line, file=out, flush=True)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            if getattr(self.context, "_jsc", None) is None:
                return  # the context stopped
            try:
                self.poll()
            except Exception:  # the context is going away (py4j closed): end quietly
                return

    def poll(self) -> None:
        """Take in new stages, report finished ones and long runners."""
        tracker = self.context.statusTracker()
        now = time.monotonic()
        active = set(tracker.getActiveStageIds())
        top = max(active, default=-1)
        self.next_stage = max(self.next_stage, top - KEEP_OPEN)
        # stage ids count up: take every id up to the newest running or known one
        while self.next_stage <= top or tracker.getStageInfo(self.next_stage) is not None:
            self.open.setdefault(self.next_stage, now)
            self.next_stage += 1
        for stage, seen in sorted(self.open.items()):
            info = tracker.getStageInfo(stage)
            if info is None:
                del self.open[stage]
            elif info.numTasks and info.numCompletedTasks >= info.numTasks \
                    and stage not in active:
                self._say(describe(info, now - seen))
                del self.open[stage]
                self.spoken.pop(stage, None)
            elif stage in active and now - self.spoken.get(stage, seen) >= self.heartbeat:
                self._say(f"spark: stage {stage} running for {now - seen:.0f} s: "
                          f"{info.numCompletedTasks}/{info.numTasks} tasks done: {info.name}")
                self.spoken[stage] = now
        for stage in sorted(self.open)[:-KEEP_OPEN]:
            del self.open[stage]


_reporters: dict[int, StageProgress] = {}


def report_stages(context: SparkContext) -> StageProgress:
    """Start (once per context) the stage lines of ``context``."""
    reporter = _reporters.get(id(context))
    if reporter is None or not reporter._thread.is_alive():
        reporter = _reporters[id(context)] = StageProgress(context).start()
    return reporter
