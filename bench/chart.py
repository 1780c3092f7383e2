"""The PNG chart: produce and consume MB/s per size and latency percentiles, side by side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.report import size_label

COLORS = {"edge": "#1f77b4", "tansu": "#ff7f0e"}
LABELS = {"edge": "this broker", "tansu": "Tansu"}


def _latency_pick(extra: int | None, key: str) -> Callable[[dict[str, Any]], float]:
    """Latency ``key`` of the main run (``extra`` None) or of an extra linger's run."""
    def pick(broker: dict[str, Any]) -> float:
        run = broker["latency"] if extra is None else broker["latency_extra"][extra]
        return float(run[key])
    return pick


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
    groups: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        (label, _latency_pick(None, key)) for label, key in
        (("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"))]
    for index, linger in enumerate(results["options"].get("extra_latency_lingers", [])):
        groups.append((f"p99\nlinger {linger:g}", _latency_pick(index, "p99_ms")))
    for i, name in enumerate(names):
        values = [float(pick(brokers[name])) for _, pick in groups]
        axes[2].bar([x + i * width for x in range(len(groups))], values, width,
                    label=LABELS[name], color=COLORS[name])
    opts = results["options"]
    axes[2].set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(groups))],
                       [label for label, _ in groups])
    axes[2].set_title(f"produce latency ms, {opts['rate']:,.0f}/s x "
                      f"{size_label(opts['latency_size'])}, linger {opts['linger_ms']:g}",
                      fontsize=10)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
