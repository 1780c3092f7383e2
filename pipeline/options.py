"""The ``edgekafka`` source and sink options, parsed once into a picklable dataclass.

Option names follow Spark's own Kafka connector (they are case-insensitive):

- ``kafka.bootstrap.servers`` (required); every other ``kafka.<name>`` option is handed
  to librdkafka as ``<name>`` (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
  ``kafka.sasl.username``, ``kafka.sasl.password``, ``kafka.ssl.ca.location``, ...), but
  those the source and sink manage (:data:`_RESERVED`) and, when writing, a
  ``kafka.acks`` other than ``all`` are refused.
- exactly one of ``subscribe`` (comma-separated topics), ``subscribePattern`` (a
  regular expression matched against whole topic names) or ``assign`` (JSON
  ``{"topic": [0, 1]}``) for reading; ``topic`` for writing (it overrides the rows'
  ``topic`` column, as in Spark).
- ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or JSON per
  partition ``{"topic": {"0": 23, "1": -2}}`` (-2 = earliest, -1 = latest);
  ``startingTimestamp`` (epoch ms, taking precedence over ``startingOffsets``) starts
  every partition at its first record at or after that time. Spark's per-partition and
  ending timestamp options are refused by name (:data:`_NOT_SUPPORTED`), as is any other
  name this module does not declare (``kafka.*`` aside; ``path`` and
  ``checkpointLocation`` are Spark's own), with a did-you-mean hint.
- ``transactionalIdPrefix`` (streaming sink): the prefix of the transactional ids,
  batch-marker groups and staging topic of the exactly-once sink, default
  ``edgekafka-<query id>``.
- ``atomicity`` (streaming sink): ``batch`` (the default: a micro-batch becomes visible
  whole, through a staging topic the driver copies in one transaction) or ``partition``
  (one transaction per task: faster, but a crashed batch can be partly visible until the
  query restarts); see :mod:`pipeline.exactly_once`.
- ``copyPauseMs`` (streaming sink, testing only): with ``atomicity=batch`` the driver
  pauses this long before copying each record, so that a test can kill it mid-copy.
- ``maxOffsetsPerTrigger``, ``failOnDataLoss`` (default true), ``isolationLevel``
  (``read_committed``, the default, or ``read_uncommitted``), ``pollTimeoutMs``;
  ``includeHeaders`` (``true`` only: rows always have headers).
- OAUTHBEARER: ``oauth.issuerUrl`` + ``oauth.credentialsUrl`` (+ ``oauth.audience``,
  ``oauth.scope``) log in through :class:`oauth.login.ClientCredentialsLogin`;
  ``oauth.callback`` = ``package.module:function`` names a confluent-kafka ``oauth_cb``.

Each option is declared once, as a field of the pydantic model :class:`KafkaOptions` or
:class:`OAuthOptions` whose alias (or aliases, the first being the documented name) is
the option's name; :func:`parse_options` matches names case-insensitively, hands the
``kafka.*`` rest to librdkafka and checks what spans several options.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Literal, get_args

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
)
from pydantic.fields import FieldInfo

from common.settings import first_problem

IsolationLevel = Literal["read_committed", "read_uncommitted"]
ISOLATION_LEVELS: tuple[str, ...] = get_args(IsolationLevel)
Atomicity = Literal["batch", "partition"]
ATOMICITIES: tuple[str, ...] = get_args(Atomicity)
DEFAULT_POLL_TIMEOUT_MS = 120_000

# librdkafka settings the source and sink own; a ``kafka.`` option may not override them.
_RESERVED = {"group.id", "enable.auto.commit", "auto.offset.reset", "enable.partition.eof",
             "isolation.level", "enable.idempotence", "key.deserializer", "value.deserializer",
             "transactional.id"}


class OptionError(ValueError):
    """An ``edgekafka`` option is missing or has a bad value."""


def _option(*names: str, repr: bool = True) -> FieldInfo:
    """Declare an option by its names (Spark's first, then accepted synonyms)."""
    info: FieldInfo = Field(validation_alias=AliasChoices(*names), alias=names[0], repr=repr)
    return info


def _bool_text(value: object) -> object:
    if isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"must be true or false, not {value!r}")
        return value.lower() == "true"
    return value


def _int_text(value: object) -> object:
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?[0-9]+", value.strip()):
            raise ValueError(f"must be an integer, not {value!r}")
        return int(value)
    return value


def _epoch_ms(value: object) -> object:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"must be epoch milliseconds, not {value!r}") from None
    if isinstance(value, int) and value < 0:
        raise ValueError(f"must be epoch milliseconds (0 or more), not {value}")
    return value


def _regex(value: object) -> object:
    if isinstance(value, str):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"is not a regular expression ({exc}): {value!r}") from None
    return value


def _headers_on(value: object) -> object:
    if value is False:
        raise ValueError("cannot be false: edgekafka rows always have a headers column "
                         "(drop it with .drop(\"headers\"))")
    return value


def _assignment(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        document = json.loads(value)
        return {str(topic): sorted(int(p) for p in parts) for topic, parts in document.items()}
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f'must be JSON like {{"topic": [0, 1]}}, not {value!r}') from None


def _topics(value: object) -> object:
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return value


_FROZEN = ConfigDict(frozen=True, extra="forbid", validate_by_name=True, validate_by_alias=True)
Flag = Annotated[bool, BeforeValidator(_bool_text)]
Positive = Annotated[PositiveInt, BeforeValidator(_int_text)]
NonNegative = Annotated[NonNegativeInt, BeforeValidator(_int_text)]


class OAuthOptions(BaseModel):
    """How to get OAUTHBEARER tokens (all strings, so executors can rebuild the login)."""

    model_config = _FROZEN

    issuer_url: Annotated[str | None, _option("oauth.issuerUrl")] = None
    credentials_url: Annotated[str | None, _option("oauth.credentialsUrl")] = None
    audience: Annotated[str | None, _option("oauth.audience")] = None
    scope: Annotated[str | None, _option("oauth.scope")] = None
    callback: Annotated[str | None, _option("oauth.callback")] = None

    @property
    def enabled(self) -> bool:
        """Whether any OAuth option was given."""
        return bool(self.issuer_url or self.callback)


class KafkaOptions(BaseModel):
    """Everything the source and sink need, parsed from the DataFrame options."""

    model_config = _FROZEN

    bootstrap: Annotated[str, _option("kafka.bootstrap.servers", "bootstrap",
                                      "bootstrapServers")]
    client: dict[str, str] = Field(default_factory=dict, repr=False)
    """Extra librdkafka settings from ``kafka.*`` options (security and tuning; kept out of
    the repr, which may reach logs, since they hold passwords)."""
    oauth: OAuthOptions = Field(default=OAuthOptions(), repr=False)
    topics: Annotated[tuple[str, ...], BeforeValidator(_topics), _option("subscribe")] = ()
    pattern: Annotated[str | None, BeforeValidator(_regex), _option("subscribePattern")] = None
    assign: Annotated[dict[str, list[int]] | None, BeforeValidator(_assignment),
                      _option("assign")] = None
    write_topic: Annotated[str | None, _option("topic")] = None
    transactional_id_prefix: Annotated[str | None, _option("transactionalIdPrefix")] = None
    atomicity: Annotated[Atomicity, BeforeValidator(str.lower), _option("atomicity")] = "batch"
    copy_pause_ms: Annotated[NonNegative, _option("copyPauseMs")] = 0
    starting: Annotated[str | None, _option("startingOffsets")] = None
    ending: Annotated[str | None, _option("endingOffsets")] = None
    starting_timestamp: Annotated[int | None, BeforeValidator(_epoch_ms),
                                  _option("startingTimestamp")] = None
    max_offsets_per_trigger: Annotated[Positive | None, _option("maxOffsetsPerTrigger")] = None
    fail_on_data_loss: Annotated[Flag, _option("failOnDataLoss")] = True
    isolation_level: Annotated[IsolationLevel, BeforeValidator(str.lower), _option(
        "isolationLevel", "kafka.isolation.level")] = "read_committed"
    poll_timeout_ms: Annotated[Positive, _option(
        "pollTimeoutMs", "kafkaConsumer.pollTimeoutMs")] = DEFAULT_POLL_TIMEOUT_MS
    include_headers: Annotated[Flag, AfterValidator(_headers_on),
                               _option("includeHeaders")] = True
    """Spark's option, accepted as ``true`` only (the rows always carry headers)."""

    def covers(self, topic: str, partition: int) -> bool:
        """Whether the subscription covers ``topic``-``partition`` (if the broker has it)."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign is not None:
            return partition in self.assign.get(topic, ())
        return topic in self.topics

    @property
    def describe_subscription(self) -> str:
        """The subscription as the user wrote it, for messages."""
        if self.pattern is not None:
            return f"subscribePattern={self.pattern}"
        if self.assign is not None:
            return f"assign={json.dumps(self.assign)}"
        return "subscribe=" + ",".join(self.topics)


def _names(model: type[BaseModel]) -> dict[str, tuple[str, ...]]:
    """Each field's option names, in order of preference."""
    names: dict[str, tuple[str, ...]] = {}
    for attr, info in model.model_fields.items():
        if isinstance(info.validation_alias, AliasChoices):
            names[attr] = tuple(str(c) for c in info.validation_alias.choices)
    return names


_OPTIONS = _names(KafkaOptions)
_OAUTH_OPTIONS = _names(OAuthOptions)
_CHOICES = {"isolation_level": ISOLATION_LEVELS, "atomicity": ATOMICITIES}
_NOT_EMPTY = {"topics", "pattern", "assign", "write_topic", "transactional_id_prefix"}
"""Options whose empty value is an error rather than "not given"."""
_SPARK_GENERIC = ("path", "checkpointLocation")
"""Options Spark itself may hand every data source."""
_NOT_SUPPORTED = {
    "startingOffsetsByTimestamp": "use startingTimestamp (one time for every partition)",
    "endingOffsetsByTimestamp": "use endingOffsets",
    "endingTimestamp": "use endingOffsets",
    "startingOffsetsByTimestampStrategy": "use startingTimestamp",
    "minPartitions": "a read has one Spark partition per Kafka partition",
    "maxRecordsPerPartition": "a read has one Spark partition per Kafka partition",
    "minOffsetsPerTrigger": "use maxOffsetsPerTrigger",
    "maxTriggerDelay": "use maxOffsetsPerTrigger",
    "groupIdPrefix": "the source reads without a consumer group",
    "fetchOffset.numRetries": "offset requests are retried by librdkafka",
    "fetchOffset.retryIntervalMs": "offset requests are retried by librdkafka",
}
"""Options of Spark's Kafka connector that this source refuses, and what to do instead."""


def _known_names() -> dict[str, str]:
    """Every accepted option name (lowercase) with its documented spelling."""
    known = {name.lower(): names[0] for table in (_OPTIONS, _OAUTH_OPTIONS)
             for names in table.values() for name in names}
    return known | {name.lower(): name for name in _SPARK_GENERIC}


def _check_names(options: Mapping[str, str]) -> None:
    """Refuse option names the source does not take (``kafka.*`` aside), with a hint."""
    known = _known_names()
    unsupported = {name.lower(): (name, hint) for name, hint in _NOT_SUPPORTED.items()}
    for key in options:
        lowered = key.lower()
        if lowered in known or lowered.startswith("kafka."):
            continue
        if lowered in unsupported:
            name, hint = unsupported[lowered]
            raise OptionError(f"option {name} of Spark's Kafka connector is not supported by "
                              f"the edgekafka source: {hint}")
        close = difflib.get_close_matches(lowered, list(known), n=1, cutoff=0.75)
        hint = f" (did you mean {known[close[0]]}?)" if close else ""
        raise OptionError(f"unknown option {key}{hint}")


def _pick(lowered: Mapping[str, str], names: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """The given options by field: the first name given non-empty wins."""
    picked: dict[str, str] = {}
    for attr, choices in names.items():
        for name in choices:
            value = lowered.get(name.lower())
            if value == "" and attr in _NOT_EMPTY:
                raise OptionError(f"option {choices[0]} must not be empty")
            if value is not None and value != "":
                picked[attr] = value
                break
    return picked


def _reason(exc: ValidationError) -> str:
    problem = first_problem(exc)
    attr = next(attr for attr, names in _OPTIONS.items()
                if problem.where == attr or problem.where in names)
    name = _OPTIONS[attr][0]
    if problem.cause is not None:
        return f"option {name} {problem.cause}"
    if attr in _CHOICES:
        return f"option {name} must be one of {', '.join(_CHOICES[attr])}"
    if attr == "bootstrap":
        return f"option {name} is required"
    if attr == "copy_pause_ms":
        return f"option {name} must not be negative, not {problem.value}"
    return f"option {name} must be positive, not {problem.value}"


def parse_options(options: Mapping[str, str], reading: bool = True) -> KafkaOptions:
    """Parse and check the options of one ``edgekafka`` read or write."""
    _check_names(options)
    lowered = {key.lower(): str(value) for key, value in options.items()}
    client: dict[str, str] = {}
    for key, value in options.items():
        if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers":
            name = key[len("kafka."):]
            if name.lower() in _RESERVED and name.lower() != "isolation.level":
                raise OptionError(f"option {key} is managed by the edgekafka source")
            client[name] = str(value)
    client.pop("isolation.level", None)
    acks = next((value for name, value in client.items() if name.lower() == "acks"), None)
    if not reading and acks is not None and acks.strip().lower() not in ("all", "-1"):
        raise OptionError(f"option kafka.acks must be all (or -1), not {acks!r}: the "
                          "edgekafka sink's producer is idempotent and waits for all")
    values = _pick(lowered, _OPTIONS)
    given = [_OPTIONS[attr][0] for attr in ("topics", "pattern", "assign") if attr in values]
    if "bootstrap" in values and reading and len(given) != 1:
        raise OptionError("give exactly one of the options subscribe, subscribePattern, assign"
                          + (f" (got {', '.join(given)})" if given else ""))
    oauth = OAuthOptions.model_validate(_pick(lowered, _OAUTH_OPTIONS))
    if oauth.issuer_url and not oauth.credentials_url:
        raise OptionError("option oauth.issuerUrl needs oauth.credentialsUrl")
    try:
        return KafkaOptions.model_validate({**values, "client": client, "oauth": oauth})
    except ValidationError as exc:
        raise OptionError(_reason(exc)) from None
