"""The results table (Markdown, printed and saved) and the targets, met or not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.runner import HANDLING_TARGET_S

Results = dict[str, Any]
Pick = Callable[[Results], float]
_LIMIT_MS = HANDLING_TARGET_S * 1000
NONE = "-"
CLIENT_MARK = "(c)"
CLIENT_NOTE = (f"{CLIENT_MARK} = the load generator was busy 90% of the time or more: that "
               "figure is the client's limit, not the broker's.")
PAIRED_NOTE = ("Throughput ratios are the median of the per-trial ratios (each trial of this "
               "broker against the Tansu trial run just before or after it, so both saw the "
               "same machine), with their range in brackets.")


def save_row(out: Path, name: str, results: object, text: str) -> list[Path]:
    """Write a row's ``<name>.json`` (``results``) and ``<name>.md`` (``text``) into
    ``out``, made if missing; the two paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    paths[1].write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    return paths


def size_label(size: int) -> str:
    """``100 B``, ``1 KiB``, ``16 KiB``."""
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    return f"{size} B"


def _ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or peer == 0:
        return NONE
    return f"{ours / peer:.2f}x"


def paired_ratios(ours: Results, peer: Results) -> list[float]:
    """This broker's trial *i* over Tansu's trial *i* of one throughput phase: the two ran
    back to back, so a ratio compares them under the same load from the rest of the
    machine (a noisy minute hits one pair, not one broker's median)."""
    mine = ours.get("trials_records_per_s") or [ours["records_per_s"]]
    theirs = peer.get("trials_records_per_s") or [peer["records_per_s"]]
    return [a / b for a, b in zip(mine, theirs, strict=False) if b > 0]


def median(values: list[float]) -> float:
    """The median (the mean of the middle two of an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _paired_cell(ratios: list[float]) -> str:
    if not ratios:
        return NONE
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _fmt(value: float | None, digits: int) -> str:
    return NONE if value is None else f"{value:,.{digits}f}"


def _get(broker: Results | None, pick: Pick) -> float | None:
    if broker is None:
        return None
    try:
        return float(pick(broker))
    except (KeyError, IndexError, TypeError):
        return None


def size_row(broker: Results, size: int) -> Results:
    """The throughput results of one record size."""
    for row in broker["throughput"]:
        if row["size"] == size:
            return dict(row)
    raise KeyError(size)


def _phase(size: int, phase: str, key: str) -> Pick:
    return lambda broker: float(size_row(broker, size)[phase][key])


def _cpu(size: int) -> Pick:
    def pick(broker: Results) -> float:
        row = size_row(broker, size)
        return float(row["produce"]["broker_cpu_s"] + row["consume"]["broker_cpu_s"])
    return pick


def _per_million(size: int, phase: str) -> Pick:
    def pick(broker: Results) -> float:
        found = size_row(broker, size)[phase]
        return float(found["broker_cpu_s"]) / float(found["records"]) * 1e6
    return pick


def _share(pick: Pick) -> Pick:
    return lambda broker: 100 * pick(broker)


def _mib(count: int) -> str:
    return f"{count / (1 << 20):g} MiB" if count % (1 << 20) == 0 else f"{count:,} B"


def _path(*keys: str) -> Pick:
    def pick(broker: Results) -> float:
        value: Any = broker
        for key in keys:
            value = value[key]
        return float(value)
    return pick


def _extra(index: int, key: str) -> Pick:
    return lambda broker: float(broker["latency_extra"][index][key])


_LATENCY_ROWS = (
    ("p50_ms", "latency p50"), ("p99_ms", "latency p99"), ("p999_ms", "latency p99.9"),
    ("rtt_p50_ms", "request round trip p50"), ("rtt_p99_ms", "request round trip p99"),
)


class _Rows:
    """Builds (metric, this broker, Tansu, ratio) rows."""

    def __init__(self, results: Results) -> None:
        self.edge = results["brokers"].get("edge")
        self.tansu = results["brokers"].get("tansu")
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, metric: str, pick: Pick, digits: int, detail: Pick | None = None,
            detail_digits: int = 1, ratio: bool = True, mark: Pick | None = None) -> None:
        ours, peer = _get(self.edge, pick), _get(self.tansu, pick)
        self._append(metric, ours, peer, digits, detail, detail_digits, mark,
                     _ratio(ours, peer) if ratio else NONE)

    def add_throughput(self, metric: str, size: int, phase: str) -> None:
        """A records/s (MB/s) row, its ratio paired trial by trial."""
        pick = _phase(size, phase, "records_per_s")
        ours, peer = _get(self.edge, pick), _get(self.tansu, pick)
        ratio = NONE
        if self.edge is not None and self.tansu is not None and ours is not None \
                and peer is not None:
            ratio = _paired_cell(paired_ratios(size_row(self.edge, size)[phase],
                                               size_row(self.tansu, size)[phase]))
        self._append(metric, ours, peer, 0, _phase(size, phase, "mb_per_s"), 1,
                     _phase(size, phase, "client_bound"), ratio)

    def _append(self, metric: str, ours: float | None, peer: float | None, digits: int,
                detail: Pick | None, detail_digits: int, mark: Pick | None,
                ratio: str) -> None:
        cells = [_fmt(ours, digits), _fmt(peer, digits)]
        for i, broker in enumerate((self.edge, self.tansu)):
            extra = None if detail is None else _get(broker, detail)
            if extra is not None and cells[i] != NONE:
                cells[i] += f" ({_fmt(extra, detail_digits)})"
            if mark is not None and _get(broker, mark):
                cells[i] += " " + CLIENT_MARK
        self.rows.append((metric, cells[0], cells[1], ratio))


def rows(results: Results) -> list[tuple[str, str, str, str]]:
    """(metric, this broker, Tansu, ratio) rows."""
    out = _Rows(results)
    opts = results["options"]
    for size in opts["sizes"]:
        label = size_label(size)
        for phase in ("produce", "consume"):
            out.add_throughput(f"{phase} {label}: records/s (MB/s)", size, phase)
        if opts.get("wide_fetch_bytes"):
            wide = f"consume {label}, max.partition.fetch.bytes={_mib(opts['wide_fetch_bytes'])}"
            out.add_throughput(f"{wide}: records/s (MB/s)", size, "consume_wide")
        for phase in ("produce", "consume"):
            key = phase + "_c"
            if any(key in size_row(b, size) for b in (out.edge, out.tansu) if b is not None):
                out.add_throughput(f"{phase} {label}, C client: records/s (MB/s)", size, key)
        out.add(f"broker CPU s, produce + consume {label} (produce alone)", _cpu(size), 2,
                _phase(size, "produce", "broker_cpu_s"), 2)
        for phase in ("produce_c", "consume_c"):
            if any(phase in size_row(b, size) for b in (out.edge, out.tansu) if b is not None):
                out.add(f"broker CPU s per million records, {phase[:-2]} {label}, C client",
                        _per_million(size, phase), 2)
    lat = f"{opts['rate']:,.0f}/s x {size_label(opts['latency_size'])}"
    for key, name in _LATENCY_ROWS:
        out.add(f"produce {name} ms at {lat}", _path("latency", key), 2)
    out.add(f"achieved rate, records/s, at {lat}", _path("latency", "achieved_rate"), 0)
    handled = f"broker's own produce handling within {_LIMIT_MS:g} ms, % of requests, at {lat}"
    out.add(handled, _share(_path("latency", "handled_within_target")), 2, ratio=False)
    for i, linger in enumerate(opts.get("extra_latency_lingers", [])):
        for key, name in _LATENCY_ROWS:
            out.add(f"produce {name} ms at {lat}, linger.ms={linger:g}", _extra(i, key), 2)
        out.add(f"{handled}, linger.ms={linger:g}", _share(_extra(i, "handled_within_target")), 2,
                ratio=False)
    out.add("broker CPU s, whole run", _path("cpu_seconds_total"), 1)
    out.add("broker peak RSS MB, whole run", _path("peak_rss_mb"), 1)
    parts = opts["partitions_scenario"]
    out.add(f"broker peak RSS MB, {parts:,} partitions", _path("partitions", "peak_rss_mb"), 1)
    out.add("noise: others' share of the broker's CPU during the load, %",
            _path("noise", "others_share_pct"), 0, ratio=False)
    out.add("noise: others' share of the load generators' CPU, %",
            _path("noise", "load_others_share_pct"), 0, ratio=False)
    return out.rows


def table(results: Results) -> str:
    """The Markdown table."""
    lines = ["| metric | this broker | Tansu | this / Tansu |", "|---|--:|--:|--:|"]
    lines += [f"| {m} | {a} | {b} | {c} |" for m, a, b, c in rows(results)]
    return "\n".join(lines)


def targets_text(checks: list[dict[str, Any]]) -> str:
    """One line per target."""
    marks = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"- {c['target']}: **{marks[c['met']]}** ({c['detail']})" for c in checks)


def _trials(repeat: int, latency_repeat: int) -> str:
    if repeat == latency_repeat == 1:
        return "one trial each"
    return (f"median of {repeat} interleaved trials (latency: {latency_repeat}, the trial "
            "with the median p99)")


def setup_text(results: Results) -> str:
    """How the numbers were taken."""
    meta, opts = results["meta"], results["options"]
    return (f"acks={opts['acks']}, linger.ms={opts['linger_ms']:g}, one partition, "
            f"{_trials(opts['repeat'], opts['latency_repeat'])}, "
            f"librdkafka {meta['librdkafka']}; {meta['cpus']}; {meta['machine']}; "
            f"MB = 10^6 bytes of record values; produce = first produce() to last "
            f"delivery report; {meta.get('seconds', '?')} s in all.")


def markdown(results: Results) -> str:
    """Setup line, table and targets: what is printed, saved and put in the README."""
    return "\n\n".join([setup_text(results),
                        table(results) + "\n\n" + CLIENT_NOTE + " " + PAIRED_NOTE,
                        targets_text(results["targets"])])
