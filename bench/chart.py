"""The PNG chart: produce and consume MB/s per size and latency percentiles, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import size_label

COLORS = {"edge": "#1f77b4", "tansu": "#ff7f0e"}
LABELS = {"edge": "this broker", "tansu": "Tansu"}


def write_chart(results: dict[str, Any], path: Path) -> bool:
    """Draw the chart into ``path``; False (and no file) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    brokers = results["brokers"]
    sizes: list[int] = results["options"]["sizes"]
    names = [name for name in ("edge", "tansu") if name in brokers]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=80)
    width = 0.8 / max(1, len(names))
    for ax, phase in zip(axes[:2], ("produce", "consume"), strict=True):
        for i, name in enumerate(names):
            values = [row[phase]["mb_per_s"] for row in brokers[name]["throughput"]]
            xs = [x + i * width for x in range(len(values))]
            ax.bar(xs, values, width, label=LABELS[name], color=COLORS[name])
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(sizes))],
                      [size_label(s) for s in sizes])
        ax.set_title(f"{phase} MB/s" + (" (acks=all)" if phase == "produce" else ""))
        ax.legend(fontsize=8)
    keys = [("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")]
    for i, name in enumerate(names):
        values = [brokers[name]["latency"][key] for key, _ in keys]
        ax = axes[2]
        ax.bar([x + i * width for x in range(len(keys))], values, width,
               label=LABELS[name], color=COLORS[name])
    opts = results["options"]
    axes[2].set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(keys))],
                       [label for _, label in keys])
    axes[2].set_title(f"produce latency ms at {opts['rate']:,.0f}/s x "
                      f"{size_label(opts['latency_size'])}")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
