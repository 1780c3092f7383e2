"""The rule for tenant, namespace and topic name parts.

A part is ASCII letters, digits, ``.``, ``_`` and ``-``, and is neither ``.`` nor
``..``. This module is the one home of that rule. It depends on nothing but the standard
library, and every layer may import it: logins (``sasl``) check the tenant and namespace
they name with it, the engine (``broker_core.naming``) checks each part of a topic name,
and the configuration (``edge.config``) checks ``kafkaTenant`` and its kin.
"""

from __future__ import annotations

import re

_NAME_PART = re.compile(r"[A-Za-z0-9._-]+")
NAME_RULE = "ASCII letters, digits, '.', '_' and '-' (not '.' or '..')"
"""The rule, as messages state it."""


def is_valid_name(part: str) -> bool:
    """True if ``part`` is a non-empty name part of allowed characters, not ``.``/``..``."""
    return part not in (".", "..") and _NAME_PART.fullmatch(part) is not None
