"""Plain-text tables for the terminal: one header line, a rule, one line per row."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeAlias

# Any: a Spark row's columns hold values of whatever SQL type the column has (numbers,
# strings, lists); readers index rows by the column they know.
ReportRow: TypeAlias = "dict[str, Any]"
"""One row of a report table, by column name."""


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value)
    return str(value)


def format_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``title`` above an aligned table (numbers right-aligned), or ``(none)``."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows)
               for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [title, line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells] if cells else ["(none)"]
    return "\n".join(out)
