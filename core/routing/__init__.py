"""Routing: bindings from sources to destinations, and the matchers that decide them.

Pure and protocol-neutral: no I/O, no asyncio, nothing from ``core.log``. Modules:

- ``amqp_topic``: AMQP routing keys, direct and topic-pattern matching (``*``, ``#``).
- ``mqtt_topic``: MQTT topic names and filters (``+``, ``#``, ``$`` topics, ``$share``).
- ``headers``: AMQP headers-exchange matching (``x-match`` all / any / ...-with-x).
- ``trie``: the wildcard trie behind topic and MQTT bindings.
- ``table``: :class:`BindingTable`, add / remove / list / route / snapshot.
- ``errors``: the ``ValueError`` subclasses raised for refused names and bindings.
- ``benchmark``: ``bench_route(n_bindings, kind)``.
"""

from core.routing.amqp_topic import direct_matches, split_routing_key, topic_matches
from core.routing.errors import (
    InvalidBindingArguments,
    InvalidSharedSubscription,
    InvalidTopicFilter,
    InvalidTopicName,
    RoutingError,
)
from core.routing.headers import HeadersMatcher, XMatch, headers_match
from core.routing.mqtt_topic import (
    SharedSubscription,
    mqtt_matches,
    parse_shared_subscription,
    split_topic,
    validate_topic_filter,
    validate_topic_name,
)
from core.routing.table import Binding, BindingTable, MatchKind, Routed
from core.routing.trie import WildcardTrie

__all__ = [
    "Binding",
    "BindingTable",
    "HeadersMatcher",
    "InvalidBindingArguments",
    "InvalidSharedSubscription",
    "InvalidTopicFilter",
    "InvalidTopicName",
    "MatchKind",
    "Routed",
    "RoutingError",
    "SharedSubscription",
    "WildcardTrie",
    "XMatch",
    "direct_matches",
    "headers_match",
    "mqtt_matches",
    "parse_shared_subscription",
    "split_routing_key",
    "split_topic",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]
