"""The report's PNG: failed logins, denials and rejected connections per minute (stacked
bars), each password-guessing burst a red band over the minutes it spans, labelled with its
source and count and named in the legend; the time axis gives hours and minutes (UTC) and
the date."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.audit.table import ReportRow

MINUTE_MS = 60_000
BAR_DAYS = 1 / 1440  # one minute
MIN_SPAN_DAYS = 10 / 1440  # show at least ten minutes, so the ticks are minutes
BURST_COLOR = "tab:red"
SERIES = (("login_failures", "failed logins", "tab:blue"),
          ("denials", "denials", "tab:orange"),
          ("rejected_connections", "rejected connections", "tab:gray"))
NO_EVENTS = ("no audit events: the broker writes them where logins happen (SASL listeners),\n"
             "for authorization denials (authorizationEnabled=true) and rejected connections")


def day_number(epoch_ms: int) -> float:
    """Matplotlib's date number: days since 1970-01-01 UTC."""
    return epoch_ms / 86_400_000


def _utc(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC)


def _burst_minutes(burst: ReportRow) -> tuple[float, float]:
    """The band of a burst: from the start of its first failure's minute to the end of its
    last failure's minute, so it covers the bars that count it."""
    first = burst["first_failure"] // MINUTE_MS * MINUTE_MS
    last = burst["last_failure"] // MINUTE_MS * MINUTE_MS + MINUTE_MS
    return day_number(first), day_number(last)


def _time_axis(axes: Axes, first_ms: int, last_ms: int) -> None:
    """Ticks as HH:MM with the date in the axis label (or date and time on every tick when
    the report spans more than a day)."""
    start, end = _utc(first_ms), _utc(last_ms)
    within_a_day = end - start <= timedelta(days=1)
    pattern = "%H:%M" if within_a_day else "%Y-%m-%d\n%H:%M"
    locator = mdates.AutoDateLocator(minticks=3, maxticks=12, tz=UTC)  # type: ignore[no-untyped-call]
    formatter = mdates.DateFormatter(pattern, tz=UTC)  # type: ignore[no-untyped-call]
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(formatter)
    if within_a_day:
        days = start.strftime("%Y-%m-%d")
        if end.date() != start.date():
            days += end.strftime(" to %Y-%m-%d")
        axes.set_xlabel(f"time (UTC), {days}")
    else:
        axes.set_xlabel("time (UTC)")


def draw_chart(per_minute: list[ReportRow], bursts: list[ReportRow], path: Path,
               events: int | None = None) -> Path:
    """Write the chart of ``failures_per_minute`` rows (summed over tenants) to ``path``;
    times (``minute``, ``first_failure``, ``last_failure``) are epoch milliseconds.
    ``events``: how many audit events the report read (0 says why the chart is empty)."""
    figure = chart_figure(per_minute, bursts, events)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
    finally:
        plt.close(figure)
    return path


def chart_figure(per_minute: list[ReportRow], bursts: list[ReportRow],
                 events: int | None = None) -> Figure:
    """The chart as a matplotlib figure (the caller closes it)."""
    totals: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in per_minute:
        for column, _label, _color in SERIES:
            totals[row["minute"]][column] += int(row[column] or 0)
    figure, axes = plt.subplots(figsize=(11, 4.8), dpi=100)
    if totals:
        _plot(axes, totals, bursts)
    else:
        why = (NO_EVENTS if events == 0 else
               "no failed logins, denials or rejected connections"
               + (f" among {events} audit events" if events else ""))
        axes.text(0.5, 0.5, why, ha="center", va="center", transform=axes.transAxes)
        axes.set_xticks([])
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title("Security events per minute (UTC); password-guessing bursts in red "
                   f"({len(bursts)})")
    axes.set_ylabel("events")
    figure.tight_layout()
    return figure


def _plot(axes: Axes, totals: dict[int, dict[str, int]], bursts: list[ReportRow]) -> None:
    """Stacked bars per minute, a red band per burst, the legend and the time axis."""
    minutes = sorted(totals)
    x = [day_number(m) for m in minutes]
    first_x = min([x[0], *(_burst_minutes(b)[0] for b in bursts)])
    last_x = max([x[-1] + BAR_DAYS, *(_burst_minutes(b)[1] for b in bursts)])
    # a minute is a sliver on a report of days: draw at least 1/300 of the axis
    width = max(BAR_DAYS, (last_x - first_x) / 300)
    left = first_x - width / 2
    right = max(last_x + width, left + MIN_SPAN_DAYS)
    axes.set_xlim(left, right)
    bottom = [0] * len(minutes)
    handles: list[BarContainer | Patch] = []
    for column, label, color in SERIES:
        heights = [totals[m][column] for m in minutes]
        handles.append(axes.bar(x, heights, width=width, bottom=bottom, label=label,
                                color=color, edgecolor="white", linewidth=0.5, align="edge",
                                zorder=2))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    top = max(bottom)
    axes.set_ylim(0, top * 1.3 + 0.5)
    for burst in bursts:
        first, last = _burst_minutes(burst)
        last = max(last, first + width)
        axes.axvspan(first, last, facecolor=BURST_COLOR, alpha=0.22, edgecolor=BURST_COLOR,
                     linewidth=1.5, zorder=1)
        # the label stays inside the plot: left-aligned from the band's start, or
        # right-aligned to its end when the band is in the right third
        at_right = first > left + (right - left) * 2 / 3
        axes.annotate(f"{burst['source']}: {burst['failures']} failures",
                      (last if at_right else first, top * 1.15 + 0.25),
                      ha="right" if at_right else "left", va="bottom", color=BURST_COLOR,
                      fontsize=9, fontweight="bold", zorder=3)
    if bursts:
        handles.append(Patch(facecolor=BURST_COLOR, alpha=0.4, edgecolor=BURST_COLOR,
                             label="password-guessing burst"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    _time_axis(axes, minutes[0], minutes[-1] + MINUTE_MS)
