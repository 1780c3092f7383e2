# Hand-written: the base of every request and response class, with what the broker uses
# of it. ``Message[v]`` (the metaclass's ``__getitem__``) is the class fixed at version v.
from typing import Any, Self, TypeVar

from kafka.protocol.data_container import DataContainer

_M = TypeVar("_M")

class VersionSubscriptable(type):
    def __getitem__(cls: type[_M], version: int | None) -> type[_M]: ...

class ApiMessage(DataContainer, metaclass=VersionSubscriptable):
    name: str
    type: str
    API_KEY: int
    API_VERSION: int
    valid_versions: tuple[int, int]
    min_version: int
    max_version: int
    @classmethod
    def flexible_version_q(cls, version: int) -> bool: ...
    @classmethod
    def is_request(cls) -> bool: ...
    def encode(
        self, version: int | None = None, header: bool = False, framed: bool = False
    ) -> bytearray: ...
    @classmethod
    def decode(
        cls,
        data: bytes | bytearray | memoryview,
        version: int | None = None,
        header: bool = False,
        framed: bool = False,
    ) -> Self: ...
