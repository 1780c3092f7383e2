"""Versioned listener and cluster sets served by the ADS server.

:class:`SnapshotStore` holds, per resource type, the packed resources and a version.  An
update bumps the version of a type only when its resources changed (compared by
deterministic serialization), and then tells every watcher (the open ADS streams).
Versions are decimal counters shared by both types, so they only grow.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from google.protobuf import any_pb2

from edge.envoy.filters import typed

__all__ = ["CLUSTER_TYPE", "LISTENER_TYPE", "TYPE_NAMES", "TYPE_ORDER", "Resources",
           "SnapshotStore"]

LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
TYPE_ORDER = (CLUSTER_TYPE, LISTENER_TYPE)
"""Clusters before listeners, so that a new listener's cluster is known when it arrives."""
TYPE_NAMES = {LISTENER_TYPE: "listeners", CLUSTER_TYPE: "clusters"}

Resource: TypeAlias = "listener_pb2.Listener | cluster_pb2.Cluster"
"""A resource served (xds-protos has no type stubs: mypy cannot check these classes)."""


@dataclass(frozen=True)
class Resources:
    """The resources of one type at one version, each packed in a protobuf ``Any``."""

    version: str
    items: tuple[any_pb2.Any, ...]
    names: tuple[str, ...]
    digest: str


def _resources(version: str, messages: Sequence[Resource]) -> Resources:
    ordered = sorted(messages, key=lambda m: str(m.name))
    digest = hashlib.sha256()
    for message in ordered:
        digest.update(message.SerializeToString(deterministic=True))
        digest.update(b"\x00")
    return Resources(version, tuple(typed(m) for m in ordered),
                     tuple(str(m.name) for m in ordered), digest.hexdigest())


class SnapshotStore:
    """The current listeners and clusters, with change notification."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = 0
        self._types: dict[str, Resources] = {}
        self._watchers: list[Callable[[], None]] = []
        self.update([], [])

    def update(self, listeners: Sequence[listener_pb2.Listener],
               clusters: Sequence[cluster_pb2.Cluster]) -> list[str]:
        """Replace the resources; return the types whose version changed (watchers told)."""
        with self._lock:
            candidate = {LISTENER_TYPE: listeners, CLUSTER_TYPE: clusters}
            fresh = {t: _resources("", m) for t, m in candidate.items()}
            changed = [t for t in TYPE_ORDER
                       if t not in self._types or self._types[t].digest != fresh[t].digest]
            if changed:
                self._counter += 1
                for type_url in changed:
                    item = fresh[type_url]
                    self._types[type_url] = Resources(str(self._counter), item.items,
                                                      item.names, item.digest)
            watchers = list(self._watchers)
        if changed:
            for notify in watchers:
                notify()
        return changed

    def get(self, type_url: str) -> Resources | None:
        """The resources of ``type_url`` (None for a type this server does not serve)."""
        with self._lock:
            return self._types.get(type_url)

    @property
    def version(self) -> str:
        """The newest version of any type."""
        with self._lock:
            return str(self._counter)

    def watch(self, notify: Callable[[], None]) -> None:
        """Call ``notify`` (from the updating thread) after every change."""
        with self._lock:
            self._watchers.append(notify)

    def unwatch(self, notify: Callable[[], None]) -> None:
        with self._lock:
            if notify in self._watchers:
                self._watchers.remove(notify)
