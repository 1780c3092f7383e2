# Hand-written: the base of every schema-built class, with what the broker uses of it.
from typing import Any

from kafka.protocol.schemas.fields import BaseField

class DataContainer:
    tags: set[str] | None
    unknown_tags: dict[str, Any] | None
    fields: dict[str, BaseField]
    """The schema's field objects by name (a class property)."""
    def __init__(self, *args: Any, version: int | None = None, **field_vals: Any) -> None: ...
    @property
    def version(self) -> int | None: ...
    def to_dict(self, meta: bool = False, json: bool = True) -> dict[str, Any]: ...
