"""The structured fields of the broker's log lines: their names, and how a log call that
concerns a topic or a group names them.

A log call passes the fields as ``extra=`` (``log.info("...", ..., extra=topic_fields(t))``);
the text format ignores them, ``logFormat=json`` writes them as the line's fields
(``edge.log_format``, which bounds and escapes them as it does every argument). Topic and
group names are the internal ones (``tenant/namespace/topic``; a group with the tenant
whose offsets topic holds it), so each line also carries that ``tenant``.
"""

from __future__ import annotations

LOG_FIELDS = ("tenant", "principal", "client", "client_id", "listener", "topic", "group")
"""The ``extra`` fields of a log call that a JSON line carries: who (tenant, principal,
client address, client id), where (listener) and what (topic, group)."""

LogFields = dict[str, str]


def _tenant_of(internal_topic: str) -> str | None:
    tenant, sep, _rest = internal_topic.partition("/")
    return tenant if sep and tenant else None


def log_fields(**fields: str | None) -> LogFields:
    """The fields given, without those that are None (names from :data:`LOG_FIELDS`)."""
    unknown = set(fields) - set(LOG_FIELDS)
    if unknown:
        raise ValueError(f"not a log field: {', '.join(sorted(unknown))}")
    return {name: value for name, value in fields.items() if value is not None}


def topic_fields(internal_topic: str, **more: str | None) -> LogFields:
    """A line about a topic: ``topic`` and its ``tenant`` (plus ``more``)."""
    return log_fields(**{"tenant": _tenant_of(internal_topic), **more, "topic": internal_topic})


def group_fields(group_id: str, offsets_topic: str, **more: str | None) -> LogFields:
    """A line about a consumer group kept in ``offsets_topic`` (whose tenant is the
    group's): ``group`` and ``tenant`` (plus ``more``)."""
    return log_fields(**{"tenant": _tenant_of(offsets_topic), **more, "group": group_id})
