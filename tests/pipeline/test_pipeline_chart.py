"""The audit report's chart, read as a reader reads it (without Spark): each burst is a red
band over the minutes it spans and is named in the legend, its label stays inside the
plot (also at the right edge), the time axis gives hours and minutes and the date, and an
empty chart says why; the PNG is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from pipeline.audit.chart import BURST_COLOR, NO_EVENTS, chart_figure, day_number, draw_chart

MINUTE = 60_000
BASE = 1_790_000_000_000 // MINUTE * MINUTE  # 2026-09-21 14:13 UTC


def minute_rows(counts: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    return [{"minute": BASE + i * MINUTE, "login_failures": f, "denials": d,
             "rejected_connections": r} for i, (f, d, r) in enumerate(counts)]


ROWS = minute_rows([(1, 0, 0), (0, 2, 0), (6, 0, 1), (0, 0, 0), (2, 1, 0), (0, 0, 0),
                    (0, 1, 0), (0, 0, 2), (12, 0, 0)])
EARLY = {"source": "127.0.0.1", "failures": 6, "first_failure": BASE + 2 * MINUTE + 1_000,
         "last_failure": BASE + 2 * MINUTE + 3_000}
LATE = {"source": "203.0.113.77", "failures": 12, "first_failure": BASE + 8 * MINUTE + 5_000,
        "last_failure": BASE + 8 * MINUTE + 9_000}


@pytest.fixture
def figure() -> Iterator[Figure]:
    made = chart_figure(ROWS, [EARLY, LATE])
    made.canvas.draw()
    yield made
    plt.close(made)


def burst_bands(figure: Figure) -> list[Rectangle]:
    red = to_rgba(BURST_COLOR)[:3]
    return [p for p in figure.axes[0].patches
            if isinstance(p, Rectangle) and p.get_facecolor()[:3] == red]


def test_bursts_are_red_bands_over_their_minutes_and_in_the_legend(figure: Figure) -> None:
    bands = sorted(burst_bands(figure), key=lambda p: p.get_x())
    assert len(bands) == 2
    for band, burst in zip(bands, (EARLY, LATE), strict=True):
        minute = burst["first_failure"] // MINUTE * MINUTE
        assert band.get_x() == pytest.approx(day_number(minute))
        assert band.get_width() == pytest.approx(day_number(MINUTE))  # the whole minute
        red, green, blue, alpha = band.get_facecolor()
        assert red > 0.7 and green < 0.3 and blue < 0.3 and alpha >= 0.2
    legend = figure.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "failed logins", "denials", "rejected connections", "password-guessing burst"]
    # the bars are drawn over the bands, so their colours stay their own
    bars = [p for p in figure.axes[0].patches if p not in bands]
    assert min(b.get_zorder() for b in bars) > max(b.get_zorder() for b in bands)


def test_burst_labels_stay_inside_the_plot(figure: Figure) -> None:
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    box = axes.get_window_extent(renderer)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in axes.texts}
    assert set(labels) == {"127.0.0.1: 6 failures", "203.0.113.77: 12 failures"}
    for text, extent in labels.items():
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, text


def test_time_axis_gives_hours_minutes_and_the_date(figure: Figure) -> None:
    axes = figure.axes[0]
    ticks = [t.get_text() for t in axes.get_xticklabels() if t.get_text()]
    assert len(ticks) >= 3
    assert all(len(t) == 5 and t[2] == ":" for t in ticks), ticks
    assert axes.get_xlabel() == "time (UTC), 2026-09-21"


def test_a_report_over_days_dates_every_tick() -> None:
    rows = [{"minute": BASE + i * 7 * 3600_000, "login_failures": 1, "denials": 0,
             "rejected_connections": 0} for i in range(12)]
    made = chart_figure(rows, [])
    try:
        made.canvas.draw()
        ticks = [t.get_text() for t in made.axes[0].get_xticklabels() if t.get_text()]
        assert ticks and all(t.startswith("2026-09-") and ":" in t for t in ticks), ticks
    finally:
        plt.close(made)


def test_an_empty_chart_says_why(tmp_path: Path) -> None:
    made = chart_figure([], [], events=0)
    try:
        assert [t.get_text() for t in made.axes[0].texts] == [NO_EVENTS]
        assert "logins" in NO_EVENTS
    finally:
        plt.close(made)
    made = chart_figure([], [], events=7)
    try:
        assert [t.get_text() for t in made.axes[0].texts] == [
            "no failed logins, denials or rejected connections among 7 audit events"]
    finally:
        plt.close(made)
    path = draw_chart(ROWS, [LATE], tmp_path / "chart" / "failures_per_minute.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
