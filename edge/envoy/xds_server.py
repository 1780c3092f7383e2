"""The ``edge-broker xds-server`` process: ADS over gRPC, reloads, and a status endpoint.

:class:`XdsServer` serves a :class:`SnapshotStore` built from a :class:`PlanSource`.  It
reloads the plan when a watched file or the registry's live brokers change (polled), on
``SIGHUP``, and on ``POST /reload`` to its HTTP admin endpoint; ``GET /status`` returns
JSON with the current versions and what each Envoy node accepted or rejected.  A plan
that fails to load is logged and the last good snapshot keeps serving; the poll retries
it, logging again only when the reason changes.

gRPC is served in the clear or, with a :class:`MutualTls`, over TLS requiring a
client certificate signed by its CA (mutual TLS: only Envoys holding such a certificate
get a stream).  With an admin token every admin request must carry it
(``Authorization: Bearer TOKEN``), else it is answered 401; the admin endpoint serves a
few connections at once and closes silent ones (:mod:`edge.envoy.admin_http`).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TypedDict

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc

from edge.envoy.admin_http import ADMIN_TIMEOUT_S, MAX_ADMIN_CONNECTIONS, BoundedHTTPServer
from edge.envoy.ads import AdsStatus, AggregatedDiscoveryServicer, NodeStatus
from edge.envoy.model import EnvoyConfigError, MutualTls
from edge.envoy.resources import clusters, listeners
from edge.envoy.snapshot import TYPE_NAMES, TYPE_ORDER, SnapshotStore
from edge.envoy.source import REGISTRY, PlanSource
from listeners.spec import format_host_port

__all__ = ["XdsServer"]

log = logging.getLogger("edge.envoy.xds")

_RETRY = "retry"
"""The reload reason of a poll that retries a failed reload."""


class ServedVersion(TypedDict):
    """One resource type in the status document."""

    version: str
    names: list[str]


class XdsStatus(TypedDict):
    """The admin endpoint's status document (``GET /status``)."""

    version: str
    resources: dict[str, ServedVersion]
    last_reload_error: str | None
    left_out: dict[str, str]
    nacks: int
    nodes: dict[str, NodeStatus]


MAX_STREAMS = 256
"""ADS streams served at once (an Envoy keeps one open)."""
MAX_STREAMS_PER_PEER = 16
"""ADS streams one peer address may hold at once (a host runs one Envoy or a few)."""
FIRST_REQUEST_S = 30.0
"""A stream that sends no request within this is closed (it only held a thread)."""
MAX_REQUEST_BYTES = 1 << 20
"""The largest request a stream may send (gRPC's default is 4 MiB): an Envoy's are a few
KiB (its node, a NACK's message); a larger one ends the stream (RESOURCE_EXHAUSTED)."""
GRPC_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
]
"""The server pings each connection every 30 s and drops it 10 s after an unanswered
ping: an Envoy gone without closing its connection frees its stream within 40 s.  It
reads requests of at most :data:`MAX_REQUEST_BYTES`."""


def _server_credentials(tls: MutualTls) -> grpc.ServerCredentials:
    """Server credentials requiring a client certificate signed by ``tls.peer_ca``
    (OSError if a file cannot be read)."""
    chain, key, ca = (Path(name).read_bytes() for name in (
        tls.cert_chain, tls.private_key, tls.peer_ca))
    return grpc.ssl_server_credentials([(key, chain)], root_certificates=ca,
                                       require_client_auth=True)


class XdsServer:
    """An ADS server for the plan of ``source``, with file polling and an admin endpoint."""

    def __init__(self, source: PlanSource, listen: tuple[str, int],
                 admin: tuple[str, int], poll_interval: float = 1.0,
                 max_streams: int = MAX_STREAMS,
                 first_request_s: float = FIRST_REQUEST_S,
                 max_streams_per_peer: int = MAX_STREAMS_PER_PEER,
                 tls: MutualTls | None = None, admin_token: str | None = None,
                 max_admin_connections: int = MAX_ADMIN_CONNECTIONS,
                 admin_timeout_s: float = ADMIN_TIMEOUT_S) -> None:
        self.source = source
        self.store = SnapshotStore()
        self.status = AdsStatus()
        self.poll_interval = poll_interval
        self.last_error: str | None = None
        self.left_out: dict[int, str] = {}
        """Registry brokers that could not be routed, and why (the others are served)."""
        self._reload_lock = threading.Lock()
        self._stopped = threading.Event()
        self._fingerprint = source.fingerprint()
        # a stream holds a worker thread for its life: as many threads as streams may be
        # open, and one more is refused at once (RESOURCE_EXHAUSTED: Envoy retries) rather
        # than queued unserved behind them; keepalive pings end a vanished Envoy's stream
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="xds"),
            maximum_concurrent_rpcs=max_streams, options=GRPC_OPTIONS)
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AggregatedDiscoveryServicer(self.store, self.status, first_request_s,
                                        max_streams_per_peer), self._grpc)
        self.tls = tls
        self.grpc_port = (
            self._grpc.add_insecure_port(format_host_port(*listen)) if tls is None
            else self._grpc.add_secure_port(format_host_port(*listen), _server_credentials(tls)))
        if self.grpc_port == 0:
            raise OSError(f"cannot listen on {format_host_port(*listen)} for gRPC")
        self.grpc_host = listen[0]
        self._admin = BoundedHTTPServer(admin, _admin_handler(self, admin_token),
                                        max_admin_connections, admin_timeout_s)

    @property
    def admin_address(self) -> str:
        host, port = self._admin.server_address[:2]
        return format_host_port(str(host), int(port))

    @property
    def grpc_address(self) -> str:
        return format_host_port(self.grpc_host, self.grpc_port)

    def start(self) -> None:
        """Load the plan (it must load), then serve gRPC, the admin endpoint and polling."""
        self.reload("start", strict=True)
        self._grpc.start()
        threading.Thread(target=self._admin.serve_forever, name="xds-admin",
                         daemon=True).start()
        threading.Thread(target=self._poll, name="xds-poll", daemon=True).start()

    def reload(self, reason: str, strict: bool = False) -> bool:
        """Re-read the plan and publish it; on error keep the last snapshot (or raise).

        A failed poll retry (reason :data:`_RETRY`) is logged only if its error is new.
        """
        with self._reload_lock:
            self._fingerprint = self.source.fingerprint()
            try:
                plan, left_out = self.source.load_each()
            except EnvoyConfigError as exc:
                if strict:
                    raise
                if reason != _RETRY or str(exc) != self.last_error:
                    log.error("xds: reload (%s) failed, still serving version %s: %s",
                              reason, self.store.version, exc)
                self.last_error = str(exc)
                return False
            self.last_error = None
            if left_out != self.left_out:
                for broker_id, why in sorted(left_out.items()):
                    log.warning("xds: broker %d left out (the others are served): %.300s",
                                broker_id, why)
            self.left_out = left_out
            new_listeners = listeners(plan) if plan is not None else []
            new_clusters = clusters(plan) if plan is not None else []
            changed = self.store.update(new_listeners, new_clusters)
            names = ", ".join(str(item.name) for item in new_listeners) or "none"
            if changed:
                log.info("xds: version %s (%s): %s changed; listeners: %s",
                         self.store.version, reason,
                         " and ".join(TYPE_NAMES[t] for t in changed), names)
            else:
                log.info("xds: reload (%s): no change, version %s", reason,
                         self.store.version)
            return True

    def _poll(self) -> None:
        while not self._stopped.wait(self.poll_interval):
            now, then = dict(self.source.fingerprint()), dict(self._fingerprint)
            changed = [key for key in now.keys() | then.keys() if now.get(key) != then.get(key)]
            if changed:
                self.reload("registry changed" if changed == [REGISTRY] else "file changed")
            elif self.last_error is not None:
                self.reload(_RETRY)

    def status_dict(self) -> XdsStatus:
        """Versions served, the last reload error, and every node's ACK/NACK state."""
        versions: dict[str, ServedVersion] = {}
        for type_url in TYPE_ORDER:
            resources = self.store.get(type_url)
            if resources is not None:
                versions[TYPE_NAMES[type_url]] = {"version": resources.version,
                                                  "names": list(resources.names)}
        return {"version": self.store.version, "resources": versions,
                "last_reload_error": self.last_error,
                "left_out": {str(key): why for key, why in sorted(self.left_out.items())},
                "nacks": self.status.nack_count,
                "nodes": self.status.as_dict()}

    def stop(self, grace: float = 1.0) -> None:
        """Stop polling, the admin endpoint and gRPC (streams are cancelled)."""
        self._stopped.set()
        self._admin.shutdown()
        self._admin.server_close()
        self._grpc.stop(grace).wait(grace + 1)
        if self.source.registry is not None:
            self.source.registry.close()


def _admin_handler(server: XdsServer, token: str | None) -> type[BaseHTTPRequestHandler]:
    expected = None if token is None else f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = self.headers.get("Authorization", "").encode("utf-8", "replace")
            if hmac.compare_digest(given, expected):
                return True
            self._reply(401, {"error": "this endpoint needs Authorization: Bearer TOKEN"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path.rstrip("/") == "/status":
                self._reply(200, server.status_dict())
            else:
                self._reply(404, {"error": "GET /status or POST /reload"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path.rstrip("/") == "/reload":
                ok = server.reload("admin call")
                self._reply(200 if ok else 409, server.status_dict())
            else:
                self._reply(404, {"error": "GET /status or POST /reload"})

        def _reply(self, code: int, body: XdsStatus | dict[str, str]) -> None:
            data = json.dumps(body, indent=2).encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("xds admin: " + format, *args)

    return Handler
