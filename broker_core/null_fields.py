"""Nulls where a request schema forbids them.

The schema decoder of ``kafka.protocol`` reads a length of -1 as None for every array,
string and bytes field, nullable or not. Kafka's generated readers refuse a null in a
non-nullable field ("non-nullable field ... was serialized as null"): the request does
not parse and the connection is closed. :func:`first_forbidden_null` finds such a field
in a decoded request so that the dispatcher can refuse it the same way, and handlers only
ever meet None where the schema allows it. Each (schema, version) gets a walk plan once:
only the fields that can hold a null, and the structs leading to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields import BaseField

_NULLABLE_KINDS = frozenset({"string", "bytes", "records"})
"""Simple types the decoder turns into None on length -1 (a zero UUID becomes None too,
but that is a value, not a null on the wire)."""


@dataclass(frozen=True, slots=True)
class _Step:
    """One field to look at: may it be null, and the plan of its struct (or its array's
    structs), empty when it holds no struct."""

    name: str
    nullable: bool
    many: bool
    inner: tuple[_Step, ...]


Fields = dict[str, BaseField] | tuple[BaseField, ...] | None
"""A schema's or a struct field's fields (by name, in order, or none)."""


def _listed(fields: Fields) -> list[BaseField]:
    if fields is None:
        return []
    return list(fields.values()) if isinstance(fields, dict) else list(fields)


def _plan(fields: Fields, version: int) -> tuple[_Step, ...]:
    steps = []
    for field in _listed(fields):
        if not field.for_version_q(version):
            continue
        nullable = bool(field.nullable_for_version_q(version))
        if field.is_struct_array() or field.is_struct():
            inner = _plan(field.fields, version)
            many = bool(field.is_struct_array())
            if many or inner or not nullable:
                steps.append(_Step(field.name, nullable, many, inner))
        elif (field.is_array() or field.type_str in _NULLABLE_KINDS) and not nullable:
            steps.append(_Step(field.name, nullable, False, ()))
    return tuple(steps)


@cache
def _request_plan(schema: type[ApiMessage], version: int) -> tuple[_Step, ...]:
    return _plan(schema.fields, version)


def _walk(value: object, plan: tuple[_Step, ...]) -> str | None:
    for step in plan:
        held = getattr(value, step.name, None)
        if held is None:
            if not step.nullable:
                return step.name
            continue
        if not step.inner:
            continue
        for item in held if step.many else (held,):
            found = _walk(item, step.inner)
            if found is not None:
                return f"{step.name}.{found}"
    return None


def first_forbidden_null(schema: type[ApiMessage], version: int,
                         body: ApiMessage) -> str | None:
    """The dotted path of the first non-nullable field that ``body`` (a decoded request of
    ``schema`` at ``version``) holds as null, or None when there is none."""
    return _walk(body, _request_plan(schema, version))
