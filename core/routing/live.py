"""The live router: subscriptions that hold no queue, matched against full topic names.

A *live* subscription is one whose messages are handed to its subscriber straight from the
publish path (or, for records stored by someone else, from the log's index notifications, see
``core/delivery/live.py``) and never indexed into a queue: an MQTT clean session's plain
subscriptions today, any protocol's queue-less consumer tomorrow. It costs the log nothing
beyond the record itself.

Filters are MQTT filters (``+`` one level, ``#`` the rest, the ``$``-rule [MQTT-4.7.2-1]) over
topic names of ``/``-separated levels; a topic name's first level is its log topic (an empty
first level, as in ``/a/b``, is the log topic ``/``: ``gateway/mqtt/addresses.py``), which lets
the index notifications skip every topic no live subscription can match (:meth:`wants`).

Subscribers are opaque hashable objects of the caller (an MQTT gateway's subscription); the
router keeps them by identity of (filter, subscriber) and hands them back from :meth:`match`.

The matches of recent topic names are cached: devices publish to the same topics over and
over, while subscriptions change far less often than messages arrive, and any change clears
the cache. Pure: no I/O; not thread-safe (the event loop's thread).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, TypeVar

from core.routing.mqtt_topic import LEVEL_SEPARATOR, MULTI_LEVEL, ONE_LEVEL
from core.routing.trie import WildcardTrie

S = TypeVar("S", bound=Hashable)

# Topic names whose matches are kept (bounded: topic names come from clients).
LIVE_MATCH_CACHE_SIZE: Final = 8192
# The log topic of topic names with an empty first level ("/a/b"): a name no level can spell.
EMPTY_LEVEL_TOPIC: Final = "/"


class LiveRouter(Generic[S]):
    """MQTT filters -> subscribers, matched by full topic name (see the module docstring)."""

    __slots__ = ("_cache", "_first_levels", "_trie", "_wildcards", "count")

    def __init__(self) -> None:
        self._trie: WildcardTrie[S, str] = WildcardTrie(ONE_LEVEL, MULTI_LEVEL, dollar_rule=True)
        self.count = 0  # live subscriptions
        self._first_levels: dict[str, int] = {}  # log topic -> subscriptions bound to it
        self._wildcards = 0  # subscriptions whose first level is a wildcard
        self._cache: dict[str, tuple[S, ...]] = {}

    def add(self, topic_filter: str, subscriber: S) -> None:
        """Subscribe ``subscriber`` with a valid (non-shared) filter."""
        levels = topic_filter.split(LEVEL_SEPARATOR)
        self._cache.clear()
        self._trie.add(levels, subscriber)
        self.count += 1
        first = levels[0]
        if first in (ONE_LEVEL, MULTI_LEVEL):
            self._wildcards += 1
        else:
            topic = first or EMPTY_LEVEL_TOPIC
            self._first_levels[topic] = self._first_levels.get(topic, 0) + 1

    def remove(self, topic_filter: str, subscriber: S) -> bool:
        """Undo one :meth:`add`; False if there was none."""
        levels = topic_filter.split(LEVEL_SEPARATOR)
        self._cache.clear()
        if not self._trie.remove(levels, subscriber):
            return False
        self.count -= 1
        first = levels[0]
        if first in (ONE_LEVEL, MULTI_LEVEL):
            self._wildcards -= 1
        else:
            topic = first or EMPTY_LEVEL_TOPIC
            left = self._first_levels[topic] - 1
            if left:
                self._first_levels[topic] = left
            else:
                del self._first_levels[topic]
        return True

    def wants(self, log_topic: str) -> bool:
        """Whether a record of ``log_topic`` may match a live subscription."""
        return bool(self._wildcards) or log_topic in self._first_levels

    def match(self, topic_name: str) -> tuple[S, ...]:
        """The subscribers whose filter matches ``topic_name`` (each once)."""
        cached = self._cache.get(topic_name)
        if cached is not None:
            return cached
        found: set[S] = set()
        self._trie.collect(topic_name.split(LEVEL_SEPARATOR), found)
        if len(self._cache) >= LIVE_MATCH_CACHE_SIZE:
            self._cache.clear()
        matched = self._cache[topic_name] = tuple(found)
        return matched
