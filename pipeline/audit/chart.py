"""The report's PNG: failed logins, denials and rejected connections per minute, with
the bursts shaded."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BAR_DAYS = 1 / 1440  # one minute
MIN_SPAN_DAYS = 1 / 86400  # a burst within one second still shows as a line


def day_number(epoch_ms: int) -> float:
    """Matplotlib's date number: days since 1970-01-01 UTC."""
    return epoch_ms / 86_400_000


SERIES = (("login_failures", "failed logins"), ("denials", "denials"),
          ("rejected_connections", "rejected connections"))


def draw_chart(per_minute: list[Any], bursts: list[Any], path: Path) -> Path:
    """Write the chart of ``failures_per_minute`` rows (summed over tenants) to ``path``;
    times (``minute``, ``first_failure``, ``last_failure``) are epoch milliseconds."""
    totals: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in per_minute:
        for column, _label in SERIES:
            totals[row["minute"]][column] += int(row[column] or 0)
    minutes = sorted(totals)
    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=100)
    try:
        if minutes:
            x = [day_number(m) for m in minutes]
            bottom = [0] * len(minutes)
            for column, label in SERIES:
                heights = [totals[m][column] for m in minutes]
                axes.bar(x, heights, width=BAR_DAYS, bottom=bottom, label=label, edgecolor="white",
                         align="edge")
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
            top = max(bottom)
            for burst in bursts:
                first, last = day_number(burst["first_failure"]), day_number(burst["last_failure"])
                axes.axvspan(first, max(last, first + MIN_SPAN_DAYS), color="red", alpha=0.3)
                axes.annotate(f'{burst["source"]} x{burst["failures"]}', (first, top),
                              xytext=(3, -12), textcoords="offset points", color="darkred",
                              fontsize=8)
            axes.set_xlim(x[0] - BAR_DAYS / 4, x[-1] + BAR_DAYS * 1.25)
            axes.xaxis_date()
            axes.legend(loc="upper left")
            figure.autofmt_xdate()
        else:
            axes.text(0.5, 0.5, "no failed logins, denials or rejected connections",
                      ha="center", va="center", transform=axes.transAxes)
        axes.set_title(f"Security events per minute (UTC); password-guessing bursts in red "
                       f"({len(bursts)})")
        axes.set_ylabel("events")
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
    finally:
        plt.close(figure)
    return path
