"""The Prometheus endpoint and the edge's own metrics: connections per listener, logins per
mechanism and outcome, and consumer-group lag computed at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker_core.engine import Engine

CONNECTIONS = Gauge("kop_server_active_connections", "Open connections, by listener.",
                    ["listener"])
AUTHENTICATIONS = Counter("kop_server_authentications",
                          "SASL logins, by mechanism and outcome (success, failure).",
                          ["mechanism", "outcome"])


class GroupLagCollector(Collector):
    """``kop_server_group_lag``: high watermark minus committed offset, per group partition."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per committed partition of every group."""
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


def serve_metrics(engine: Engine, host: str, port: int) -> int:
    """Register the lag collector and serve ``/metrics``; return the bound port."""
    REGISTRY.register(GroupLagCollector(engine))
    server, _thread = start_http_server(port, addr=host)
    return int(server.server_port)
