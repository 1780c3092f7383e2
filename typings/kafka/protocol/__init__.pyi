# Hand-written: kafka.protocol's own ``__init__`` is empty; its message modules have
# generated stubs, the modules without one (the schema machinery) stay ``Any``.
from typing import Any

def __getattr__(name: str) -> Any: ...
