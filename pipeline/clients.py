"""confluent-kafka clients for the source and sink: their settings, security included.

SASL/PLAIN comes from ``kafka.security.protocol`` / ``kafka.sasl.username`` /
``kafka.sasl.password`` (the mechanism defaults to PLAIN when a username is given).
OAUTHBEARER uses this project's login callback (:mod:`oauth.login`) when
``oauth.issuerUrl`` is set, or any confluent ``oauth_cb`` named by ``oauth.callback``.
A login is built once per Python process and shared by its clients.
"""

from __future__ import annotations

import importlib
import threading
import uuid
from collections.abc import Callable
from typing import Any, cast

import confluent_kafka
from confluent_kafka.admin import AdminClient

from pipeline.options import KafkaOptions, OAuthOptions, OptionError

OAuthCallback = Callable[[str], tuple[str, float, str, dict[str, str]]]

_callbacks: dict[OAuthOptions, OAuthCallback] = {}
_lock = threading.Lock()


def _import_callback(path: str) -> OAuthCallback:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise OptionError(f"option oauth.callback must be 'package.module:function', not {path!r}")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise OptionError(f"oauth.callback {path!r} is not callable")
    return cast("OAuthCallback", target)  # a function the user named: checked callable


def _login_callback(oauth: OAuthOptions) -> OAuthCallback:
    from oauth.adapters import confluent_oauth_cb
    from oauth.login import ClientCredentialsLogin

    assert oauth.issuer_url is not None and oauth.credentials_url is not None
    login = ClientCredentialsLogin(oauth.issuer_url, oauth.credentials_url,
                                   audience=oauth.audience, scope=oauth.scope)
    return confluent_oauth_cb(login)


def oauth_callback(oauth: OAuthOptions) -> OAuthCallback:
    """The ``oauth_cb`` for these OAuth options (one per process and options)."""
    with _lock:
        callback = _callbacks.get(oauth)
        if callback is None:
            callback = (_import_callback(oauth.callback) if oauth.callback
                        else _login_callback(oauth))
            _callbacks[oauth] = callback
        return callback


# Any: confluent-kafka's stubs type a config's values as str/int/float/bool, but librdkafka
# also takes callbacks (``oauth_cb``), which this config may hold.
def base_config(options: KafkaOptions) -> dict[str, Any]:
    """Bootstrap, security and pass-through ``kafka.*`` settings shared by every client."""
    config: dict[str, Any] = {"bootstrap.servers": options.bootstrap, **options.client}
    has_mechanism = any(k in config for k in ("sasl.mechanism", "sasl.mechanisms"))
    if options.oauth.enabled:
        if not has_mechanism:
            config["sasl.mechanisms"] = "OAUTHBEARER"
        config.setdefault("security.protocol", "SASL_PLAINTEXT")
        config["oauth_cb"] = oauth_callback(options.oauth)
    elif "sasl.username" in config and not has_mechanism:
        config["sasl.mechanisms"] = "PLAIN"
    return config


def consumer(options: KafkaOptions, isolation_level: str | None = None,
             group: str | None = None) -> confluent_kafka.Consumer:
    """An assign-only consumer: no group membership, no commits, errors on bad offsets
    (``group`` names the group whose committed offsets it reads, else a random one)."""
    return confluent_kafka.Consumer({
        **base_config(options),
        "group.id": group or f"edgekafka-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "isolation.level": isolation_level or options.isolation_level,
    })


def admin(options: KafkaOptions) -> AdminClient:
    """An admin client with the same bootstrap and security settings, whose metadata
    requests never create a topic (librdkafka's default for a producer-type client, which
    an admin client is, would)."""
    return AdminClient({**base_config(options), "allow.auto.create.topics": False})


def producer(options: KafkaOptions,
             transactional_id: str | None = None) -> confluent_kafka.Producer:
    """An idempotent producer (acks=all, ordered, no duplicates on retry), transactional
    with ``transactional_id``. Keyed records without a partition go where Java's
    producer (and Spark's Kafka sink) puts them: murmur2 of the key, not librdkafka's
    default CRC32 (``kafka.partitioner`` overrides it)."""
    extra = {} if transactional_id is None else {"transactional.id": transactional_id}
    return confluent_kafka.Producer({
        "linger.ms": 5,
        "partitioner": "murmur2_random",
        **base_config(options),
        "enable.idempotence": True,
        "acks": "all",
        **extra,
    })
