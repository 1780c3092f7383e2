# Hand-written: the base of the schema-built data classes (not messages, e.g. the consumer
# protocol's subscription), with what the broker uses of it.
from typing import Any, Self

from kafka.protocol.data_container import DataContainer

class ApiData(DataContainer):
    name: str
    type: str
    valid_versions: tuple[int, int]
    min_version: int
    max_version: int
    @classmethod
    def flexible_version_q(cls, version: int) -> bool: ...
    def encode(
        self, version: int | None = None, header: bool = True, framed: bool = False
    ) -> bytes: ...
    @classmethod
    def decode(
        cls, data: Any, version: int | None = None, header: bool = True, framed: bool = False
    ) -> Self: ...
