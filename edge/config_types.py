"""The kinds of broker configuration values: how a key is declared, read from text,
described to the operator and written back.

A key is a field of :class:`edge.config.BrokerConfig` annotated with :func:`key` (its
property name, documentation and pydantic constraints such as ``ge``/``le``/
``min_length``).  Its Python type says how its text is read (:func:`from_text`):
``int`` (decimal digits only), ``bool`` (``true``/``false`` in any case), a ``Literal``
of upper-case words (any case), ``tuple[str, ...]`` (a comma-separated list, blanks
dropped) or ``str``.  The special string kinds :data:`Name` and :data:`StorageUrl` carry
a :class:`Described` marker with their own description and, for secrets, masking.
:class:`ConfigKey` is the read-only view of one declared key that messages and the
README table are made from.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, Field, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from broker_core.storage.engines import ENGINES, shown_url, storage_scheme
from common.names import NAME_RULE, is_valid_name

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

ConfigValue = int | bool | str | tuple[str, ...]
"""What a configuration key may hold."""


class ConfigError(ValueError):
    """A configuration file, key or value is wrong; the message says which and why."""


@dataclass(frozen=True)
class Described:
    """Annotation marker of a string kind: what it expects and how a message shows it."""

    expected: str
    shown: Callable[[str], str] = str


def key(name: str, doc: str, *, ge: int | None = None, le: int | None = None,
        min_length: int | None = None) -> FieldInfo:
    """Declare a configuration key: ``Annotated[type, key("camelName", "doc", ...)]``."""
    if ge is not None and le is None:
        le = LONG_MAX
    info: FieldInfo = Field(alias=name, description=doc, ge=ge, le=le, min_length=min_length)
    return info


def _name(value: str) -> str:
    if not is_valid_name(value):
        raise ValueError("not a valid name")
    return value


def _storage_url(value: str) -> str:
    if value:
        storage_scheme(value)  # ValueError for an unknown scheme
    return value


def _mask_url(text: str) -> str:
    return shown_url(text) if "://" in text else text


Name = Annotated[str, AfterValidator(_name), Described(f"a non-empty name of {NAME_RULE}")]
"""A tenant or namespace name, by the rule logins and topic names follow."""

StorageUrl = Annotated[
    str,
    AfterValidator(_storage_url),
    Described(f"empty or a URL of scheme {' or '.join(sorted(ENGINES))}", _mask_url),
]
"""Empty, or a URL whose scheme names a storage engine; its password is never shown."""

_INTEGER = re.compile(r"[+-]?[0-9]+")


def _bound(info: FieldInfo, kind: type[annotated_types.Ge] | type[annotated_types.Le]
           ) -> int | None:
    for item in info.metadata:
        if isinstance(item, kind):
            value = item.ge if isinstance(item, annotated_types.Ge) else item.le
            return int(str(value))
    return None


def _described(info: FieldInfo) -> Described | None:
    return next((item for item in info.metadata if isinstance(item, Described)), None)


def expected(info: FieldInfo) -> str:
    """What an acceptable value of the key declared by ``info`` looks like."""
    described = _described(info)
    if described is not None:
        return described.expected
    kind = info.annotation
    if kind is bool:
        return "true or false"
    if kind is int:
        low, high = _bound(info, annotated_types.Ge), _bound(info, annotated_types.Le)
        return f"an integer >= {low}" + ("" if high in (None, LONG_MAX) else f" and <= {high}")
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(str(choice) for choice in get_args(kind))
    if get_origin(kind) is tuple:
        return "a comma-separated list"
    non_empty = any(isinstance(item, annotated_types.MinLen) for item in info.metadata)
    return "a non-empty string" if non_empty else "a string"


def from_text(info: FieldInfo, text: str) -> ConfigValue:
    """The typed value ``text`` (already stripped) stands for; ValueError if it has
    the wrong form (constraints are checked later, by pydantic)."""
    kind = info.annotation
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    if kind is int:
        if not _INTEGER.fullmatch(text):
            raise ValueError(text)
        return int(text)
    if get_origin(kind) is Literal:
        return text.upper()
    if get_origin(kind) is tuple:
        return tuple(item.strip() for item in text.split(",") if item.strip())
    return text


def to_text(value: object) -> str:
    """``value`` as properties text, such that :func:`from_text` reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


@dataclass(frozen=True)
class ConfigKey:
    """One declared configuration key: property name, attribute, default and doc."""

    name: str
    attr: str
    info: FieldInfo

    @property
    def doc(self) -> str:
        """What the key means (its ``description``)."""
        return self.info.description or ""

    @property
    def default(self) -> ConfigValue:
        """The value when the key is not given."""
        value: ConfigValue = self.info.default
        return value

    def expected(self) -> str:
        """What an acceptable value looks like, for error messages and docs."""
        return expected(self.info)

    def shown(self, text: str) -> str:
        """``text`` as an error message may show it (a secret inside is masked)."""
        described = _described(self.info)
        return text if described is None else described.shown(text)

    def invalid(self, value: object) -> ConfigError:
        """The error for a bad ``value`` (text as given, or a typed value)."""
        return ConfigError(f"invalid value {self.shown(to_text(value))!r} for {self.name!r}:"
                           f" expected {self.expected()}")

    @cached_property
    def _adapter(self) -> TypeAdapter[ConfigValue]:
        kind: object = self.info.annotation
        if self.info.metadata:
            kind = Annotated[kind, *self.info.metadata]
        # the declared type, rebuilt at run time: mypy cannot see it as a type form
        adapter: TypeAdapter[ConfigValue] = TypeAdapter(
            kind, config={"strict": True})  # type: ignore[arg-type]
        return adapter

    def parse(self, text: str) -> ConfigValue:
        """The value of ``text`` for this key; raises ConfigError naming the key."""
        stripped = text.strip()
        try:
            return self._adapter.validate_python(from_text(self.info, stripped))
        except (ValueError, ValidationError):
            raise self.invalid(stripped) from None
