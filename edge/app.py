"""The composition root: build storage, engine, dispatcher and listeners from the config,
run until SIGTERM or SIGINT, then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from broker_core.apis import engine_apis
from broker_core.cluster.service import ClusterConfig
from broker_core.codec import record_walk
from broker_core.context import Endpoint
from broker_core.dispatch import Dispatcher
from broker_core.engine import Engine
from broker_core.engine_config import BrokerSetting, EngineConfig, flush_ms_default
from broker_core.groups.config import GroupConfig
from broker_core.naming import Namespace
from broker_core.quotas.apis import QuotaApis
from broker_core.quotas.entities import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    MAX_CONNECTIONS,
    MAX_PARTITIONS,
    MAX_STORED_BYTES,
    MAX_TOPICS,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from broker_core.quotas.limits import TenantLimits
from broker_core.quotas.manager import QuotaManager
from broker_core.quotas.mutations import MutationQuotas
from broker_core.quotas.rates import Window
from broker_core.quotas.store import QuotaStore
from broker_core.quotas.throttling import Throttling
from broker_core.storage import KeyValueStore, LogConfig, open_storage
from broker_core.storage.cluster import BrokerIdInUse, BrokerRecord, ListenerAddress
from broker_core.topic_configs import TYPE_BOOLEAN, TYPE_INT, TYPE_LIST, TYPE_STRING
from broker_core.transactions.coordinator import TxnConfig
from edge import cpu_slice, gc_tuning, open_files
from edge.acl_apis import AclApis
from edge.acl_store import AclStore
from edge.audit import AuditLog
from edge.authorization import Policy
from edge.config import TOPIC_DEFAULT_KEYS, BrokerConfig, config_key_of
from edge.denials import DenialReports, LoginFailures, Rejections
from edge.health import Readiness
from edge.helper_threads import give_way_to_the_loop
from edge.metrics import CONNECTIONS, REJECTED_CONNECTIONS, serve_metrics
from edge.quotas import (
    ConnectionGate,
    EntityQuotaCollector,
    QuotaEvents,
    TenantScope,
    TenantUsageCollector,
)
from edge.ready_line import describe_listeners
from edge.security import (
    ListenerSecurity,
    listener_mechanisms,
    listener_security,
    sasl_factories,
    tls_source,
    token_expiration_notice,
    token_validator,
)
from edge.session import Session, edge_apis
from listeners.server import (
    ConnectionCounts,
    ConnectionInfo,
    Limits,
    ListenerServer,
    LoginGate,
    ReadBudget,
)
from listeners.spec import ListenerSpec

log = logging.getLogger("edge.broker")
SASL_STEP_THREADS = 4
"""Threads checking tokens (signature checks; a login waits for the issuer only before the
first JWKS fetch lands, ``oauth.jwks``; the login gate, ``maxConcurrentLogins``, bounds the
queue)."""

META_KEY = "meta.properties"


def _stored_cluster_id(meta: bytes | None) -> str | None:
    """The ``cluster.id`` line of a stored ``meta.properties``, if there is one."""
    for line in (meta or b"").decode("utf-8", "replace").splitlines():
        if line.startswith("cluster.id="):
            return line.split("=", 1)[1].strip()
    return None


def cluster_id(kv: KeyValueStore) -> str:
    """The cluster id kept under ``meta.properties`` in the storage's key-value area (a file
    in the data directory on the file engine), decided once: the first broker to store
    one wins, every other broker sharing the storage reads it."""
    while True:
        meta = kv.get(META_KEY)
        found = _stored_cluster_id(meta)
        if found is not None:
            return found
        value = uuid.uuid4().hex[:22]
        if kv.compare_and_set(META_KEY, meta, f"cluster.id={value}\n".encode()):
            return value


def _topic_default(config: BrokerConfig, topic_key: str, field: str) -> str:
    """The default of topic config ``topic_key`` that the broker config's ``field`` sets
    (``flushIntervalMs`` 0, no periodic fsync, is ``flush.ms`` at its largest: never)."""
    value = getattr(config, field)
    return flush_ms_default(value) if topic_key == "flush.ms" else str(value)


def _broker_settings(config: BrokerConfig, log_dir: str) -> dict[str, BrokerSetting]:
    """The Kafka broker configs the BROKER resource's DescribeConfigs shows besides the
    topic defaults: each one's value, type and the keys of ours that set it."""
    def setting(value: str, kind: int, *fields: str) -> BrokerSetting:
        keys = [config_key_of(name) for name in fields]
        return BrokerSetting(value, kind, not config.model_fields_set.isdisjoint(fields),
                             "; ".join(f"{key.name} here: {key.doc}" for key in keys))

    listeners = config.kafka_listeners
    return {
        "broker.id": setting(str(config.broker_id), TYPE_INT, "broker_id"),
        "listeners": setting(listeners, TYPE_STRING, "kafka_listeners"),
        # the listeners' addresses unless advertised ones are given: set by either
        "advertised.listeners": setting(config.kafka_advertised_listeners or listeners,
                                        TYPE_STRING, "kafka_advertised_listeners",
                                        "kafka_listeners"),
        "listener.security.protocol.map": setting(config.kafka_protocol_map, TYPE_STRING,
                                                  "kafka_protocol_map"),
        "log.dirs": setting(log_dir, TYPE_STRING, "data_dir", "storage_url"),
        "sasl.enabled.mechanisms": setting(",".join(config.sasl_allowed_mechanisms),
                                           TYPE_LIST, "sasl_allowed_mechanisms"),
        "num.partitions": setting(str(config.default_num_partitions), TYPE_INT,
                                  "default_num_partitions"),
        "auto.create.topics.enable": setting(str(config.allow_auto_topic_creation).lower(),
                                             TYPE_BOOLEAN, "allow_auto_topic_creation"),
    }


def engine_config(config: BrokerConfig, cluster: str, log_dir: str) -> EngineConfig:
    """The engine's settings taken from the broker config (``log_dir``: the storage's
    location, shown as ``log.dirs``)."""
    return EngineConfig(
        broker_id=config.broker_id,
        cluster_id=cluster,
        allow_auto_topic_creation=config.allow_auto_topic_creation,
        validate_records=config.validate_records,
        default_num_partitions=config.default_num_partitions,
        flush_interval_messages=config.flush_interval_messages,
        flush_interval_ms=config.flush_interval_ms,
        retention_check_interval_ms=config.log_retention_check_interval_ms,
        log_cleaner_enable=config.log_cleaner_enable,
        log_cleaner_backoff_ms=config.log_cleaner_backoff_ms,
        log_cleaner_io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
        log_cleaner_dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
        producer_id_expiration_ms=config.producer_id_expiration_ms,
        producer_id_expiration_check_interval_ms=(
            config.producer_id_expiration_check_interval_ms),
        metadata_tenant=config.kafka_metadata_tenant,
        metadata_namespace=config.kafka_metadata_namespace,
        multi_tenant_metadata=config.kafka_enable_multi_tenant_metadata,
        offsets_topic_partitions=config.offsets_topic_num_partitions,
        offsets_topic_segment_bytes=config.offsets_topic_segment_bytes,
        offsets_topic_compaction_bytes=config.offsets_topic_compaction_bytes,
        groups=GroupConfig(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            group_id_max_length=config.group_id_max_length,
            offset_metadata_max_size=config.offset_metadata_max_size,
            max_size=config.group_max_size,
            metadata_max_bytes=config.group_metadata_max_bytes,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
        ),
        txn_topic_partitions=config.kafka_txn_log_topic_num_partitions,
        broker_configs=_broker_settings(config, log_dir),
        transactions=TxnConfig(
            enabled=config.kafka_transaction_coordinator_enabled,
            max_timeout_ms=config.transaction_max_timeout_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            abort_check_interval_ms=config.transaction_abort_timed_out_transactions_interval_ms,
        ),
        fetch_max_bytes=config.fetch_max_bytes,
        cluster=ClusterConfig(session_timeout_ms=config.broker_session_timeout_ms,
                              heartbeat_ms=config.broker_heartbeat_interval_ms),
        listed_namespaces=config.kop_allowed_namespaces,
        topic_defaults={topic_key: _topic_default(config, topic_key, field)
                        for topic_key, field in TOPIC_DEFAULT_KEYS.items()},
        configured_topic_defaults=frozenset(
            topic_key for topic_key, field in TOPIC_DEFAULT_KEYS.items()
            if field in config.model_fields_set),
    )


def quota_manager(config: BrokerConfig, kv: KeyValueStore) -> QuotaManager:
    """The client quotas stored in ``kv``, with the configured per-tenant defaults."""
    defaults = {
        PRODUCER_BYTE_RATE: float(config.default_tenant_producer_byte_rate),
        CONSUMER_BYTE_RATE: float(config.default_tenant_consumer_byte_rate),
        REQUEST_PERCENTAGE: float(config.default_tenant_request_percentage),
        CONNECTION_CREATION_RATE: float(config.default_tenant_connection_creation_rate),
        CONTROLLER_MUTATION_RATE: float(config.default_tenant_controller_mutation_rate),
        MAX_CONNECTIONS: float(config.default_tenant_max_connections),
        MAX_TOPICS: float(config.default_tenant_max_topics),
        MAX_PARTITIONS: float(config.default_tenant_max_partitions),
        MAX_STORED_BYTES: float(config.default_tenant_max_stored_bytes),
    }
    return QuotaManager(QuotaStore(kv), defaults,
                        Window(config.quota_window_num, config.quota_window_size_seconds))


def log_config(config: BrokerConfig) -> LogConfig:
    """Default ledger settings for partitions without topic overrides."""
    return LogConfig(
        segment_bytes=config.log_segment_bytes,
        segment_ms=config.log_segment_ms,
        retention_ms=config.log_retention_ms,
        retention_bytes=config.log_retention_bytes,
    )


class StartupError(Exception):
    """The broker cannot start: one line for the operator, nothing left listening."""


def os_reason(exc: OSError) -> str:
    """The OS's words for ``exc`` ("Address already in use"), without asyncio's wrapping."""
    if exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc)


class BrokerApp:
    """A running broker: its engine and its listeners."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.logs = open_storage(config.effective_storage_url(), log_config(config))
        try:
            self._build(config)
        except BaseException:
            self.logs.discard_created()
            raise

    def _build(self, config: BrokerConfig) -> None:
        """Everything after the storage (which is open and locked)."""
        self.acls = AclStore(self.logs.kv)
        self.policy = Policy(self.acls, config.authorization_enabled,
                             list(config.super_user_roles),
                             config.kafka_metadata_namespace, config.kafka_tenant)
        settings = engine_config(config, cluster_id(self.logs.kv), self.logs.location)
        self.engine = Engine(settings, self.logs, self.policy)
        self.engine.kv_readers.append(self.acls.read_again)
        self.audit = AuditLog(self.engine, config.audit_enabled)
        self.denials = DenialReports(self.audit.record, config.audit_denials_per_window,
                                     config.audit_denial_window_ms / 1000)
        self.policy.on_denied = self.denials.denied
        self.login_failures = LoginFailures(self.audit.record,
                                            config.audit_denials_per_window,
                                            config.audit_login_failures_per_window,
                                            config.audit_denial_window_ms / 1000)
        self.rejections = Rejections(self.audit.record, config.audit_denials_per_window,
                                     config.audit_rejections_per_window,
                                     config.audit_denial_window_ms / 1000)
        self.quotas = quota_manager(config, self.logs.kv)
        self.engine.kv_readers.append(self.quotas.store.read_again)
        self.quota_events = QuotaEvents(self.audit, self.quotas.window.span_s)
        self.quotas.observer = self.quota_events
        cluster = self.engine.cluster
        self.gate = ConnectionGate(self.quotas, self.quotas.window.span_s,
                                   lambda tenant: cluster.lease.elsewhere.get(tenant, 0),
                                   cluster.lease.reserve_connection)
        cluster.lease.connections = lambda: self.gate.admission.open
        self.limits = TenantLimits(self.quotas, self.logs, self.engine.tenancy.is_internal,
                                   config.tenant_usage_check_interval_ms / 1000)
        self.engine.limits = self.limits
        self.engine.mutations = MutationQuotas(self.quotas)
        self.dispatcher = Dispatcher(
            self.engine,
            engine_apis() + edge_apis()
            + AclApis(self.acls, self.policy, config.max_acl_bindings_per_tenant).specs()
            + QuotaApis(self.quotas.store, TenantScope(self.policy),
                        config.max_quota_entities_per_tenant).specs(),
            Throttling(self.quotas))
        self.home = Namespace(config.kafka_tenant, config.kafka_namespace)
        mechanisms = listener_mechanisms(config)
        self.tls = tls_source(config)
        """The TLS listeners' server contexts (None: no TLS listener)."""
        self.security: dict[str, ListenerSecurity] = {
            spec.name: listener_security(config, spec, mechanisms, self.tls)
            for spec in config.listener_specs()
        }
        needed = {m for s in self.security.values() if s.sasl for m in s.mechanisms}
        validator = token_validator(config)
        self.sasl = dict(sasl_factories(config, validator, needed))
        self.sasl_steps = ThreadPoolExecutor(SASL_STEP_THREADS, thread_name_prefix="sasl",
                                             initializer=give_way_to_the_loop)
        """The threads SASL steps run in: their own, so that a login storm's token checks
        never queue ahead of the fsyncs and other work of the default executor (1,000 of
        them did: a producer's acks=all waited behind them); they give way to the event
        loop thread (:mod:`edge.helper_threads`)."""
        notice = token_expiration_notice(config, validator)
        if notice is not None:
            log.info("%s", notice)
        if config.validate_records:
            (log.info if record_walk.NATIVE is not None else log.warning)(
                "%s", record_walk.NOTE)
        self.servers: list[tuple[ListenerSpec, ListenerServer]] = []
        self.advertised: dict[str, Endpoint] = {}
        self.stopping = asyncio.Event()
        self._joined = False
        self._stopping = False
        self.readiness = self._readiness()

    def _tls(self, listener: str) -> Callable[[], ssl.SSLContext] | None:
        """The current server context of ``listener``, read per connection (None: no TLS)."""
        return self.security[listener].tls

    def reload_tls(self, reason: str) -> None:
        """Build every TLS listener's server context again from its files (SIGHUP)."""
        if self.tls is None:
            log.info("%s: no TLS listener, nothing to reload", reason)
        else:
            self.tls.check(reason)

    def _rejected(self, listener: str) -> Callable[[str, str], None]:
        """What ``listener`` calls for a connection it refused or closed before serving
        it: counted, and audited within bounds (:class:`edge.denials.Rejections`)."""
        counter = REJECTED_CONNECTIONS.labels(listener)

        def rejected(peer: str, reason: str) -> None:
            counter.inc()
            self.rejections.rejected(listener, peer, reason)
        return rejected

    def _session(self, info: ConnectionInfo) -> Session:
        """A session for a new connection, told the advertised address of its listener."""
        CONNECTIONS.labels(info.listener).inc()
        return Session(self.dispatcher, info, self.advertised[info.listener], self.home,
                       self.security[info.listener], self.sasl,
                       self.config.failed_authentication_delay_ms,
                       self.config.connections_max_reauth_ms, self.audit,
                       self.config.sasl_server_max_receive_size, self.gate,
                       self.sasl_steps, self.policy.login_refusal, self.login_failures)

    async def start(self) -> list[ListenerSpec]:
        """Start the engine and every listener; return the listeners with their bound ports.

        A listener or the metrics endpoint that cannot bind raises :class:`StartupError`
        after the listeners already bound are closed and the engine is stopped (and a
        data directory this broker created is removed, before its lock is released).
        """
        try:
            self.engine.start()
            metrics = self._serve_metrics()
            bound = await self._listen()
            try:
                await self.engine.join(self._record(bound))
            except BrokerIdInUse as exc:
                raise StartupError(str(exc)) from None
            self._joined = True
            described = describe_listeners(bound) + metrics
        except BaseException:
            self.logs.discard_created(at_close=True)  # removed before the lock is released
            await self.stop(quiet=True)
            raise
        gc_tuning.settle()  # what start-up built leaves the collector's view
        self._ask_slice()
        log.info("edge-broker ready: broker %d, listeners %s", self.config.broker_id, described)
        return bound

    def _ask_slice(self) -> None:
        """Ask for ``eventLoopSliceUs`` for this thread, the event loop's
        (:mod:`edge.cpu_slice`)."""
        wanted = self.config.event_loop_slice_us
        if wanted and cpu_slice.apply(wanted) is None:
            log.info("eventLoopSliceUs=%d not applied: the kernel (Linux 6.12 on) did not take "
                     "it, or the thread is not under SCHED_OTHER", wanted)

    def _serve_metrics(self) -> str:
        """Serve metrics and health checks (before the listeners bind, so that ``/readyz``
        says 503 until the broker serves) when ``metricsPort`` is set; the ready line's
        words for it."""
        if not self.config.metrics_port:
            return ""
        host, port = self.config.metrics_host, self.config.metrics_port
        try:
            port = serve_metrics(self.engine, host, port, self.readiness, [
                TenantUsageCollector(self.quotas, self.limits, self.gate,
                                     lambda: self.engine.cluster.lease.elsewhere),
                EntityQuotaCollector(self.quotas, self.quota_events)])
        except OSError as exc:
            raise StartupError(f"cannot serve metrics on {host}:{port}: "
                               f"{os_reason(exc)}") from exc
        return f"; metrics on http://{host}:{port}/metrics"

    def _readiness(self) -> Readiness:
        """What ``/readyz`` checks: recovered and joined, every listener bound, a fresh
        cluster lease when the storage is shared, not stopping."""
        readiness = Readiness()
        listeners = len(self.config.listener_specs())
        readiness.add("storage open and recovered", lambda: self._joined)
        readiness.add("listeners bound", lambda: len(self.servers) == listeners)
        if self.logs.cluster.shared:
            readiness.add("cluster membership", self.engine.cluster.registered)
        readiness.add("not stopping", lambda: not self._stopping)
        return readiness

    def _record(self, bound: list[ListenerSpec]) -> BrokerRecord:
        """This broker as the cluster registry shows it: its listeners, bound and advertised."""
        return BrokerRecord(self.config.broker_id, self.config.broker_rack or None, tuple(
            ListenerAddress(s.name, s.protocol.value, s.advertised_host, s.advertised_port,
                            s.host, s.port) for s in bound))

    async def _listen(self) -> list[ListenerSpec]:
        """Bind every listener; StartupError names the one that cannot bind."""
        limits = Limits(self.config.max_frame_bytes, self.config.max_queued_requests,
                        self.config.connection_max_idle_ms,
                        self.config.max_connections_per_listener,
                        self.config.max_pending_response_bytes)
        unauthenticated = ReadBudget(self.config.max_unauthenticated_buffered_bytes)
        logins = LoginGate(self.config.max_concurrent_logins)
        counts = ConnectionCounts(self.config.max_connections_per_ip,
                                  self.config.ip_overrides())
        specs = self.config.listener_specs()
        warning = open_files.raise_open_files(len(specs) * limits.max_connections)
        if warning is not None:
            log.warning("%s", warning)
        bound = []
        for spec in specs:
            server = ListenerServer(spec.name, spec.host, spec.port, self._session, limits,
                                    self._tls(spec.name), self._rejected(spec.name),
                                    unauthenticated, logins, counts,
                                    self.config.tls_handshake_timeout_ms / 1000,
                                    self.config.trusted_proxies().get(spec.name),
                                    partial(self.gate.accepted, spec.name))
            try:
                port = await server.start()
            except OSError as exc:
                raise StartupError(f"cannot listen on {spec.name}://{spec.host}:{spec.port}: "
                                   f"{os_reason(exc)}") from exc
            if port != spec.port:
                spec = spec.with_bound_port(port)
            self.advertised[spec.name] = Endpoint(spec.advertised_host, spec.advertised_port)
            self.servers.append((spec, server))
            bound.append(spec)
        return bound

    async def stop(self, quiet: bool = False) -> bool:
        """Answer in-flight requests, close connections, seal ledgers and save metadata
        (``quiet``: after a failed start, without the log lines of a broker that ran).

        Every step is tried even when an earlier one failed (a full disk fails writes); one
        line is logged per step that could not be done. Returns whether all succeeded.
        """
        self._stopping = True
        if not quiet:
            log.info("edge-broker stopping")
        self.engine.begin_shutdown()
        for _spec, server in self.servers:
            await server.stop()
        self.servers.clear()
        self.sasl_steps.shutdown(wait=False, cancel_futures=True)
        self.denials.close_all()
        self.login_failures.close_all()
        self.rejections.close_all()
        self.audit.count_repeats()
        self.audit.flush()
        problems = await self.engine.stop()
        for problem in problems:
            log.error("shutdown: %s", problem)
        if problems:
            log.error("edge-broker stopped; %d shutdown step(s) failed (see above): the next "
                      "start recovers what they left", len(problems))
        elif not quiet:
            log.info("edge-broker stopped")
        return not problems

    async def run(self) -> bool:
        """Run until SIGTERM or SIGINT; return whether the shutdown did every step."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload_tls, "SIGHUP")
        await self.start()
        await self.stopping.wait()
        return await self.stop()
