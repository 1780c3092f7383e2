"""Settings declared as pydantic model fields, shared by the broker's configuration
(``edge.config``) and the OAuth validator's (``oauth.settings``).

A setting is a field ``attr: Annotated[type, key("propertyName", "doc", ge=..)] = default``:
the property name is the field's alias, the documentation its description, the
constraints pydantic's.  :class:`DeclaredKey` is the read-only view of one such field
that error messages and the README tables are made from; :func:`first_problem` reduces a
pydantic ValidationError to the field, the value and the cause an error message names.
It depends on pydantic only, so every layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass

import annotated_types
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

LONG_MAX = 2**63 - 1

Number = int | float


def key(name: str, doc: str, *, ge: Number | None = None, le: Number | None = None,
        min_length: int | None = None) -> FieldInfo:
    """Declare a setting: ``Annotated[type, key("propertyName", "doc", ...)]``.

    An integer with a lower bound and no upper one gets ``le=LONG_MAX`` (a Java long).
    """
    if ge is not None and le is None and isinstance(ge, int):
        le = LONG_MAX
    info: FieldInfo = Field(alias=name, description=doc, ge=ge, le=le, min_length=min_length)
    return info


def to_text(value: object) -> str:
    """``value`` as settings-file text: ``true``/``false``, a comma list, ``2.5``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class DeclaredKey:
    """One declared setting: property name, attribute and its pydantic field."""

    name: str
    attr: str
    info: FieldInfo

    @property
    def doc(self) -> str:
        """What the setting means (its ``description``)."""
        return self.info.description or ""

    @property
    def default(self) -> object:
        """The value when the setting is not given."""
        value: object = self.info.default
        return value

    def bounds(self) -> tuple[Number | None, Number | None]:
        """The lower and upper bound of a number (None where there is none)."""
        low: Number | None = None
        high: Number | None = None
        for item in self.info.metadata:
            if isinstance(item, annotated_types.Ge):
                low = _number(item.ge)
            elif isinstance(item, annotated_types.Le):
                high = _number(item.le)
        return low, high


def _number(value: object) -> Number:
    return value if isinstance(value, int | float) else float(str(value))


def declared_keys(model: type[BaseModel]) -> tuple[DeclaredKey, ...]:
    """The fields of ``model`` that have a property name (an alias), in order."""
    return tuple(DeclaredKey(info.alias, attr, info)
                 for attr, info in model.model_fields.items() if info.alias)


@dataclass(frozen=True)
class Problem:
    """The first thing pydantic refused: where, what, and the validator's own error."""

    where: str
    """The attribute or property name at fault; empty for a check across fields."""
    value: object
    cause: Exception | None
    """The exception a validator raised (its message says what is wrong), if any."""
    message: str
    """pydantic's description of the problem."""


def first_problem(exc: ValidationError) -> Problem:
    """The first error of ``exc``."""
    error = exc.errors()[0]
    cause = error.get("ctx", {}).get("error")
    where = str(error["loc"][0]) if error["loc"] else ""
    return Problem(where, error["input"], cause if isinstance(cause, Exception) else None,
                   error["msg"])
