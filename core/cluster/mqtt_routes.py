"""The cluster's route table of clean-session MQTT subscriptions (docs/cluster.md section 8).

A clean session's subscription holds no queue: a publish reaches it live, on whatever node the
client is connected to. So every node must know which nodes have live subscribers of which
filters (EMQX's route table). Keys, under the cluster's ``braid:<cluster_id>:`` prefix
(core/cluster/redis_metadata.py):

  ``mqtt:routes:<node>``  set: the filters with at least one live subscriber on that node;
                          written only by that node
  ``mqtt:routes``         pub/sub channel: ``<node> + <filter>``, ``<node> - <filter>`` after
                          each change, ``<node> =`` when the node rewrote its whole set

One :class:`RouteTable` per node. :meth:`RouteTable.subscribe` counts the node's local
subscribers of a filter and adds the filter to the node's set on the first,
:meth:`RouteTable.unsubscribe` removes it on the last. Every node keeps a trie of filter ->
nodes (core/routing/trie.py, the one the live router matches with), so
:meth:`RouteTable.nodes_for` costs no Redis round trip on the publish path.

Why a channel and not keyspace notifications: a notification says only "sadd on key", so each
change would cost every node an ``SMEMBERS`` of the whole set, and it needs
``notify-keyspace-events`` set on the server, which managed and Sentinel-run Redis deployments
may not allow. The channel carries the change itself, published by the same script that makes
it, so no change is made without its message. A pub/sub subscriber loses messages only while it
is disconnected, and redis-py resubscribes silently; the table notices each reconnect and then
reloads every node's set (after subscribing again, so nothing published meanwhile is missed:
the changes that follow are applied over the snapshot, and each is idempotent). On each
(re)connect the node also rewrites its own set from its local counts (one script, ``<node> =``
for the others), so a Sentinel failover that lost a recent ``SADD``/``SREM`` is repaired. At
start, that rewrite also drops what a previous process of this node left behind (its clean
sessions died with it).

Routes of a node that died stay until it restarts (removing a dead node's routes is issue 23's
takeover, section 12); sending to it fails and is counted by the fan-out
(core/cluster/rpc/fanout.py).

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any, Final

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.connection import AbstractConnection

from core.cluster.redis_metadata import _Keys
from core.routing.live import EMPTY_LEVEL_TOPIC
from core.routing.mqtt_topic import (
    LEVEL_SEPARATOR,
    MULTI_LEVEL,
    ONE_LEVEL,
    SHARE_PREFIX,
    validate_topic_filter,
)
from core.routing.trie import WildcardTrie

log = logging.getLogger(__name__)

# Topic names whose matching nodes are kept (bounded: topic names come from clients), as the
# live router's match cache (core/routing/live.py); any change of the table clears it.
NODES_MATCH_CACHE_SIZE: Final = 8192
RECONNECT_DELAY_S: Final = (0.05, 1.0)  # the watcher's first and longest retry delay
# How long one wait for a message lasts: redis-py reconnects inside that wait, so this bounds
# how long a reconnect goes unnoticed (and the reload after it waits).
RECONNECT_CHECK_S: Final = 0.25
SCAN_COUNT: Final = 1000  # keys per SCAN step while reloading
ADDED: Final = "+"
REMOVED: Final = "-"
REWRITTEN: Final = "="
_CONNECTION_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)

# KEYS[1] mqtt:routes:<node>; ARGV[1] the channel, ARGV[2] the node, ARGV[3] the filter,
# ARGV[4] "1": the node has subscribers of it, "0": none. Sets the membership to what the node
# has now (not "add one"), so writes that overtake each other still end in the last state;
# publishes only a real change. Returns 1 if something changed.
SET_ROUTE: Final = """
local changed
if ARGV[4] == '1' then
  changed = redis.call('SADD', KEYS[1], ARGV[3])
  if changed == 1 then redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' + ' .. ARGV[3]) end
else
  changed = redis.call('SREM', KEYS[1], ARGV[3])
  if changed == 1 then redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' - ' .. ARGV[3]) end
end
return changed
"""

# KEYS[1] mqtt:routes:<node>; ARGV[1] the channel, ARGV[2] the node, ARGV[3..] every filter
# the node has subscribers of. Replaces the set and tells the others to read it again.
REWRITE_ROUTES: Final = """
redis.call('DEL', KEYS[1])
for i = 3, #ARGV, 1000 do
  redis.call('SADD', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' =')
return #ARGV - 2
"""


class RouteTable:
    """This node's view of the cluster's clean-session routes, and its own part of them.

    ``redis`` is a client the caller owns (closed by it); ``node`` this node's id. Call
    :meth:`start` before anything else, :meth:`aclose` at the end."""

    def __init__(self, redis: Redis, cluster_id: str, node: int) -> None:
        self.node = node
        self._redis = redis
        prefix = _Keys(cluster_id).prefix  # the cluster's key scheme: one place spells it
        self._set_prefix = prefix + "mqtt:routes:"
        self._own_key = self._set_prefix + str(node)
        self._channel = prefix + "mqtt:routes"
        self._set_route = redis.register_script(SET_ROUTE)
        self._rewrite = redis.register_script(REWRITE_ROUTES)
        self._local: dict[str, int] = {}  # filter -> this node's subscribers of it
        self._routes: dict[int, set[str]] = {}  # node -> its filters, as last read
        self._trie: WildcardTrie[int, str] = WildcardTrie(ONE_LEVEL, MULTI_LEVEL, dollar_rule=True)
        self._cache: dict[str, frozenset[int]] = {}
        # First level of a filter (None: a wildcard) -> node -> its filters there: which log
        # topics other nodes may want records of (:meth:`others_want`).
        self._first_levels: dict[str | None, dict[int, int]] = {}
        self._reconnected = False
        self._ready: asyncio.Event = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self.reloads = 0  # full reloads done (at start, and after each reconnect)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to the channel, rewrite this node's set (dropping what a previous
        process left) and load every node's; returns once the table is loaded (it retries
        while Redis cannot be reached: bound it with ``asyncio.timeout``)."""
        if self._watcher is not None:
            raise RuntimeError("the route table is already started")
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(), name=f"braid-mqtt-routes-{self.node}"
        )
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait([ready, self._watcher], return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            self._watcher.result()  # it ended: its error
            raise RuntimeError("the route table's watcher ended before loading")

    async def aclose(self) -> None:
        """Stop watching. This node's routes stay in Redis: a clean stop's connections
        unsubscribe first, and a restart rewrites the set at start."""
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            return
        # Cancel until it ends: on Python 3.11 asyncio.wait_for (redis-py's socket reads with
        # a timeout) can drop a cancellation (gh-86296), as RedisMetadata.aclose does.
        while not watcher.done():
            watcher.cancel()
            await asyncio.wait([watcher], timeout=0.1)
        if not watcher.cancelled():
            with contextlib.suppress(Exception):
                watcher.result()

    # -- this node's subscriptions ---------------------------------------------------------

    async def subscribe(self, topic_filter: str) -> None:
        """Count one more local subscriber of ``topic_filter`` (a valid, non-shared filter:
        ``$share`` groups are bindings, not routes); the first one adds the route in Redis,
        done when this returns."""
        if topic_filter.startswith(SHARE_PREFIX):
            raise ValueError(f"{topic_filter!r} is a shared subscription, not a route")
        validate_topic_filter(topic_filter)
        count = self._local.get(topic_filter, 0)
        self._local[topic_filter] = count + 1
        if count == 0:
            self._learn(self.node, topic_filter)
            await self._write(topic_filter)

    async def unsubscribe(self, topic_filter: str) -> bool:
        """Undo one :meth:`subscribe`; the last one removes the route. False if there was
        no local subscriber of ``topic_filter``."""
        count = self._local.get(topic_filter, 0)
        if count == 0:
            return False
        if count > 1:
            self._local[topic_filter] = count - 1
            return True
        del self._local[topic_filter]
        self._forget(self.node, topic_filter)
        await self._write(topic_filter)
        return True

    def local_filters(self) -> dict[str, int]:
        """Filter -> this node's subscribers of it (a copy)."""
        return dict(self._local)

    async def _write(self, topic_filter: str) -> None:
        # The membership this node has *now*, whatever the order the writes reach Redis in.
        present = "1" if topic_filter in self._local else "0"
        await self._set_route(
            keys=[self._own_key], args=[self._channel, self.node, topic_filter, present]
        )

    # -- the cluster's routes --------------------------------------------------------------

    def nodes_for(self, topic: str) -> set[int]:
        """The nodes (this one included) with a live subscriber whose filter matches the topic
        name ``topic``."""
        cached = self._cache.get(topic)
        if cached is None:
            found: set[int] = set()
            self._trie.collect(topic.split(LEVEL_SEPARATOR), found)
            if len(self._cache) >= NODES_MATCH_CACHE_SIZE:
                self._cache.clear()
            cached = self._cache[topic] = frozenset(found)
        return set(cached)

    def others_want(self, log_topic: str) -> bool:
        """Whether another node has a route a record of ``log_topic`` may match (a filter whose
        first level is that topic, or a wildcard): the owner of a record's shard fans out
        records of other protocols to those nodes."""
        for first in (log_topic, None):
            nodes = self._first_levels.get(first)
            if nodes and (len(nodes) > 1 or self.node not in nodes):
                return True
        return False

    def _count_first_level(self, node: int, topic_filter: str, step: int) -> None:
        first: str | None = topic_filter.split(LEVEL_SEPARATOR, 1)[0]
        if first in (ONE_LEVEL, MULTI_LEVEL):
            first = None
        elif not first:
            first = EMPTY_LEVEL_TOPIC
        nodes = self._first_levels.setdefault(first, {})
        count = nodes.get(node, 0) + step
        if count > 0:
            nodes[node] = count
        else:
            nodes.pop(node, None)
            if not nodes:
                del self._first_levels[first]

    def routes(self) -> dict[int, set[str]]:
        """Node -> its filters, as this node knows them (a copy)."""
        return {node: set(filters) for node, filters in self._routes.items() if filters}

    def _learn(self, node: int, topic_filter: str) -> None:
        filters = self._routes.setdefault(node, set())
        if topic_filter not in filters:
            filters.add(topic_filter)
            self._trie.add(topic_filter.split(LEVEL_SEPARATOR), node)
            self._count_first_level(node, topic_filter, 1)
            self._cache.clear()

    def _forget(self, node: int, topic_filter: str) -> None:
        filters = self._routes.get(node)
        if filters is not None and topic_filter in filters:
            filters.discard(topic_filter)
            self._trie.remove(topic_filter.split(LEVEL_SEPARATOR), node)
            self._count_first_level(node, topic_filter, -1)
            self._cache.clear()

    def _replace(self, node: int, filters: Iterable[str]) -> None:
        wanted = set(filters)
        for gone in self._routes.get(node, set()) - wanted:
            self._forget(node, gone)
        for topic_filter in wanted:
            self._learn(node, topic_filter)

    # -- keeping current -------------------------------------------------------------------

    async def _watch(self) -> None:
        """Subscribe, rewrite this node's set, reload all; then apply each change as it is
        published, and reload after each reconnect. Reconnects after any error."""
        delay = RECONNECT_DELAY_S[0]
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    self._watch_reconnects(pubsub)
                    await self._resync()
                    self._ready.set()
                    delay = RECONNECT_DELAY_S[0]
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=RECONNECT_CHECK_S
                        )
                        if self._reconnected:
                            await self._resync()
                        if message is not None:
                            await self._apply(message["data"])
            except asyncio.CancelledError:
                raise
            except _CONNECTION_ERRORS as exc:
                log.info("mqtt route watcher: %s; reconnecting in %.2f s", exc, delay)
            except Exception:
                log.exception("mqtt route watcher failed; restarting in %.2f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_S[1])

    def _watch_reconnects(self, pubsub: PubSub) -> None:
        connection = pubsub.connection
        if connection is not None:  # connected by subscribe(); later connects call back
            connection.register_connect_callback(self._on_reconnect)

    def _on_reconnect(self, connection: AbstractConnection) -> None:
        # redis-py reconnected and resubscribed inside a read: what was published while it
        # was away is lost, so the watcher reloads after that read.
        self._reconnected = True

    async def _resync(self) -> None:
        """Rewrite this node's set from its local counts, then read every node's set."""
        self._reconnected = False
        await self._rewrite(
            keys=[self._own_key], args=[self._channel, self.node, *sorted(self._local)]
        )
        sets: dict[int, set[str]] = {}
        keys = [key async for key in self._redis.scan_iter(match=self._set_prefix + "*")]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.smembers(key)
            members = await pipe.execute()
        for key, filters in zip(keys, members, strict=True):
            node = _node_of(_text(key)[len(self._set_prefix) :])
            if node is not None and node != self.node:
                sets[node] = {_text(f) for f in filters}
        for node in list(self._routes):
            if node != self.node and node not in sets:
                self._replace(node, ())
        for node, filters in sets.items():
            self._replace(node, filters)
        self._replace(self.node, self._local)
        self.reloads += 1

    async def _apply(self, data: Any) -> None:
        text = _text(data)
        node_text, _, rest = text.partition(" ")
        node = _node_of(node_text)
        if node is None or node == self.node:
            return  # this node's own routes are its local counts
        op, _, topic_filter = rest.partition(" ")
        if op == ADDED:
            self._learn(node, topic_filter)
        elif op == REMOVED:
            self._forget(node, topic_filter)
        elif op == REWRITTEN:
            filters = await self._redis.smembers(self._set_prefix + node_text)
            self._replace(node, (_text(f) for f in filters))
        else:
            log.warning("mqtt routes: unknown change %r", text)


def _node_of(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
