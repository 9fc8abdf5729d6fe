"""MQTT topic names and filters <-> log addresses and bindings (docs/mqtt.md, "Addresses").

An MQTT topic name ``L1/L2/.../Ln`` is stored as:

- log topic: the first level ``L1`` (an empty first level, as in ``/a/b``, is the topic ``/``,
  a name no MQTT level can spell, since ``/`` separates levels);
- subject: the other levels in AMQP routing-key form, joined by ``.``, with a ``.`` inside a
  level written ``/`` (RabbitMQ's MQTT plugin swaps the two the same way), so MQTT ``T/a/b`` is
  topic ``T``, subject ``a.b``, and an AMQP binding ``a.*`` on exchange ``T`` matches it;
- address: the MQTT topic name itself, so an MQTT subscriber gets back exactly what was
  published (``T`` and ``T/`` both have the subject ``""``; the address tells them apart).

A record published by another protocol has no MQTT address; its MQTT topic name is built the
other way round from (topic, subject), or (topic, key) for a Kafka record without a subject.

A subscription becomes core bindings (:func:`binding_plan`):

- a filter with a literal first level binds on that topic with an AMQP ``topic`` pattern (``+``
  becomes ``*``, ``#`` stays ``#``), so records of every protocol published to that topic reach
  it through the core's routing;
- a filter whose first level is a wildcard (``#``, ``+/x``) binds on :data:`GLOBAL_SOURCE` with
  the MQTT filter itself (kind ``mqtt``, which applies the ``$``-rule [MQTT-4.7.2-1]); the gateway
  routes every MQTT publish through it by its full topic name (``extra_destinations``);
- ``T/+`` and ``T/+/#`` also match ``T/`` (one empty level), which a subject cannot tell from
  ``T``; they are bound on :data:`GLOBAL_SOURCE` as well. Deliveries are matched again against the
  session's own filters (:func:`filter_matches`), so a binding that matches too much (``T`` also
  matches ``T/``; a literal ``*`` level) never delivers what the filter does not match.

Pure functions and small bounded caches: no I/O, one thread.
"""

from __future__ import annotations

import hashlib
from typing import Final, NamedTuple

from core.api import (
    EMPTY_LEVEL_TOPIC,
    LEVEL_SEPARATOR,
    MULTI_LEVEL,
    ONE_LEVEL,
    filter_levels_match,
    mqtt_name_of,
    routing_key_of,
)

# Binding source of the filters with a wildcard first level. Names starting with "__" are the
# broker's (core/log/names.py), so no client can publish to it.
GLOBAL_SOURCE: Final = "__mqtt"
# A topic name of the log: at most 255 bytes (MAX_TOPIC_NAME_BYTES of the topic registry), no
# control characters, not starting with "__" (reserved for the broker's system topics).
MAX_LOG_TOPIC_BYTES: Final = 255
RESERVED_TOPIC_PREFIX: Final = "__"
# EMQX's delayed publish: "$delayed/{DelayInterval}/{TopicName}", at most 4294967 seconds.
DELAYED_PREFIX: Final = "$delayed/"
# ``$half/<producer group>/<transaction id>/<topic>``: a transactional half message from a
# client without user properties (MQTT 3.1.1), the x-braid-txn-id convention of docs/mapping.md.
HALF_PREFIX: Final = "$half/"
MAX_DELAY_S: Final = 4_294_967
SHARE_PREFIX: Final = "$share/"
# Ack queues of persistent sessions and of shared-subscription groups (system topics: hidden from
# Kafka's topic listing). A name is hashed when its directory name would be too long.
SESSION_QUEUE_PREFIX: Final = "__mqtt.session."
GROUP_QUEUE_PREFIX: Final = "__mqtt.share."
MAX_QUEUE_NAME_CHARS: Final = 120

# Log addresses of recent topic names (a device publishes to a handful): bounded, cleared when full.
ADDRESS_CACHE_SIZE: Final = 4096


class LogAddress(NamedTuple):
    topic: str
    subject: str


class BindingSpec(NamedTuple):
    source: str
    kind: str  # core.routing.table.MatchKind value: "topic" or "mqtt"
    pattern: str


class DelayedTopic(NamedTuple):
    delay_s: int
    topic: str


_addresses: dict[str, LogAddress | None] = {}


def log_topic_ok(name: str) -> bool:
    """Whether a first level can be a log topic name (see the module docstring)."""
    if name.startswith(RESERVED_TOPIC_PREFIX):
        return False
    if len(name) > MAX_LOG_TOPIC_BYTES or len(name.encode()) > MAX_LOG_TOPIC_BYTES:
        return False
    return not any(ord(char) < 0x20 for char in name)


def to_log_address(mqtt_topic: str) -> LogAddress | None:
    """(log topic, subject) of an MQTT topic name; None if its first level cannot be a log topic."""
    cached = _addresses.get(mqtt_topic, False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    first, _, rest = mqtt_topic.partition(LEVEL_SEPARATOR)
    topic = first or EMPTY_LEVEL_TOPIC
    address: LogAddress | None = None
    if first == "" or log_topic_ok(first):
        address = LogAddress(topic, routing_key_of(rest))
    if len(_addresses) >= ADDRESS_CACHE_SIZE:
        _addresses.clear()
    _addresses[mqtt_topic] = address
    return address


def mqtt_topic_of(topic: str, subject: str, key: bytes | None = None) -> str:
    """The MQTT topic name of a record without an MQTT address (published by AMQP or Kafka)."""
    first = "" if topic == EMPTY_LEVEL_TOPIC else topic
    if not subject and key:
        subject = key.decode("utf-8", "replace")  # a Kafka record's key as its routing key
    if not subject:
        return first
    rest = mqtt_name_of(subject)
    # '+', '#' and U+0000 cannot appear in a topic name [MQTT-4.7.0-1].
    if "+" in rest or "#" in rest or "\x00" in rest:
        rest = rest.replace("+", "_").replace("#", "_").replace("\x00", "_")
    return first + LEVEL_SEPARATOR + rest


def binding_plan(topic_filter: str) -> list[BindingSpec] | None:
    """The core bindings of a (non-shared, valid) filter; None if its first level is a literal
    that cannot be a log topic (then nothing can ever be published there)."""
    levels = topic_filter.split(LEVEL_SEPARATOR)
    first = levels[0]
    if first in (ONE_LEVEL, MULTI_LEVEL):
        return [BindingSpec(GLOBAL_SOURCE, "mqtt", topic_filter)]
    if first and not log_topic_ok(first):
        return None
    rest = levels[1:]
    words = [
        "*" if level == ONE_LEVEL else level if level == MULTI_LEVEL else level.replace(".", "/")
        for level in rest
    ]
    plan = [BindingSpec(first or EMPTY_LEVEL_TOPIC, "topic", ".".join(words))]
    if rest in ([ONE_LEVEL], [ONE_LEVEL, MULTI_LEVEL]):
        plan.append(BindingSpec(GLOBAL_SOURCE, "mqtt", topic_filter))
    return plan


# Whether a valid filter (split into levels) matches a topic name, with the ``$``-rule
# [MQTT-4.7.2-1]; '#' also matches the parent level [MQTT-4.7.1-2].
filter_matches = filter_levels_match


def parse_delayed(topic: str) -> DelayedTopic | None:
    """``$delayed/<seconds>/<topic>`` -> (seconds, topic); None if malformed."""
    seconds, slash, target = topic[len(DELAYED_PREFIX) :].partition(LEVEL_SEPARATOR)
    if not slash or not target or not seconds.isascii() or not seconds.isdigit():
        return None
    delay = int(seconds)
    if delay > MAX_DELAY_S:
        return None
    return DelayedTopic(delay, target)


class HalfTopic(NamedTuple):
    producer_group: str
    txn_id: str
    topic: str


def parse_half(topic: str) -> HalfTopic | None:
    """``$half/<producer group>/<transaction id>/<topic>`` -> its parts; None if malformed."""
    group, slash, rest = topic[len(HALF_PREFIX) :].partition(LEVEL_SEPARATOR)
    txn_id, slash_too, target = rest.partition(LEVEL_SEPARATOR)
    if not (slash and slash_too and group and txn_id and target) or target[:1] == "$":
        return None
    return HalfTopic(group, txn_id, target)


def _queue_name(prefix: str, name: str) -> str:
    if len(name) <= MAX_QUEUE_NAME_CHARS and name.isascii():
        return prefix + name
    return prefix + "#" + hashlib.sha256(name.encode()).hexdigest()[:40]


def session_queue_name(client_id: str) -> str:
    """The ack-queue topic of a persistent session."""
    return _queue_name(SESSION_QUEUE_PREFIX, client_id)


def group_queue_name(group: str, topic_filter: str) -> str:
    """The ack-queue topic of a shared-subscription group (one per ShareName and filter)."""
    return _queue_name(GROUP_QUEUE_PREFIX, group + LEVEL_SEPARATOR + topic_filter)
