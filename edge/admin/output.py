"""What an admin verb answers, printed as aligned tables (the default) or as JSON.

A :class:`Report` has named fields, tables and, for the text form, a last line (a token
is printed alone on its last line). In JSON it is one object: the fields, then each table
as a list of objects keyed by column. Text cells are escaped (``sasl.printable``), so a
topic or group name cannot break a table; JSON escapes them itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TextIO

from sasl.printable import escape_controls

Cell = str | int | float | bool | None
OutputFormat = Literal["table", "json"]


@dataclass
class Table:
    """Rows under column names; ``name`` is its key in JSON."""

    name: str
    columns: tuple[str, ...]
    rows: list[tuple[Cell, ...]] = field(default_factory=list)

    def add(self, *cells: Cell) -> None:
        """Append one row (as many cells as columns)."""
        assert len(cells) == len(self.columns)
        self.rows.append(cells)


@dataclass
class Report:
    """A verb's answer; ``failed``: part of it was refused (the command exits 1)."""

    fields: dict[str, Cell] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    last: tuple[str, str] | None = None
    """``(key, text)``: the text alone on the last line; in JSON, a field ``key``."""
    failed: bool = False

    def table(self, name: str, *columns: str) -> Table:
        """A new table of this report."""
        table = Table(name, columns)
        self.tables.append(table)
        return table


def _text(cell: Cell) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, bool):
        return "true" if cell else "false"
    return escape_controls(str(cell))


def _aligned(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[str]:
    texts = [[c.upper() for c in columns], *[[_text(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in texts) for i in range(len(columns))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            .rstrip() for row in texts]


def render_text(report: Report) -> str:
    """The report as aligned text."""
    blocks: list[list[str]] = []
    if report.fields:
        width = max(len(name) for name in report.fields)
        blocks.append([f"{name.ljust(width)}  {_text(value)}"
                       for name, value in report.fields.items()])
    for table in report.tables:
        title = [f"{table.name}:"] if len(report.tables) > 1 or report.fields else []
        blocks.append(title + _aligned(table.columns, table.rows))
    lines = [line for index, block in enumerate(blocks)
             for line in ([""] if index else []) + block]
    if report.last is not None:
        lines.append(report.last[1])
    return "\n".join(lines)


def render_json(report: Report) -> str:
    """The report as one JSON object."""
    value: dict[str, object] = dict(report.fields)
    for table in report.tables:
        value[table.name] = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    if report.last is not None:
        value[report.last[0]] = report.last[1]
    return json.dumps(value, indent=2)


def emit(report: Report, output: OutputFormat, out: TextIO) -> None:
    """Print ``report`` in the chosen form."""
    text = render_json(report) if output == "json" else render_text(report)
    if text:
        print(text, file=out)
