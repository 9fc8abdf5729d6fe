"""MQTT topic names, topic filters and shared subscriptions (MQTT 5.0 section 4.7, 4.8.2).

Rule numbers are MQTT 5.0's; MQTT 3.1.1 has the same rules in section 4.7 under other numbers
(its [MQTT-4.7.1-2] is 5.0's [MQTT-4.7.1-1], and so on), so one implementation serves both.

- A topic is a list of levels separated by ``/``; every ``/`` separates two levels, and a level
  may be empty (``"/"`` is two empty levels, ``"a//b"`` three levels).
- Topic names and filters are at least one character [MQTT-4.7.3-1], contain no U+0000
  [MQTT-4.7.3-2], are well-formed UTF-8 [MQTT-1.5.4-1] and encode to at most 65,535 bytes
  [MQTT-4.7.3-3]. No normalisation is done when matching [MQTT-4.7.3-4].
- A topic name has no wildcard characters [MQTT-4.7.0-1] (PUBLISH: [MQTT-3.3.2-2]).
- In a filter ``+`` matches exactly one level (an empty one too) and occupies a whole level
  [MQTT-4.7.1-2]; ``#`` matches any number of levels, including none: so ``a/#`` matches ``a``
  (the parent) as well as ``a/b/c``; it stands alone or after a ``/`` and is the last character
  [MQTT-4.7.1-1].
- A filter whose first character is a wildcard (``+`` or ``#``) does not match a topic name
  starting with ``$`` [MQTT-4.7.2-1]: ``#`` does not see ``$SYS/broker/load``, ``$SYS/#`` does.
- ``$share/<ShareName>/<filter>`` is a shared subscription [MQTT-4.8.2-1]: the ShareName is at
  least one character, contains no ``/``, ``+`` or ``#``, and is followed by ``/`` and a
  filter [MQTT-4.8.2-2]. Each message matching ``<filter>`` goes to one member of the group.
  MQTT 3.1.1 has no shared subscriptions; we parse the prefix for both versions, as Mosquitto
  and EMQX do.

The PUBLISH topic is validated by the gateway (:func:`validate_topic_name`) before routing; an
MQTT 5 topic alias is resolved before that. Pure functions, no state: thread-safe.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from core.routing.errors import InvalidSharedSubscription, InvalidTopicFilter, InvalidTopicName

LEVEL_SEPARATOR = "/"
ONE_LEVEL = "+"
MULTI_LEVEL = "#"
SYSTEM_PREFIX = "$"  # topics starting with '$' are hidden from leading wildcards [MQTT-4.7.2-1]
SHARE_PREFIX = "$share/"

# UTF-8 Encoded Strings carry a two-byte length prefix [MQTT-1.5.4], hence 65,535 bytes.
MAX_TOPIC_BYTES = 0xFFFF
_NUL = "\x00"


class SharedSubscription(NamedTuple):
    """A parsed ``$share/<group>/<filter>``: one group of subscribers sharing one filter."""

    group: str
    filter: str


def split_topic(topic: str) -> list[str]:
    """Split a topic name or filter into levels (``"a//b"`` is ``["a", "", "b"]``)."""
    return topic.split(LEVEL_SEPARATOR)


def validate_topic_name(topic: str) -> None:
    """Check a PUBLISH topic name; raise :class:`InvalidTopicName` saying what is wrong."""
    _check_string(topic, InvalidTopicName, "topic name")
    if ONE_LEVEL in topic or MULTI_LEVEL in topic:
        raise InvalidTopicName(
            topic, "wildcard characters are not allowed in a topic name", "MQTT-4.7.0-1"
        )


def validate_topic_filter(topic_filter: str) -> None:
    """Check a (non-shared) topic filter; raise :class:`InvalidTopicFilter` saying what is wrong.

    A filter starting with ``$share/`` is checked as a plain filter here; call
    :func:`parse_shared_subscription` first to treat it as a shared subscription.
    """
    _check_string(topic_filter, InvalidTopicFilter, "topic filter")
    if ONE_LEVEL not in topic_filter and MULTI_LEVEL not in topic_filter:
        return
    levels = split_topic(topic_filter)
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if level == MULTI_LEVEL:
            if index != last:
                raise InvalidTopicFilter(
                    topic_filter, "'#' must be the last level of a filter", "MQTT-4.7.1-1"
                )
        elif level == ONE_LEVEL:
            continue
        elif MULTI_LEVEL in level:
            raise InvalidTopicFilter(
                topic_filter, "'#' must occupy a whole level of a filter", "MQTT-4.7.1-1"
            )
        elif ONE_LEVEL in level:
            raise InvalidTopicFilter(
                topic_filter, "'+' must occupy a whole level of a filter", "MQTT-4.7.1-2"
            )


def parse_shared_subscription(topic_filter: str) -> SharedSubscription | None:
    """Parse ``$share/<group>/<filter>``; ``None`` if ``topic_filter`` is not a shared one.

    Raises :class:`InvalidSharedSubscription` if the ShareName or the inner filter is malformed.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, slash, inner = topic_filter[len(SHARE_PREFIX) :].partition(LEVEL_SEPARATOR)
    if not group:
        raise InvalidSharedSubscription(
            topic_filter, "the ShareName must be at least one character", "MQTT-4.8.2-1"
        )
    if ONE_LEVEL in group or MULTI_LEVEL in group:
        raise InvalidSharedSubscription(
            topic_filter, "the ShareName must not contain '+' or '#'", "MQTT-4.8.2-2"
        )
    if not slash or not inner:
        raise InvalidSharedSubscription(
            topic_filter, "the ShareName must be followed by '/' and a topic filter", "MQTT-4.8.2-2"
        )
    try:
        validate_topic_filter(topic_filter)  # length, U+0000 and UTF-8 of the whole string
        validate_topic_filter(inner)
    except InvalidTopicFilter as error:
        raise InvalidSharedSubscription(topic_filter, error.reason, error.rule) from error
    return SharedSubscription(group, inner)


def mqtt_matches(topic_filter: str, topic: str) -> bool:
    """Whether a valid filter (plain or ``$share/...``) matches a valid topic name."""
    shared = parse_shared_subscription(topic_filter)
    if shared is not None:
        topic_filter = shared.filter
    return filter_levels_match(split_topic(topic_filter), topic)


def filter_levels_match(filter_levels: list[str], topic: str) -> bool:
    """Whether a valid (non-shared) filter, already split into levels, matches a topic name,
    with the ``$``-rule [MQTT-4.7.2-1]; ``#`` also matches the parent level [MQTT-4.7.1-2].
    The form for a filter matched against many topic names (a session's deliveries, the
    retained messages at SUBSCRIBE)."""
    if topic[:1] == SYSTEM_PREFIX and filter_levels[0] in (ONE_LEVEL, MULTI_LEVEL):
        return False  # [MQTT-4.7.2-1]
    topic_levels = topic.split(LEVEL_SEPARATOR)
    size = len(topic_levels)
    for index, level in enumerate(filter_levels):
        if level == MULTI_LEVEL:
            return True  # matches the parent level and everything below it
        if index == size:
            return False
        if level != ONE_LEVEL and level != topic_levels[index]:
            return False
    return len(filter_levels) == size


def _check_string(
    value: str, error: type[InvalidTopicName] | type[InvalidTopicFilter], what: str
) -> None:
    """The rules shared by topic names and topic filters (MQTT 5.0 section 4.7.3, 1.5.4)."""
    if not value:
        raise error(value, f"a {what} must be at least one character", "MQTT-4.7.3-1")
    if _NUL in value:
        raise error(value, f"a {what} must not contain U+0000", "MQTT-4.7.3-2")
    if value.isascii():
        size = len(value)  # one byte per character
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate (U+D800..U+DFFF)
            raise error(value, f"a {what} must be well-formed UTF-8", "MQTT-1.5.4-1") from None
    if size > MAX_TOPIC_BYTES:
        raise error(
            value, f"a {what} must encode to at most {MAX_TOPIC_BYTES} bytes", "MQTT-4.7.3-3"
        )


# RabbitMQ's MQTT plugin maps MQTT topic names and AMQP routing keys by swapping the two
# separators: topic ``a/b.c`` is routing key ``a.b/c`` and back. Every protocol's mapping goes
# through these two functions (the MQTT gateway's log addresses, the AMQP view of MQTT records,
# the ``amq.topic`` compatibility exchange).
_SWAP_DOT_SLASH: Final = str.maketrans({".": "/", "/": "."})


def routing_key_of(mqtt_name: str) -> str:
    """The AMQP routing key of an MQTT topic name (or filter): ``a/b.c`` -> ``a.b/c``."""
    # str.replace is several times faster than translate; it is enough when there is no '.'.
    return mqtt_name.translate(_SWAP_DOT_SLASH) if "." in mqtt_name else mqtt_name.replace("/", ".")


def mqtt_name_of(routing_key: str) -> str:
    """The MQTT topic name of an AMQP routing key: ``a.b/c`` -> ``a/b.c``."""
    return (
        routing_key.translate(_SWAP_DOT_SLASH)
        if "/" in routing_key
        else routing_key.replace(".", "/")
    )
