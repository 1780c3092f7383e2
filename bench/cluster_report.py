"""The cluster rows' tables (throughput and CPU by cluster size; failover by membership
settings) and their targets, in the style of the main report."""

from __future__ import annotations

from typing import Any

from bench.report import CLIENT_MARK, NONE, size_label, targets_text

Results = dict[str, Any]
CPU_TARGET = 1.1
"""A broker of a cluster may spend this much of one lone broker's CPU per record."""
FAILOVER_TARGET_S = 10.0


def _plural(count: int) -> str:
    return f"{count} broker{'s' if count > 1 else ''}"


def _rate(phase: Results) -> str:
    cell = f"{phase['records_per_s']:,.0f} ({phase['mb_per_s']:,.1f})"
    return cell + (" " + CLIENT_MARK if phase.get("client_bound") else "")


def _ratio(row: Results) -> str:
    ratio, ratios = row.get("cpu_ratio_to_one"), row.get("cpu_ratios_to_one") or []
    if ratio is None:
        return NONE
    if len(ratios) < 2:
        return f"{ratio:.2f}x"
    return f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _column(row: Results) -> str:
    if row.get("separate"):
        return f"{row['brokers']} separate brokers (no cluster)"
    return _plural(row["brokers"])


def _noise_key(row: Results) -> str:
    return "separate" if row.get("separate") else str(row["brokers"])


def throughput_table(cluster: Results) -> str:
    """Rows by metric, a column per cluster size (and the control, separate brokers);
    the batchings one after the other."""
    batchings = cluster["throughput"]["batchings"]
    noise = cluster["throughput"]["noise"]
    columns = batchings[0]["rows"]
    sizes = [r["brokers"] for r in columns]
    head = "| metric | " + " | ".join(_column(r) for r in columns) + " |"
    lines = [head, "|---|" + "--:|" * len(sizes)]

    def line(metric: str, cells: list[str]) -> None:
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")

    for batching in batchings:
        rows, label = batching["rows"], batching["label"]
        line(f"**{label}**", [""] * len(sizes))
        line("produce: records/s (MB/s)", [_rate(r["produce"]) for r in rows])
        line("consume: records/s (MB/s)", [_rate(r["consume"]) for r in rows])
        line("produce batches (requests) per 1,000 records",
             [f"{r['batches_per_thousand']:.1f}" for r in rows])
        line("PostgreSQL commits per 1,000 records produced",
             [f"{r['commits_per_thousand']:.1f}" for r in rows])
        line("brokers' CPU s per million records, produce + consume",
             [f"{r['broker_cpu_s_per_million']:.2f}" for r in rows])
        line("brokers' CPU per record against one broker", [_ratio(r) for r in rows])
        line("PostgreSQL CPU s per million records",
             [f"{r['postgres_cpu_s_per_million']:.2f}" for r in rows])
    line("brokers' CPU while idle, % of one CPU",
         [f"{r['idle_cpu_pct']:.1f}" for r in batchings[0]["rows"]])
    share = [noise[_noise_key(r)]["others_share_pct"] for r in columns]
    line("noise: others' share of the brokers' CPU during the load, %",
         [NONE if s is None else f"{s:.0f}" for s in share])
    return "\n".join(lines)


def _settings(run: Results) -> str:
    if not run["settings"]:
        return "defaults (brokerSessionTimeoutMs=6000, brokerHeartbeatIntervalMs=1000)"
    return ", ".join(f"{k}={v}" for k, v in run["settings"].items())


def _pair(run: Results, key: str) -> str:
    p50, worst = run.get(f"{key}_p50_s"), run.get(f"{key}_max_s")
    return NONE if p50 is None or worst is None else f"{p50:.2f} / {worst:.2f}"


def failover_table(cluster: Results) -> str:
    """A row per membership setting."""
    lines = ["| membership settings | kills | first acknowledged produce p50 / max s | "
             "new leader in Metadata p50 / max s |", "|---|--:|--:|--:|"]
    for run in cluster["failover"]:
        lines.append(f"| {_settings(run)} | {run['kills']} | {_pair(run, 'first_ack')} | "
                     f"{_pair(run, 'leader_moved')} |")
    return "\n".join(lines)


def targets(cluster: Results) -> list[dict[str, Any]]:
    """CPU per record of every cluster against one broker, under each batching (the
    equal batches are the cost of being a cluster; librdkafka's own batches add the cost
    of its smaller requests); failover with the defaults."""
    out: list[dict[str, Any]] = []
    for batching in cluster["throughput"]["batchings"]:
        rows = [r for r in batching["rows"] if r.get("cpu_ratio_to_one") is not None
                and r["brokers"] > 1 and not r.get("separate")]
        if rows:
            out.append({
                "target": f"brokers' CPU per record <= {CPU_TARGET:g}x one broker's, "
                          f"{batching['label']}",
                "met": all(r["cpu_ratio_to_one"] <= CPU_TARGET for r in rows),
                "detail": ", ".join(f"{_plural(r['brokers'])} {r['cpu_ratio_to_one']:.3f}x"
                                    for r in rows)})
    for run in cluster["failover"]:
        if not run["settings"]:
            worst = run["first_ack_max_s"]
            out.append({
                "target": f"failover < {FAILOVER_TARGET_S:g} s with default settings "
                          f"(kill -9 to the first acknowledged produce, {run['kills']} kills)",
                "met": worst < FAILOVER_TARGET_S,
                "detail": f"p50 {run['first_ack_p50_s']:.2f} s, max {worst:.2f} s"})
    return out


def sharing_text(cluster: Results) -> str:
    """What the separate brokers show: the cost of sharing the CPUs, and the cluster's
    own on top of it (the largest cluster against its control)."""
    lines = []
    for batching in cluster["throughput"]["batchings"]:
        rows = batching["rows"]
        control = next((r for r in rows if r.get("separate")), None)
        cluster_row = next((r for r in rows if not r.get("separate")
                            and control is not None and r["brokers"] == control["brokers"]),
                           None)
        if control is None or cluster_row is None or not control["broker_cpu_s_per_million"]:
            continue
        alone = control.get("cpu_ratio_to_one")
        own = (cluster_row["broker_cpu_s_per_million"]
               / control["broker_cpu_s_per_million"])
        lines.append(
            f"- {batching['label']}: {control['brokers']} separate brokers sharing the "
            f"brokers' CPU spend {NONE if alone is None else f'{alone:.2f}x'} one lone "
            f"broker's CPU per record, with no cluster; the cluster of "
            f"{control['brokers']} spends {own:.2f}x theirs (its own cost)")
    return "\n".join(lines)


def _trials(repeat: int) -> str:
    if repeat == 1:
        return "one trial"
    return f"median of {repeat} trials alternating between cluster sizes"


def setup_text(cluster: Results) -> str:
    """How the cluster numbers were taken."""
    opts, meta = cluster["options"], cluster["meta"]
    return (f"Brokers on one PostgreSQL {meta['postgres']} (local, fsync on), a database per "
            f"cluster; {opts['records']:,} records of {size_label(opts['size'])} over "
            f"{opts['partitions']} partitions per trial, acks={meta['acks']}, "
            f"linger.ms={meta['linger_ms']:g}, {_trials(opts['repeat'])}; {meta['cpus']}, "
            f"PostgreSQL on every CPU; failover: "
            f"{opts['failover_brokers']} brokers, a topic of {opts['failover_partitions']} "
            f"partitions; {meta['seconds']} s in all.")


def markdown(cluster: Results) -> str:
    """Setup line, both tables and the targets."""
    parts = [setup_text(cluster), throughput_table(cluster)]
    sharing = sharing_text(cluster)
    if sharing:
        parts.append(sharing)
    if cluster["failover"]:
        parts.append(failover_table(cluster))
    return "\n\n".join([*parts, targets_text(cluster["targets"])])
