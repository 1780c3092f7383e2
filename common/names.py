"""The rule for tenant, namespace and topic name parts, and the names of the broker's own
topics' home that clients outside the broker (the Spark audit jobs) need too.

A part is ASCII letters, digits, ``.``, ``_`` and ``-``, and is neither ``.`` nor
``..``. This module is the one home of that rule. It depends on nothing but the standard
library, and every layer may import it: logins (``sasl``) check the tenant and namespace
they name with it, the engine (``broker_core.naming``) checks each part of a topic name,
and the configuration (``edge.config``) checks ``kafkaTenant`` and its kin.
"""

from __future__ import annotations

import re

DEFAULT_METADATA_TENANT = "public"
"""Where the broker keeps its own topics by default: ``kafkaMetadataTenant``..."""
DEFAULT_METADATA_NAMESPACE = "__kafka"
"""...and ``kafkaMetadataNamespace`` (KoP's defaults)."""
AUDIT_TOPIC = "__audit"
"""The audit topic's name inside the metadata namespace."""
DEFAULT_AUDIT_TOPIC = f"{DEFAULT_METADATA_TENANT}/{DEFAULT_METADATA_NAMESPACE}/{AUDIT_TOPIC}"
"""The audit topic's full name with the default metadata settings."""

_NAME_PART = re.compile(r"[A-Za-z0-9._-]+")
NAME_RULE = "ASCII letters, digits, '.', '_' and '-' (not '.' or '..')"
"""The rule, as messages state it."""


def is_valid_name(part: str) -> bool:
    """True if ``part`` is a non-empty name part of allowed characters, not ``.``/``..``."""
    return part not in (".", "..") and _NAME_PART.fullmatch(part) is not None
