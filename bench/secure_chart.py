"""The PNG of the TLS and login rows (``bench/results/secure.png``): MB/s per listener
against half the AES-GCM limit, logins per broker core against half the signature-check
limit, and the producer's p99 with and without login storms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"PLAINTEXT": "#7f7f7f", "SSL": "#1f77b4", "SASL_SSL": "#2ca02c"}


def write_chart(tls: dict[str, Any] | None, logins: dict[str, Any] | None,
                path: Path) -> bool:
    """Draw what there is into ``path``; False (and no file) without matplotlib or data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if tls is None and logins is None:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=80)
    if tls is not None:
        rows = tls["rows"]
        sizes = sorted({row["size"] for row in rows.values()})
        protocols = [p for p in COLORS if any(r["protocol"] == p for r in rows.values())]
        width = 0.8 / len(protocols)
        labels = [f"{phase} {size // 1024} KiB" for size in sizes
                  for phase in ("produce", "consume")]
        for i, protocol in enumerate(protocols):
            values = [rows[f"{size} {protocol}"][phase]["mb_per_s"] for size in sizes
                      for phase in ("produce", "consume")]
            axes[0].bar([x + i * width for x in range(len(values))], values, width,
                        label=protocol, color=COLORS[protocol])
        half = tls["limit_aes_128_gcm_mb_per_s"]["16384"] / 2
        axes[0].axhline(half, color="red", linestyle="--", label="target: 50% of AES-GCM")
        axes[0].set_xticks([x + width * (len(protocols) - 1) / 2 for x in range(len(labels))],
                           labels, fontsize=8)
        axes[0].set_title("TLS: MB/s (C client)")
        axes[0].legend(fontsize=7)
    if logins is not None:
        kinds = list(logins["rows"])
        got = [logins["rows"][k]["distinct"]["logins_per_broker_cpu_s"] for k in kinds]
        same = [logins["rows"][k]["same"]["logins_per_broker_cpu_s"] for k in kinds]
        half = [logins["rows"][k]["limit"]["signature_checks_per_s"] / 2 for k in kinds]
        xs = range(len(kinds))
        axes[1].bar([x - 0.27 for x in xs], got, 0.27, label="a token per login")
        axes[1].bar(list(xs), same, 0.27, label="one token for all")
        axes[1].bar([x + 0.27 for x in xs], half, 0.27, label="target: 50% of limit",
                    color="#d62728")
        axes[1].set_yscale("log")
        axes[1].set_xticks(list(xs), kinds, fontsize=8)
        axes[1].set_title("logins per broker CPU second (log)")
        axes[1].legend(fontsize=7)
        if "storm" in logins:
            storm = logins["storm"]
            names = ["p50", "p99", "p99.9"]
            keys = ["p50_ms", "p99_ms", "p999_ms"]
            for offset, (label, row) in ((-0.2, ("no storm", storm["quiet"])),
                                         (0.2, ("during storms", storm["storm"]))):
                axes[2].bar([x + offset for x in range(3)], [row[k] for k in keys], 0.4,
                            label=label)
            axes[2].set_xticks(list(range(3)), names)
            axes[2].set_title("authenticated producer latency ms")
            axes[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def main() -> int:
    """Redraw ``secure.png`` from ``tls.json`` and ``logins.json`` in bench/results."""
    import json

    from bench.options import RESULTS

    def load(name: str) -> dict[str, Any] | None:
        file = RESULTS / name
        return json.loads(file.read_text(encoding="utf-8")) if file.exists() else None

    return 0 if write_chart(load("tls.json"), load("logins.json"), RESULTS / "secure.png") \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())
