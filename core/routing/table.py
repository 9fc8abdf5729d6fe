"""The binding table: which destinations a record published to a source at a subject reaches.

A binding is ``(source, kind, pattern, destination, arguments)``:

- ``source``: the name a record is published to (an AMQP exchange, a topic).
- ``kind`` (:class:`MatchKind`): how ``pattern`` is compared with a record's subject:

  ========  =====================================================  ============================
  kind      matches when                                           index
  ========  =====================================================  ============================
  exact     subject == pattern (AMQP direct exchange)              dict: pattern -> destinations
  fanout    always; pattern is kept but not compared               one destination set
  topic     AMQP topic pattern, ``*`` / ``#`` (amqp_topic.py)      trie per source
  mqtt      MQTT filter, ``+`` / ``#``, ``$share/g/f`` (mqtt_topic) trie per source
  headers   ``arguments`` against the record headers (headers.py)  checked one by one
  ========  =====================================================  ============================

- ``destination``: any hashable id chosen by the caller (a queue name, a ``(topic, queue)`` tuple,
  an MQTT session id, an exchange for exchange-to-exchange bindings, which the caller follows).
- ``arguments``: optional binding arguments. They are part of the binding's identity, as in
  RabbitMQ (the same key with other arguments is another binding), and are compared only by
  ``headers`` bindings.

A source may hold bindings of several kinds; a route consults each kind present.

Routing: :meth:`BindingTable.route` returns the set of destinations (deduplicated: a destination
bound by several matching bindings appears once). MQTT shared subscriptions are not in that set,
because each shared group must receive one copy, delivered to one member the caller picks:
:meth:`BindingTable.route_with_shared` also returns ``{SharedSubscription(group, filter): set of
members}`` for every matching ``$share`` group. A session subscribed both plainly and through a
group appears in both results; the MQTT spec lets the caller deliver twice.

Subjects are not validated on the publish path; the gateway validates the MQTT topic name
(:func:`~core.routing.mqtt_topic.validate_topic_name`) first. Bindings are validated by
:meth:`BindingTable.add`, which raises a :class:`~core.routing.errors.RoutingError` before
changing anything.

Persistence: :meth:`BindingTable.snapshot` gives a JSON-able list of bindings (tuples in
destinations become lists), :meth:`BindingTable.from_snapshot` rebuilds a table from it (lists in
destinations become tuples again). Binding arguments must be JSON-able for that.

Not thread-safe: use from one thread (the broker's event loop) or under one lock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from core.routing.amqp_topic import ANY_WORDS, ONE_WORD, WORD_SEPARATOR
from core.routing.headers import HeadersMatcher
from core.routing.mqtt_topic import (
    LEVEL_SEPARATOR,
    MULTI_LEVEL,
    ONE_LEVEL,
    SharedSubscription,
    parse_shared_subscription,
    validate_topic_filter,
)
from core.routing.trie import WildcardTrie

D = TypeVar("D", bound=Hashable)

SNAPSHOT_FIELDS = ("source", "kind", "pattern", "destination", "arguments")


class MatchKind(StrEnum):
    """How a binding's pattern is compared with a record's subject (see the module docstring)."""

    EXACT = "exact"
    FANOUT = "fanout"
    TOPIC = "topic"
    MQTT = "mqtt"
    HEADERS = "headers"


@dataclass(frozen=True, slots=True)
class Binding(Generic[D]):
    """One binding. ``arguments`` is a read-only mapping or ``None`` (never empty)."""

    source: str
    kind: MatchKind
    pattern: str
    destination: D
    arguments: Mapping[str, Any] | None = field(default=None, hash=False)


class Routed(NamedTuple, Generic[D]):
    """The result of :meth:`BindingTable.route_with_shared`."""

    destinations: set[D]
    shared: dict[SharedSubscription, set[D]]


class _SourceIndex(Generic[D]):
    """Every binding of one source, indexed by kind for routing."""

    __slots__ = ("bindings", "exact", "fanout", "headers", "mqtt", "topic")

    def __init__(self) -> None:
        self.bindings: dict[Binding[D], None] = {}  # insertion-ordered set
        self.exact: dict[str, dict[D, int]] = {}  # pattern -> destination -> binding count
        self.fanout: dict[D, int] = {}  # destination -> binding count
        self.topic: WildcardTrie[D, SharedSubscription] | None = None
        self.mqtt: WildcardTrie[D, SharedSubscription] | None = None
        self.headers: dict[Binding[D], HeadersMatcher] = {}


class BindingTable(Generic[D]):
    """All bindings of a broker, routed per source; see the module docstring."""

    __slots__ = ("_bindings", "_by_destination", "_sources")

    def __init__(self) -> None:
        self._bindings: dict[Binding[D], None] = {}  # every binding, in insertion order
        self._sources: dict[str, _SourceIndex[D]] = {}
        self._by_destination: dict[D, dict[Binding[D], None]] = {}

    # -- changing bindings -------------------------------------------------------------------

    def add(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: D,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add a binding; ``False`` if an equal one exists already (nothing changes then).

        Raises ``InvalidTopicFilter`` / ``InvalidSharedSubscription`` for a bad MQTT filter,
        ``InvalidBindingArguments`` for bad headers arguments, ``ValueError`` for an unknown kind.
        """
        binding = self._binding(source, kind, pattern, destination, arguments)
        if binding in self._bindings:
            return False
        matcher = None
        shared = None
        if binding.kind is MatchKind.MQTT:
            shared = parse_shared_subscription(pattern)
            if shared is None:
                validate_topic_filter(pattern)
        elif binding.kind is MatchKind.HEADERS:
            matcher = HeadersMatcher(binding.arguments)
        index = self._sources.get(source)
        if index is None:
            index = self._sources[source] = _SourceIndex()
        kind = binding.kind
        if kind is MatchKind.EXACT:
            _count_up(index.exact.setdefault(pattern, {}), destination)
        elif kind is MatchKind.FANOUT:
            _count_up(index.fanout, destination)
        elif kind is MatchKind.TOPIC:
            if index.topic is None:
                index.topic = WildcardTrie(ONE_WORD, ANY_WORDS)
            index.topic.add(_words(pattern), destination)
        elif kind is MatchKind.MQTT:
            if index.mqtt is None:
                index.mqtt = WildcardTrie(ONE_LEVEL, MULTI_LEVEL, dollar_rule=True)
            if shared is None:
                index.mqtt.add(pattern.split(LEVEL_SEPARATOR), destination)
            else:
                index.mqtt.add(shared.filter.split(LEVEL_SEPARATOR), destination, shared)
        else:
            assert matcher is not None
            index.headers[binding] = matcher
        index.bindings[binding] = None
        self._bindings[binding] = None
        self._by_destination.setdefault(destination, {})[binding] = None
        return True

    def remove(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: D,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Remove the equal binding; ``False`` if there is none."""
        binding = self._binding(source, kind, pattern, destination, arguments)
        if binding not in self._bindings:
            return False
        self._unindex(binding)
        return True

    def remove_destination(self, destination: D) -> int:
        """Remove every binding to ``destination`` (a deleted queue or ended session)."""
        bindings = list(self._by_destination.get(destination, ()))
        for binding in bindings:
            self._unindex(binding)
        return len(bindings)

    def remove_source(self, source: str) -> int:
        """Remove every binding from ``source`` (a deleted exchange or topic)."""
        index = self._sources.get(source)
        bindings = list(index.bindings) if index is not None else []
        for binding in bindings:
            self._unindex(binding)
        return len(bindings)

    def apply_remote(
        self,
        key: str,
        value: bytes | None,
        decode_destination: Callable[[Any], D] | None = None,
    ) -> bool:
        """Make a binding another node stored present or absent, as loading it would: with
        ``value`` (a JSON object with the keys of ``SNAPSHOT_FIELDS``, as :meth:`from_snapshot`
        rows) it is added; with None, the binding ``key`` names (its identity, a JSON list
        ``[source, kind, pattern, destination, arguments]``) is removed. ``decode_destination``
        as for :meth:`from_snapshot`. False when the table had it that way already."""
        decode: Callable[[Any], Any] = decode_destination or _from_json
        if value is not None:
            row = json.loads(value)
            return self.add(
                row["source"],
                row["kind"],
                row["pattern"],
                decode(row["destination"]),
                row.get("arguments"),
            )
        source, kind, pattern, destination, arguments = json.loads(key)
        return self.remove(source, kind, pattern, decode(destination), arguments)

    # -- reading -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._bindings)

    def __contains__(self, binding: object) -> bool:
        return binding in self._bindings

    def bindings(self, source: str | None = None, destination: D | None = None) -> list[Binding[D]]:
        """The bindings, in the order they were added, optionally of one source / destination."""
        if destination is not None:
            selected: Iterable[Binding[D]] = self._by_destination.get(destination, ())
            if source is not None:
                selected = [b for b in selected if b.source == source]
        elif source is not None:
            index = self._sources.get(source)
            selected = index.bindings if index is not None else ()
        else:
            selected = self._bindings
        return list(selected)

    def has_source(self, source: str) -> bool:
        """Whether any binding has ``source`` (cheap: publish paths skip routing otherwise)."""
        return source in self._sources

    def sources(self) -> list[str]:
        """The sources that have at least one binding."""
        return list(self._sources)

    # -- routing (the publish hot path) ------------------------------------------------------

    def route(self, source: str, subject: str, headers: Mapping[str, Any] | None = None) -> set[D]:
        """The destinations a record published to ``source`` with ``subject`` reaches.

        ``headers`` is used by headers bindings only. MQTT shared groups are left out: use
        :meth:`route_with_shared` for sources with ``$share`` subscriptions.
        """
        found: set[D] = set()
        index = self._sources.get(source)
        if index is not None:
            _route(index, subject, headers, found, None)
        return found

    def route_with_shared(
        self, source: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> Routed[D]:
        """Like :meth:`route`, plus the members of each matching MQTT shared group.

        The caller delivers one copy to each of ``destinations`` and, for each entry of
        ``shared``, one copy to a single member of its set (round robin, least loaded, ...).
        """
        found: set[D] = set()
        shared: dict[SharedSubscription, set[D]] = {}
        index = self._sources.get(source)
        if index is not None:
            _route(index, subject, headers, found, shared)
        return Routed(found, shared)

    # -- persistence -------------------------------------------------------------------------

    def snapshot(self) -> list[dict[str, Any]]:
        """Every binding as a JSON-able dict with the keys of ``SNAPSHOT_FIELDS``."""
        return [
            {
                "source": b.source,
                "kind": b.kind.value,
                "pattern": b.pattern,
                "destination": _to_json(b.destination),
                "arguments": _to_json(dict(b.arguments)) if b.arguments is not None else None,
            }
            for b in self._bindings
        ]

    @classmethod
    def from_snapshot(
        cls,
        rows: Iterable[Mapping[str, Any]],
        decode_destination: Callable[[Any], D] | None = None,
    ) -> BindingTable[D]:
        """Rebuild a table from :meth:`snapshot` output (possibly through JSON).

        ``decode_destination`` turns a stored destination back into its id; by default lists
        become tuples (recursively), so ``("orders", 3)`` survives a JSON round trip.
        """
        decode: Callable[[Any], Any] = decode_destination or _from_json
        table: BindingTable[D] = cls()
        for row in rows:
            table.add(
                row["source"],
                row["kind"],
                row["pattern"],
                decode(row["destination"]),
                row.get("arguments"),
            )
        return table

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _binding(
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: D,
        arguments: Mapping[str, Any] | None,
    ) -> Binding[D]:
        frozen = MappingProxyType(dict(arguments)) if arguments else None
        return Binding(source, MatchKind(kind), pattern, destination, frozen)

    def _unindex(self, binding: Binding[D]) -> None:
        index = self._sources[binding.source]
        destination = binding.destination
        kind = binding.kind
        if kind is MatchKind.EXACT:
            if _count_down(index.exact[binding.pattern], destination):
                del index.exact[binding.pattern]
        elif kind is MatchKind.FANOUT:
            _count_down(index.fanout, destination)
        elif kind is MatchKind.TOPIC:
            assert index.topic is not None
            index.topic.remove(_words(binding.pattern), destination)
            if not index.topic:
                index.topic = None
        elif kind is MatchKind.MQTT:
            assert index.mqtt is not None
            shared = parse_shared_subscription(binding.pattern)
            if shared is None:
                index.mqtt.remove(binding.pattern.split(LEVEL_SEPARATOR), destination)
            else:
                index.mqtt.remove(shared.filter.split(LEVEL_SEPARATOR), destination, shared)
            if not index.mqtt:
                index.mqtt = None
        else:
            del index.headers[binding]
        del index.bindings[binding]
        if not index.bindings:
            del self._sources[binding.source]
        del self._bindings[binding]
        by_destination = self._by_destination[destination]
        del by_destination[binding]
        if not by_destination:
            del self._by_destination[destination]


def _route(
    index: _SourceIndex[D],
    subject: str,
    headers: Mapping[str, Any] | None,
    found: set[D],
    shared: dict[SharedSubscription, set[D]] | None,
) -> None:
    if index.exact:
        destinations = index.exact.get(subject)
        if destinations:
            found.update(destinations)
    if index.fanout:
        found.update(index.fanout)
    if index.topic is not None:
        index.topic.collect(subject.split(WORD_SEPARATOR) if subject else [], found)
    if index.mqtt is not None:
        index.mqtt.collect(subject.split(LEVEL_SEPARATOR), found, shared)
    if index.headers:
        for binding, matcher in index.headers.items():
            if matcher.matches(headers):
                found.add(binding.destination)


def _words(pattern: str) -> list[str]:
    return pattern.split(WORD_SEPARATOR) if pattern else []


def _count_up(counts: dict[D, int], destination: D) -> None:
    counts[destination] = counts.get(destination, 0) + 1


def _count_down(counts: dict[D, int], destination: D) -> bool:
    """Decrement; ``True`` if ``counts`` became empty."""
    count = counts[destination]
    if count > 1:
        counts[destination] = count - 1
    else:
        del counts[destination]
    return not counts


def _to_json(value: Any) -> Any:
    """Tuples become lists, recursively, so the snapshot is plain JSON data."""
    if isinstance(value, tuple | list):
        return [_to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    return value


def _from_json(value: Any) -> Any:
    """Lists become tuples, recursively: the default destination decoder."""
    if isinstance(value, list):
        return tuple(_from_json(item) for item in value)
    return value
