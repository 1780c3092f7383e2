"""Summaries of py-spy's collapsed stacks (``--format raw``): self and total shares.

Each line is ``frame;frame;...;leaf COUNT`` with frames like
``PartitionLog.append (broker_core/storage/partition.py:188)``; a function is its frame
without the line number.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_LINE = re.compile(r":\d+\)$")


def function_of(frame: str) -> str:
    """``name (file:line)`` → ``name (file)``."""
    return _LINE.sub(")", frame.strip())


def file_of(frame: str) -> str:
    """The file a frame is in (``?`` when the frame names none)."""
    inner = frame[frame.rfind("(") + 1:].rstrip(")") if "(" in frame else "?"
    return inner.rsplit(":", 1)[0] if ":" in inner else inner


@dataclass
class Profile:
    """Sample counts: per leaf function (self), per function on the stack (total), per file."""

    samples: int = 0
    self_counts: Counter[str] = field(default_factory=Counter)
    total_counts: Counter[str] = field(default_factory=Counter)
    file_counts: Counter[str] = field(default_factory=Counter)

    def add(self, frames: list[str], count: int) -> None:
        """Count one stack seen ``count`` times."""
        if not frames:
            return
        self.samples += count
        self.self_counts[function_of(frames[-1])] += count
        self.file_counts[file_of(frames[-1])] += count
        for name in {function_of(frame) for frame in frames}:
            self.total_counts[name] += count

    def top(self, counts: Counter[str], n: int) -> list[tuple[str, float, int]]:
        """The ``n`` largest: (name, share of all samples in %, samples)."""
        total = max(1, self.samples)
        return [(name, 100.0 * c / total, c) for name, c in counts.most_common(n)]


def parse(text: str) -> Profile:
    """Read collapsed stacks."""
    profile = Profile()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            profile.add(stack.split(";"), int(count))
    return profile


def render(profile: Profile, n: int = 15) -> str:
    """Three plain-text tables: self time, total time, self time per file."""
    parts = [f"{profile.samples} samples"]
    for title, counts in (("self (leaf) time", profile.self_counts),
                          ("total time (on the stack)", profile.total_counts),
                          ("self time per file", profile.file_counts)):
        parts.append(f"\n{title}:")
        parts += [f"  {share:5.1f}%  {samples:6d}  {name}"
                  for name, share, samples in profile.top(counts, n)]
    return "\n".join(parts)
