"""The ``edgekafka`` source and sink options, parsed once into a picklable dataclass.

Option names follow Spark's own Kafka connector (they are case-insensitive):

- ``kafka.bootstrap.servers`` (required); every other ``kafka.<name>`` option is handed
  to librdkafka as ``<name>`` (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
  ``kafka.sasl.username``, ``kafka.sasl.password``, ``kafka.ssl.ca.location``, ...).
- exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a
  regular expression matched against whole topic names) or ``assign`` (JSON
  ``{"topic": [0, 1]}``) for reading; ``topic`` for writing when rows carry none.
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON per
  partition ``{"topic": {"0": 23, "1": -2}}`` (-2 = earliest, -1 = latest);
  ``startingTimestamp`` (epoch ms, taking precedence over ``startingOffsets``) starts
  every partition at its first record at or after that time.
- ``maxOffsetsPerTrigger``, ``failOnDataLoss`` (default true), ``isolationLevel``
  (``read_committed``, the default, or ``read_uncommitted``), ``pollTimeoutMs``.
- OAUTHBEARER: ``oauth.issuerUrl`` + ``oauth.credentialsUrl`` (+ ``oauth.audience``,
  ``oauth.scope``) log in through :class:`oauth.login.ClientCredentialsLogin`;
  ``oauth.callback`` = ``package.module:function`` names a confluent-kafka ``oauth_cb``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
DEFAULT_POLL_TIMEOUT_MS = 120_000

# librdkafka settings the source and sink own; a ``kafka.`` option may not override them.
_RESERVED = {"group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof",
             "isolation.level", "enable.idempotence", "key.deserializer", "value.deserializer"}


class OptionError(ValueError):
    """An ``edgekafka`` option is missing or has a bad value."""


def _get(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {key.lower(): value for key, value in options.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None and str(value) != "":
            return str(value)
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise OptionError(f"option {name} must be true or false, not {value!r}")


def _positive_int(options: Mapping[str, str], *names: str) -> int | None:
    value = _get(options, *names)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"option {names[0]} must be an integer, not {value!r}") from None
    if number <= 0:
        raise OptionError(f"option {names[0]} must be positive, not {number}")
    return number


def _assignment(text: str) -> dict[str, list[int]]:
    try:
        document = json.loads(text)
        return {str(topic): sorted(int(p) for p in parts) for topic, parts in document.items()}
    except (ValueError, TypeError, AttributeError):
        raise OptionError(
            f'option assign must be JSON like {{"topic": [0, 1]}}, not {text!r}') from None


@dataclass(frozen=True)
class OAuthOptions:
    """How to get OAUTHBEARER tokens (all strings, so executors can rebuild the login)."""

    issuer_url: str | None = None
    credentials_url: str | None = None
    audience: str | None = None
    scope: str | None = None
    callback: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether any OAuth option was given."""
        return bool(self.issuer_url or self.callback)


@dataclass(frozen=True)
class KafkaOptions:
    """Everything the source and sink need, parsed from the DataFrame options."""

    bootstrap: str
    client: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra librdkafka settings from ``kafka.*`` options (security and tuning; kept out of
    the repr, which may reach logs, since they hold passwords)."""
    oauth: OAuthOptions = field(default=OAuthOptions(), repr=False)
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, list[int]] | None = None
    write_topic: str | None = None
    starting: str | None = None
    ending: str | None = None
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    isolation_level: str = "read_committed"
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS

    @property
    def describe_subscription(self) -> str:
        """The subscription as the user wrote it, for messages."""
        if self.pattern is not None:
            return f"subscribePattern={self.pattern}"
        if self.assign is not None:
            return f"assign={json.dumps(self.assign)}"
        return "subscribe=" + ",".join(self.topics)


def parse_options(options: Mapping[str, str], reading: bool = True) -> KafkaOptions:
    """Parse and check the options of one ``edgekafka`` read or write."""
    bootstrap = _get(options, "kafka.bootstrap.servers", "bootstrap", "bootstrapServers")
    if bootstrap is None:
        raise OptionError("option kafka.bootstrap.servers is required")
    client: dict[str, str] = {}
    for key, value in options.items():
        if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers":
            name = key[len("kafka."):]
            if name.lower() in _RESERVED and name.lower() != "isolation.level":
                raise OptionError(f"option {key} is managed by the edgekafka source")
            client[name] = str(value)
    isolation = (_get(options, "isolationLevel", "kafka.isolation.level")
                 or "read_committed").lower()
    client.pop("isolation.level", None)
    if isolation not in ISOLATION_LEVELS:
        raise OptionError(f"option isolationLevel must be one of {', '.join(ISOLATION_LEVELS)}")
    subscribe = _get(options, "subscribe")
    pattern = _get(options, "subscribePattern")
    assign_text = _get(options, "assign")
    given = [name for name, value in (("subscribe", subscribe), ("subscribePattern", pattern),
                                      ("assign", assign_text)) if value is not None]
    if reading and len(given) != 1:
        raise OptionError("give exactly one of the options subscribe, subscribePattern, assign"
                          + (f" (got {', '.join(given)})" if given else ""))
    timestamp = _get(options, "startingTimestamp")
    oauth = OAuthOptions(
        issuer_url=_get(options, "oauth.issuerUrl"),
        credentials_url=_get(options, "oauth.credentialsUrl"),
        audience=_get(options, "oauth.audience"),
        scope=_get(options, "oauth.scope"),
        callback=_get(options, "oauth.callback"),
    )
    if oauth.issuer_url and not oauth.credentials_url:
        raise OptionError("option oauth.issuerUrl needs oauth.credentialsUrl")
    try:
        starting_timestamp = None if timestamp is None else int(timestamp)
    except ValueError:
        raise OptionError(f"option startingTimestamp must be epoch milliseconds, "
                          f"not {timestamp!r}") from None
    return KafkaOptions(
        bootstrap=bootstrap,
        client=client,
        oauth=oauth,
        topics=tuple(t.strip() for t in (subscribe or "").split(",") if t.strip()),
        pattern=pattern,
        assign=None if assign_text is None else _assignment(assign_text),
        write_topic=_get(options, "topic"),
        starting=_get(options, "startingOffsets"),
        ending=_get(options, "endingOffsets"),
        starting_timestamp=starting_timestamp,
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        isolation_level=isolation,
        poll_timeout_ms=_positive_int(options, "pollTimeoutMs", "kafkaConsumer.pollTimeoutMs")
        or DEFAULT_POLL_TIMEOUT_MS,
    )
