"""The Prometheus endpoint and the edge's own metrics: connections per listener, logins per
mechanism and outcome, and the engine's state read at scrape time (consumer-group lag,
producer ids remembered)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker_core.engine import Engine

CONNECTIONS = Gauge("kop_server_active_connections", "Open connections, by listener.",
                    ["listener"])
AUTHENTICATIONS = Counter("kop_server_authentications",
                          "SASL logins, by mechanism and outcome (success, failure).",
                          ["mechanism", "outcome"])


class EngineCollector(Collector):
    """Per partition ``kop_server_log_size_bytes``, ``kop_server_log_start_offset``,
    ``kop_server_log_end_offset``, ``kop_server_log_damaged_offsets`` and
    ``kop_server_log_offline`` (1 after a failed fsync, until restart);
    ``kop_server_group_lag``: high watermark minus committed offset, per group partition;
    ``kop_server_producer_ids``: producer ids the loaded partitions remember."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Partition logs, group lag (one sample per committed partition of every group),
        producer ids."""
        yield from self._logs()
        yield GaugeMetricFamily(
            "kop_server_producer_ids",
            "Idempotent and transactional producer ids remembered, summed over the loaded "
            "partitions (idle ones expire after producerIdExpirationMs).",
            value=self.engine.producers.producer_count())
        family = GaugeMetricFamily("kop_server_group_lag",
                                   "Records behind the high watermark, per group partition.",
                                   labels=["group", "topic", "partition"])
        for group in list(self.engine.groups.groups.values()):
            for (topic, index), committed in list(group.offsets.items()):
                partition = self.engine.logs.partition(topic, index)
                if partition is not None:
                    family.add_metric([group.group_id, topic, str(index)],
                                      max(partition.next_offset - committed.offset, 0))
        yield family

    def _logs(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        size = GaugeMetricFamily("kop_server_log_size_bytes",
                                 "Bytes on disk of a partition's ledgers.", labels=labels)
        start = GaugeMetricFamily("kop_server_log_start_offset",
                                  "First readable offset of a partition.", labels=labels)
        end = GaugeMetricFamily("kop_server_log_end_offset",
                                "Next offset of a partition (its high watermark).",
                                labels=labels)
        damaged = GaugeMetricFamily(
            "kop_server_log_damaged_offsets",
            "Offsets of a partition whose stored records are damaged (cut short or failing "
            "their CRC) and are not served.", labels=labels)
        offline = GaugeMetricFamily(
            "kop_server_log_offline",
            "1 while a partition is offline (a failed fsync or I/O error: its reads and "
            "writes fail until the broker restarts), else 0.", labels=labels)
        for topic, index, partition in self.engine.logs.all_partitions():
            key = [topic, str(index)]
            size.add_metric(key, partition.size_bytes)
            start.add_metric(key, partition.log_start_offset)
            end.add_metric(key, partition.next_offset)
            first = partition.log_start_offset
            damaged.add_metric(key, sum(d.end_offset - max(d.first_offset, first)
                                        for d in partition.damaged_ranges()))
            offline.add_metric(key, int(partition.offline))
        yield from (size, start, end, damaged, offline)


def serve_metrics(engine: Engine, host: str, port: int,
                  collectors: Sequence[Collector] = ()) -> int:
    """Register the engine collector (and ``collectors``) and serve ``/metrics``; return
    the bound port."""
    REGISTRY.register(EngineCollector(engine))
    for collector in collectors:
        REGISTRY.register(collector)
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)
