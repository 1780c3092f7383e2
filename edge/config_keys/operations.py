"""Configuration keys of what the broker tells its operator: audit events, metrics
and log lines.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel

from common.settings import key
from edge.config_types import INT_MAX
from edge.log_format import LogFormat

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class AuditKeys(BaseModel):
    """The audit events."""

    audit_enabled: Annotated[bool, key(
        "auditEnabled",
        "write a JSON event per login outcome, authorization denial and rejected "
        "connection (failures, denials and rejections within `auditDenialsPerWindow`, "
        "`auditLoginFailuresPerWindow` and `auditRejectionsPerWindow`) to "
        "`<kafkaMetadataTenant>/<kafkaMetadataNamespace>/__audit`")] = True
    audit_denials_per_window: Annotated[int, key(
        "auditDenialsPerWindow",
        "authorization denials of one tenant, principal and API, and failed logins (and "
        "requests before a login) of one client host on one listener, written to the audit "
        "topic and the log per `auditDenialWindowMs`; the ones beyond are counted, and one "
        "event and one line at the window's end say how many were left out", ge=1,
        le=INT_MAX)] = 10
    audit_rejections_per_window: Annotated[int, key(
        "auditRejectionsPerWindow",
        "rejected connections (a failed TLS handshake, a frame too large before a login, a "
        "connection over a cap) of all client addresses together written to the audit "
        "topic per `auditDenialWindowMs` (each host and listener also within "
        "`auditDenialsPerWindow`); the ones beyond are counted "
        "(`kop_server_rejected_connections_total` counts them all), and one event at the "
        "window's end says how many were left out", ge=1, le=INT_MAX)] = 100
    audit_login_failures_per_window: Annotated[int, key(
        "auditLoginFailuresPerWindow",
        "failed logins (and requests before a login) of all client addresses together "
        "written to the audit topic and the log per `auditDenialWindowMs` (each host and "
        "listener also within `auditDenialsPerWindow`: many addresses had a share each); "
        "the ones beyond are counted, and one event and one line at the window's end say "
        "how many were left out", ge=1, le=INT_MAX)] = 100
    audit_denial_window_ms: Annotated[int, key(
        "auditDenialWindowMs",
        "the window of `auditDenialsPerWindow`", ge=100, le=INT_MAX)] = 10_000


class MetricsKeys(BaseModel):
    """The Prometheus endpoint."""

    metrics_port: Annotated[int, key(
        "metricsPort",
        "port of the Prometheus endpoint `/metrics`; 0 = off", ge=0, le=65535)] = 0
    metrics_host: Annotated[str, key(
        "metricsHost",
        "address the Prometheus endpoint binds", min_length=1)] = "127.0.0.1"


class LoggingKeys(BaseModel):
    """The broker's own log lines."""

    log_level: Annotated[LogLevel, key("logLevel", "logging level")] = "INFO"
    log_format: Annotated[LogFormat, key(
        "logFormat",
        "`text`: one line per record, `time LEVEL logger: message`; `json`: one JSON object "
        "per line with `time`, `level`, `logger`, `message` and, where the record has them, "
        "`tenant`, `principal`, `client`, `client_id`, `listener`, `topic`, `group` (client "
        "text escaped and bounded in both)")] = "TEXT"
