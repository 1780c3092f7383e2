"""The rule for tenant, namespace and topic name parts, and the names of the broker's own
topics' home that clients outside the broker (the Spark audit jobs) need too.

A part is ASCII letters, digits, ``.``, ``_`` and ``-``, and is neither ``.`` nor
``..``; a tenant or namespace name is at most :data:`MAX_TENANT_NAME_LENGTH` characters
(a topic's own part at most Kafka's 249: ``broker_core.naming``). This module is the one
home of that rule. It depends on nothing but the standard
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


MAX_TENANT_NAME_LENGTH = 64
"""The longest tenant or namespace name. Each is a directory of the file engine (at most
255 bytes a name) and part of every full topic name ``tenant/namespace/topic`` (the topic
part up to 249) that PostgreSQL keys and metric labels carry; 64 leaves room in all of
them and bounds what a login can make the broker hold per tenant."""
TENANT_NAME_RULE = f"{NAME_RULE}, at most {MAX_TENANT_NAME_LENGTH} characters"
"""The tenant and namespace rule, as messages state it."""


def is_valid_tenant_name(part: str) -> bool:
    """True if ``part`` may name a tenant or a namespace: a valid name part of at most
    :data:`MAX_TENANT_NAME_LENGTH` characters."""
    return len(part) <= MAX_TENANT_NAME_LENGTH and is_valid_name(part)
