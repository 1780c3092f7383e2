# Hand-written (tools/protocol_stubs.py keeps the rest of typings/kafka): kafka-python's
# package. Only ``kafka.protocol``'s message modules have stubs; ``__getattr__`` marks this
# stub incomplete, so every other name and submodule of ``kafka`` stays ``Any``.
from typing import Any

__version__: str

def __getattr__(name: str) -> Any: ...
