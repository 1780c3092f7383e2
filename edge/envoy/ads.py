"""The Aggregated Discovery Service (``envoy.service.discovery.v3``), state of the world.

One gRPC stream per Envoy carries requests for listeners and clusters.  For each type the
stream remembers the version and nonce it last sent:

* a request with no nonce subscribes to the type and gets the current resources;
* a request echoing the last nonce is an ACK (version accepted) or, with
  ``error_detail``, a NACK: the rejection is logged and recorded in :class:`AdsStatus`,
  nothing is resent, and Envoy keeps serving the last version it accepted;
* a request echoing an older nonce is stale and ignored.

When the :class:`SnapshotStore` changes, every stream sends the changed types it is
subscribed to, make before break (Envoy's rule: CDS before LDS to add, LDS before CDS to
remove): clusters added or changed, then listeners, then clusters removed (see
:meth:`_Stream.refresh`).  The delta protocol is not served.

What a client sends is bounded before it is kept or logged: a stream whose first request
names no node, or a node id longer than :data:`MAX_NODE_ID_BYTES`, is refused
(INVALID_ARGUMENT); a NACK's message and an ACK's version are cut (:data:`TEXT_LIMIT`,
control characters escaped) in the log and in :class:`AdsStatus`, which keeps a node
only while it has a stream open.  One peer address holds at most ``max_streams_per_peer``
streams (one more is refused with RESOURCE_EXHAUSTED), so a client cannot take every
stream slot of the server from Envoys.  A stream's requests wait in a bounded
:class:`~edge.envoy.stream_inbox.StreamInbox`: a peer that sends without reading the
answers is stopped by flow control, not kept in memory.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, TypedDict

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2

from edge.envoy.snapshot import (
    CLUSTER_TYPE,
    LISTENER_TYPE,
    TYPE_NAMES,
    TYPE_ORDER,
    Resources,
    SnapshotStore,
)
from edge.envoy.stream_inbox import Signal, StreamInbox
from sasl.printable import printable

__all__ = ["MAX_NODE_ID_BYTES", "TEXT_LIMIT", "AdsStatus", "AggregatedDiscoveryServicer",
           "Rejection", "peer_host"]

log = logging.getLogger("edge.envoy.xds")

MAX_NODE_ID_BYTES = 256
"""The longest node id (UTF-8) a stream may give; Envoy's are short (``--node-id``)."""
TEXT_LIMIT = 1024
"""The most characters of a NACK's message kept in the status and written in the log."""
_VERSION_LIMIT = 64
"""The most characters of an ACKed version kept (this server's versions are counters)."""


class _Refused(Exception):
    """A stream the server ends: the gRPC status and its message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Rejection:
    """A version an Envoy NACKed."""

    version: str
    message: str
    at: float


class RejectionStatus(TypedDict):
    """A rejected version in the status document."""

    version: str
    message: str
    at: float


class NodeStatus(TypedDict):
    """One node in the status document (``GET /status``)."""

    streams: int
    acked: dict[str, str]
    rejected: dict[str, RejectionStatus]


@dataclass
class _NodeState:
    acked: dict[str, str] = field(default_factory=dict)
    rejections: dict[str, Rejection] = field(default_factory=dict)
    streams: int = 0


class AdsStatus:
    """What every Envoy node accepted and rejected, per resource type (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _NodeState] = {}
        self.nack_count = 0

    def _node(self, node_id: str) -> _NodeState:
        return self._nodes.setdefault(node_id, _NodeState())

    def connected(self, node_id: str, delta: int) -> None:
        """Count a stream of ``node_id`` opened (+1) or closed (-1); a node whose last
        stream closed is forgotten."""
        with self._lock:
            state = self._node(node_id)
            state.streams += delta
            if state.streams <= 0:
                del self._nodes[node_id]

    def ack(self, node_id: str, type_url: str, version: str) -> None:
        with self._lock:
            state = self._node(node_id)
            state.acked[type_url] = printable(version, _VERSION_LIMIT)
            rejected = state.rejections.get(type_url)
            if rejected is not None and _version(rejected.version) <= _version(version):
                del state.rejections[type_url]

    def nack(self, node_id: str, type_url: str, version: str, message: str) -> None:
        """Record a rejection (``message`` bounded: see :func:`bounded_text`)."""
        with self._lock:
            self._node(node_id).rejections[type_url] = Rejection(
                version, bounded_text(message), time.time())
            self.nack_count += 1

    def as_dict(self) -> dict[str, NodeStatus]:
        """Per node: open streams, accepted and rejected versions per type name."""
        with self._lock:
            return {
                node: {
                    "streams": state.streams,
                    "acked": {TYPE_NAMES.get(t, t): v for t, v in state.acked.items()},
                    "rejected": {
                        TYPE_NAMES.get(t, t): {"version": r.version, "message": r.message,
                                               "at": r.at}
                        for t, r in state.rejections.items()
                    },
                }
                for node, state in self._nodes.items()
            }


def bounded_text(text: str) -> str:
    """Text an Envoy sent, as kept and logged: stripped, control characters escaped, cut
    to :data:`TEXT_LIMIT` characters (idempotent)."""
    return printable(text.strip(), TEXT_LIMIT)


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer (``ipv4:10.0.0.7:51234``, ``ipv6:[::1]:51234``)."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return peer
    host = rest.rpartition(":")[0] or rest
    return host.removeprefix("[").removesuffix("]")


class _Sent(NamedTuple):
    """What a stream last sent of one type."""

    version: str
    nonce: str
    names: tuple[str, ...]
    items: tuple[any_pb2.Any, ...]


_NOTHING_SENT = _Sent("", "", (), ())


class _Stream:
    """The state of one ADS stream: subscriptions and what was last sent per type."""

    _nonces = itertools.count(1)

    def __init__(self, store: SnapshotStore, status: AdsStatus, peer: str) -> None:
        self.store = store
        self.status = status
        self.peer = peer
        self.node_id = ""
        self.subscribed: set[str] = set()
        self.sent: dict[str, _Sent] = {}
        self.inbox = StreamInbox()

    def handle(self, request: discovery_pb2.DiscoveryRequest
               ) -> list[discovery_pb2.DiscoveryResponse]:
        """Responses to one request from Envoy; :class:`_Refused` ends the stream."""
        if not self.node_id:
            self._identify(request.node.id)
        type_url = request.type_url
        name = TYPE_NAMES.get(type_url, type_url)
        if not request.response_nonce:
            if self.store.get(type_url) is None:
                log.warning("xds: node %.200r asked for unserved type %.200r", self.node_id,
                            type_url)
                return []
            self.subscribed.add(type_url)
            return [self._response(type_url)]
        version, nonce, _, _ = self.sent.get(type_url, _NOTHING_SENT)
        if request.response_nonce != nonce:
            return []  # stale: answers a response that a newer one replaced
        if request.HasField("error_detail"):
            message = bounded_text(request.error_detail.message)
            log.warning("xds: NACK from node %s: %s version %s rejected (Envoy keeps version"
                        " %s): %s", self.node_id, name, version,
                        printable(request.version_info, _VERSION_LIMIT) or "none", message)
            self.status.nack(self.node_id, type_url, version, message)
        else:
            log.info("xds: ACK from node %s: %s version %s", self.node_id, name,
                     printable(request.version_info, _VERSION_LIMIT))
            self.status.ack(self.node_id, type_url, request.version_info)
        return []

    def _identify(self, node_id: str) -> None:
        """Take the stream's node id from its first request, or refuse the stream."""
        size = len(node_id.encode())
        if not size:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           "the first request must name the node (node.id)")
        if size > MAX_NODE_ID_BYTES:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT,
                           f"node id of {size} bytes: at most {MAX_NODE_ID_BYTES}")
        self.node_id = printable(node_id, MAX_NODE_ID_BYTES)
        self.status.connected(self.node_id, 1)
        log.info("xds: node %s connected from %s", self.node_id, self.peer)

    def refresh(self) -> list[discovery_pb2.DiscoveryResponse]:
        """Responses for subscribed types whose version moved past what was sent, in
        Envoy's make-before-break order (xDS "eventual consistency considerations": CDS
        before LDS to add, LDS before CDS to remove): clusters added or changed, then the
        listeners, then the clusters removed.  When clusters leave while listeners change,
        the first clusters response is a bridge (the new clusters beside the leaving ones,
        :meth:`_bridge`), so that no listener is ever left forwarding to a cluster gone
        nor sent before its cluster."""
        due: list[str] = []
        for type_url in TYPE_ORDER:
            current = self.store.get(type_url)
            if type_url not in self.subscribed or current is None:
                continue
            if self.sent.get(type_url, _NOTHING_SENT).version != current.version:
                due.append(type_url)
        if LISTENER_TYPE not in due or CLUSTER_TYPE not in due:
            return [self._response(type_url) for type_url in due]
        bridge = self._bridge()
        if bridge is None:  # no cluster leaves: clusters, then the listeners using them
            return [self._response(CLUSTER_TYPE), self._response(LISTENER_TYPE)]
        first = [] if bridge is _NO_BRIDGE else [self._response(CLUSTER_TYPE, bridge)]
        return [*first, self._response(LISTENER_TYPE), self._response(CLUSTER_TYPE)]

    def _bridge(self) -> Resources | None:
        """None when no cluster last sent leaves; else the clusters to send before the
        listeners: the current ones beside the leaving ones as last sent, at a version of
        its own (``<version>-bridge``), or :data:`_NO_BRIDGE` when that is what was sent
        (clusters only removed: listeners go first)."""
        current = self.store.get(CLUSTER_TYPE)
        assert current is not None
        sent = self.sent.get(CLUSTER_TYPE, _NOTHING_SENT)
        held = dict(zip(sent.names, sent.items, strict=True))
        leaving = held.keys() - set(current.names)
        if not leaving:
            return None
        if all(held.get(name) == item for name, item in zip(current.names, current.items,
                                                             strict=True)):
            return _NO_BRIDGE
        merged = sorted([*zip(current.names, current.items, strict=True),
                         *((name, held[name]) for name in leaving)], key=lambda p: p[0])
        return Resources(f"{current.version}-bridge", tuple(item for _, item in merged),
                         tuple(name for name, _ in merged), "")

    def _response(self, type_url: str, resources: Resources | None = None
                  ) -> discovery_pb2.DiscoveryResponse:
        """A response of ``type_url``: ``resources``, or else the store's current ones."""
        if resources is None:
            resources = self.store.get(type_url)
        assert resources is not None
        nonce = str(next(self._nonces))
        self.sent[type_url] = _Sent(resources.version, nonce, resources.names,
                                    resources.items)
        log.info("xds: sending %s version %s to node %s: %s", TYPE_NAMES.get(type_url),
                 resources.version, self.node_id, ", ".join(resources.names) or "none")
        return discovery_pb2.DiscoveryResponse(
            version_info=resources.version, resources=list(resources.items),
            type_url=type_url, nonce=nonce)

    def close(self) -> None:
        if self.node_id:
            self.status.connected(self.node_id, -1)
            log.info("xds: node %s disconnected", self.node_id)


_NO_BRIDGE = Resources("", (), (), "")
"""What :meth:`_Stream._bridge` answers when clusters only leave (no bridge is sent)."""


def _version(text: str) -> int:
    """A version this server sent (a counter), or -1 for text an Envoy made up."""
    try:
        return int(text)
    except ValueError:
        return -1


class AggregatedDiscoveryServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """Serves a :class:`SnapshotStore` to Envoys over ADS (state of the world)."""

    def __init__(self, store: SnapshotStore, status: AdsStatus,
                 first_request_s: float | None = None,
                 max_streams_per_peer: int | None = None) -> None:
        self.store = store
        self.status = status
        self.first_request_s = first_request_s
        self.max_streams_per_peer = max_streams_per_peer
        self._peers_lock = threading.Lock()
        self._peers: dict[str, int] = {}
        """Open streams per peer address (addresses with none are dropped)."""

    def _admit(self, host: str) -> bool:
        """Count a stream of peer ``host``, unless it holds its most already."""
        with self._peers_lock:
            held = self._peers.get(host, 0)
            if self.max_streams_per_peer is not None and held >= self.max_streams_per_peer:
                return False
            self._peers[host] = held + 1
            return True

    def _release(self, host: str) -> None:
        with self._peers_lock:
            held = self._peers.pop(host) - 1
            if held:
                self._peers[host] = held

    def StreamAggregatedResources(
        self, request_iterator: Iterator[discovery_pb2.DiscoveryRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        stream = _Stream(self.store, self.status, context.peer())
        host = peer_host(stream.peer)
        if not self._admit(host):
            log.warning("xds: refusing a stream from %.200s: it holds %d streams already",
                        stream.peer, self.max_streams_per_peer)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"at most {self.max_streams_per_peer} streams per client address")
        try:
            yield from self._serve(stream, request_iterator, context)
        except _Refused as refused:
            log.warning("xds: refusing a stream from %.200s: %s", stream.peer, refused.message)
            context.abort(refused.code, refused.message)
        finally:
            self._release(host)

    def _serve(self, stream: _Stream,
               request_iterator: Iterator[discovery_pb2.DiscoveryRequest],
               context: grpc.ServicerContext) -> Iterator[discovery_pb2.DiscoveryResponse]:
        inbox = stream.inbox

        def read() -> None:
            # waits in put while the inbox is full: gRPC then reads no more of the stream
            try:
                for request in request_iterator:
                    if not inbox.put(request):
                        return
            except Exception as exc:  # grpc raises here when the peer cancels the stream
                log.debug("xDS stream from %s stopped reading: %r", stream.peer, exc)
            inbox.close()

        context.add_callback(inbox.close)
        self.store.watch(inbox.refresh)
        threading.Thread(target=read, name="xds-read", daemon=True).start()
        try:
            waiting = self.first_request_s
            while True:
                item = inbox.next(waiting)
                if item is Signal.IDLE:  # no request yet: it only held a thread
                    log.info("xds: closing a stream from %.200s that sent no request in %g s",
                             stream.peer, waiting)
                    return
                if item is Signal.CLOSED:
                    return
                if item is Signal.REFRESH:
                    yield from stream.refresh()
                else:
                    waiting = None
                    yield from stream.handle(item)
        finally:
            self.store.unwatch(inbox.refresh)
            inbox.close()  # a reader waiting to put stops
            stream.close()

    def DeltaAggregatedResources(
        self, request_iterator: Iterator[discovery_pb2.DiscoveryRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[discovery_pb2.DiscoveryResponse]:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "use state-of-the-world ADS (GRPC)")
        yield from ()
