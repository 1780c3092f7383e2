"""The Prometheus endpoint (with the health checks beside it) and the edge's own metrics:
connections per listener, logins per mechanism and outcome, and the engine's state read at
scrape time (consumer-group lag, producer ids remembered, the data directory's free space)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Sequence
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, Counter, Gauge, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from broker_core.engine import Engine
from edge.health import Readiness, health_app

CONNECTIONS = Gauge("kop_server_active_connections", "Open connections, by listener.",
                    ["listener"])
REJECTED_CONNECTIONS = Counter(
    "kop_server_rejected_connections",
    "Connections refused or closed before being served (a failed TLS handshake, a frame "
    "too large before a login, a connection over a cap), by listener; audited within "
    "auditDenialsPerWindow and auditRejectionsPerWindow.", ["listener"])
AUTHENTICATIONS = Counter("kop_server_authentications",
                          "SASL logins, by mechanism and outcome (success, failure).",
                          ["mechanism", "outcome"])


class EngineCollector(Collector):
    """Per partition ``kop_server_log_size_bytes``, ``kop_server_log_start_offset``,
    ``kop_server_log_end_offset``, ``kop_server_log_damaged_offsets`` and
    ``kop_server_log_offline`` (1 after a failed fsync, until restart);
    ``kop_server_group_lag``: high watermark minus committed offset, per group partition;
    ``kop_server_producer_ids``: producer ids the loaded partitions remember;
    ``kop_server_data_dir_total_bytes`` and ``kop_server_data_dir_usable_bytes``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families :meth:`collect` gives, the partition logs' without their samples:
        what registering the collector asks for (collecting walks every partition: about
        a second of start-up with 10,000 of them)."""
        yield from self._log_families()
        yield from self._others()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Partition logs, group lag (one sample per committed partition of every group),
        producer ids."""
        yield from self._logs()
        yield from self._others()

    def _others(self) -> Iterator[GaugeMetricFamily]:
        yield from self._data_dir()
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
                                      max(self.engine.flusher.high_watermark(partition)
                                          - committed.offset, 0))
        yield family

    def _data_dir(self) -> Iterator[GaugeMetricFamily]:
        """The data directory's file system, as DescribeLogDirs reports it (no sample where
        the storage has no volume of its own: memory, PostgreSQL)."""
        disk = self.engine.logs.disk_usage()
        for name, value, what in (
                ("kop_server_data_dir_total_bytes", disk.total_bytes, "Size"),
                ("kop_server_data_dir_usable_bytes", disk.usable_bytes, "Bytes usable")):
            family = GaugeMetricFamily(name, f"{what} of the data directory's file system.")
            if value >= 0:
                family.add_metric([], value)
            yield family

    def _logs(self) -> Iterator[GaugeMetricFamily]:
        size, start, end, damaged, offline = families = self._log_families()
        for topic, index, partition in self.engine.logs.all_partitions():
            key = [topic, str(index)]
            size.add_metric(key, partition.size_bytes)
            start.add_metric(key, partition.log_start_offset)
            end.add_metric(key, self.engine.flusher.high_watermark(partition))
            first = partition.log_start_offset
            damaged.add_metric(key, sum(d.end_offset - max(d.first_offset, first)
                                        for d in partition.damaged_ranges()))
            offline.add_metric(key, int(partition.offline))
        yield from families

    @staticmethod
    def _log_families() -> tuple[GaugeMetricFamily, ...]:
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
        return size, start, end, damaged, offline


_SHUTDOWN_POLL_S = 3600.0
"""How often the server's thread looks for a shutdown request between requests (the
socketserver default, 0.5 s, woke an idle broker twice a second): nothing shuts it down,
it ends with the process."""


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_metrics(engine: Engine, host: str, port: int, readiness: Readiness,
                  collectors: Sequence[Collector] = ()) -> int:
    """Register the engine collector (and ``collectors``) and serve ``/metrics`` (every
    path but the health checks), ``/healthz`` and ``/readyz`` (see ``edge.health``) from a
    daemon thread; return the bound port."""
    REGISTRY.register(EngineCollector(engine))
    for collector in collectors:
        REGISTRY.register(collector)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, health_app(readiness, make_wsgi_app(REGISTRY)),
                         Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, args=(_SHUTDOWN_POLL_S,), name="edge-metrics",
                     daemon=True).start()
    return int(server.server_port)
