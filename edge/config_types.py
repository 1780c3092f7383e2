"""The kinds of broker configuration values: how their text is read, described to the
operator and shown in messages.

A key is a field of :class:`edge.config.BrokerConfig` declared with
:func:`common.settings.key`.  Its Python type says how its text is read
(:func:`from_text`): ``int`` (decimal digits only), ``bool`` (``true``/``false`` in any
case), a ``Literal`` of upper-case words (any case), ``tuple[str, ...]`` (a
comma-separated list, blanks dropped) or ``str``.  The string kinds :data:`Name` and
:data:`StorageUrl` carry a :class:`Described` marker with their own description and, for
a secret, masking; :data:`SecretKeyUrl` marks a key URL whose ``data:`` form is a secret
(``check-config`` and error messages show it masked).  :class:`ConfigKey` is the view of
one declared key that messages and the README table are made from.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal, get_args, get_origin

import annotated_types
from pydantic import AfterValidator, TypeAdapter, ValidationError

from broker_core.storage.engines import ENGINES, shown_url, storage_scheme
from broker_core.topic_configs import COMPRESSION_TYPES
from common.names import TENANT_NAME_RULE, is_valid_tenant_name
from common.settings import LONG_MAX, DeclaredKey, to_text

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


def _name(value: str) -> str:
    if not is_valid_tenant_name(value):
        raise ValueError("not a valid name")
    return value


def _storage_url(value: str) -> str:
    if value:
        storage_scheme(value)  # ValueError for an unknown scheme
    return value


def _mask_url(text: str) -> str:
    return shown_url(text) if "://" in text else text


def _mask_key_url(text: str) -> str:
    """A ``data:`` URL carries the key itself: only its media type is shown; a ``file:``
    URL or path names where the key is, which is no secret."""
    if text.lower().startswith("data:"):
        return text.split(",", 1)[0] + ",****" if "," in text else "data:****"
    return text


Name = Annotated[str, AfterValidator(_name), Described(f"a non-empty name of {TENANT_NAME_RULE}")]
"""A tenant or namespace name, by the rule logins and topic names follow."""

StorageUrl = Annotated[
    str,
    AfterValidator(_storage_url),
    Described(f"empty or a URL of scheme {' or '.join(sorted(ENGINES))}", _mask_url),
]
"""Empty, or a URL whose scheme names a storage engine; its password is never shown."""



def _compression_type(value: str) -> str:
    if value not in COMPRESSION_TYPES:
        raise ValueError("not a compression type")
    return value


CompressionType = Annotated[
    str,
    AfterValidator(_compression_type),
    Described("one of " + ", ".join(COMPRESSION_TYPES)),
]
"""A ``compression.type`` value, as topics take it (lower case)."""


SecretKeyUrl = Annotated[str, Described("a string", _mask_key_url)]
"""A key URL (``data:`` or ``file:``) whose ``data:`` form holds a secret: never shown."""

_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class ConfigKey(DeclaredKey):
    """One broker configuration key: how it is read, described and shown."""

    @property
    def _described(self) -> Described | None:
        return next((m for m in self.info.metadata if isinstance(m, Described)), None)

    def expected(self) -> str:
        """What an acceptable value looks like, for error messages and docs."""
        if self._described is not None:
            return self._described.expected
        kind = self.info.annotation
        if kind is bool:
            return "true or false"
        if kind is int:
            low, high = self.bounds()
            return f"an integer >= {low}" + ("" if high in (None, LONG_MAX)
                                            else f" and <= {high}")
        if get_origin(kind) is Literal:
            return "one of " + ", ".join(str(choice) for choice in get_args(kind))
        if get_origin(kind) is tuple:
            return "a comma-separated list"
        non_empty = any(isinstance(m, annotated_types.MinLen) for m in self.info.metadata)
        return "a non-empty string" if non_empty else "a string"

    def from_text(self, text: str) -> ConfigValue:
        """The typed value ``text`` (already stripped) stands for; ValueError if it has
        the wrong form (constraints are pydantic's to check)."""
        kind = self.info.annotation
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

    def shown(self, text: str) -> str:
        """``text`` as an error message may show it (a secret inside is masked)."""
        return text if self._described is None else self._described.shown(text)

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
            return self._adapter.validate_python(self.from_text(stripped))
        except (ValueError, ValidationError):
            raise self.invalid(stripped) from None
