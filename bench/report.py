"""The results table (Markdown, printed and saved) and the targets, met or not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Results = dict[str, Any]
RSS_TARGET_MB = 300.0
P99_TARGET_MS = 5.0


def size_label(size: int) -> str:
    """``100 B``, ``1 KiB``, ``16 KiB``."""
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


def _ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or peer == 0:
        return "–"
    return f"{ours / peer:.2f}×"


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _get(broker: Results | None, path: Callable[[Results], float]) -> float | None:
    if broker is None:
        return None
    try:
        return float(path(broker))
    except (KeyError, IndexError, TypeError):
        return None


def _size_row(size: int) -> Callable[[Results], Results]:
    def pick(broker: Results) -> Results:
        for row in broker["throughput"]:
            if row["size"] == size:
                return dict(row)
        raise KeyError(size)
    return pick


def rows(results: Results) -> list[tuple[str, str, str, str]]:
    """(metric, this broker, Tansu, ratio) rows."""
    edge, tansu = results["brokers"].get("edge"), results["brokers"].get("tansu")
    out: list[tuple[str, str, str, str]] = []

    def add(metric: str, path: Callable[[Results], float], digits: int) -> None:
        ours, peer = _get(edge, path), _get(tansu, path)
        out.append((metric, _fmt(ours, digits), _fmt(peer, digits), _ratio(ours, peer)))

    for size in results["options"]["sizes"]:
        label, row = size_label(size), _size_row(size)
        for phase in ("produce", "consume"):
            add(f"{phase} {label}: records/s",
                lambda b, r=row, p=phase: r(b)[p]["records_per_s"], 0)
            add(f"{phase} {label}: MB/s", lambda b, r=row, p=phase: r(b)[p]["mb_per_s"], 1)
        add(f"broker CPU s, produce+consume {label}",
            lambda b, r=row: r(b)["produce"]["broker_cpu_s"] + r(b)["consume"]["broker_cpu_s"], 2)
    opts = results["options"]
    lat = f"{opts['rate']:,.0f}/s × {size_label(opts['latency_size'])}"
    for key, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        add(f"produce latency {name} ms ({lat})", lambda b, k=key: b["latency"][k], 2)
    add(f"achieved rate, records/s ({lat})", lambda b: b["latency"]["achieved_rate"], 0)
    add("broker CPU s, whole run (one broker process)", lambda b: b["cpu_seconds_total"], 1)
    add("broker peak RSS MB, whole run", lambda b: b["peak_rss_mb"], 1)
    parts = opts["partitions_scenario"]
    add(f"broker peak RSS MB, {parts:,} partitions", lambda b: b["partitions"]["peak_rss_mb"], 1)
    return out


def table(results: Results) -> str:
    """The Markdown table."""
    lines = ["| metric | this broker | Tansu | this / Tansu |", "|---|--:|--:|--:|"]
    lines += [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(results)]
    return "\n".join(lines)


def targets(results: Results) -> list[dict[str, Any]]:
    """Each target: name, met (True / False / None when not measured) and the numbers."""
    edge, tansu = results["brokers"].get("edge"), results["brokers"].get("tansu")
    out: list[dict[str, Any]] = []
    for phase in ("produce", "consume"):
        ratios: list[str] = []
        met: bool | None = None
        if edge is not None and tansu is not None:
            met = True
            for size in results["options"]["sizes"]:
                ours = _size_row(size)(edge)[phase]["records_per_s"]
                peer = _size_row(size)(tansu)[phase]["records_per_s"]
                met = met and ours >= peer
                ratios.append(f"{size_label(size)} {ours / peer:.2f}×")
        out.append({"target": f"{phase} throughput ≥ Tansu at every size", "met": met,
                    "detail": ", ".join(ratios) or "Tansu not run"})
    opts = results["options"]
    p99 = _get(edge, lambda b: b["latency"]["p99_ms"])
    out.append({
        "target": f"produce p99 < {P99_TARGET_MS:g} ms at {opts['rate']:,.0f}/s × "
                  f"{size_label(opts['latency_size'])}",
        "met": None if p99 is None else p99 < P99_TARGET_MS,
        "detail": "not run" if p99 is None else f"p99 {p99:.2f} ms"})
    rss = _get(edge, lambda b: b["partitions"]["peak_rss_mb"])
    out.append({
        "target": f"peak RSS < {RSS_TARGET_MB:g} MB with {opts['partitions_scenario']:,} "
                  "partitions",
        "met": None if rss is None else rss < RSS_TARGET_MB,
        "detail": "not run" if rss is None else f"{rss:.1f} MB"})
    return out


def targets_text(checks: list[dict[str, Any]]) -> str:
    """One line per target."""
    marks = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"- {c['target']}: **{marks[c['met']]}** ({c['detail']})" for c in checks)


def setup_text(results: Results) -> str:
    """How the numbers were taken, in two lines."""
    meta, opts = results["meta"], results["options"]
    return (f"acks={opts['acks']}, linger.ms={opts['linger_ms']:g}, 1 partition, "
            f"librdkafka {meta['librdkafka']}; {meta['cpus']}; MB = 10^6 bytes of record "
            f"values; produce = first produce() to last delivery report.")


def markdown(results: Results) -> str:
    """Setup line, table and targets: what is printed, saved and put in the README."""
    return "\n\n".join([setup_text(results), table(results), targets_text(results["targets"])])
