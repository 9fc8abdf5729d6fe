"""Live subscriptions, session queues, retained messages and session states: the Broker
API's calls for MQTT's sessions.

On a cluster node (docs/cluster.md section 8) the process that assembles it hands the API an
:class:`~core.broker.remote.MqttCluster` (:meth:`SessionCalls.set_mqtt_cluster`): the first
live subscriber of a filter here writes its route, the last removes it; a publish delivered
live here is also sent, once, to each other node with matching routes (a Fanout), which hands
it to its live subscribers as a record read back; a CONNECT claims its client id cluster-wide
(:meth:`SessionCalls.claim_client_id`), which closes its connection on another node. A single
node has none: these calls cost nothing there."""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
from collections.abc import (
    Awaitable,
    Callable,
    Hashable,
    Iterable,
)
from typing import Any, Protocol

from core.api.base import BrokerCalls, ClientContext, Headers, Publication, PublishOutcome
from core.api.queues import RemoteQueueHandle
from core.broker.broker import (
    Destination,
    PublishResult,
)
from core.broker.eager import Pending, run_eagerly
from core.broker.remote import MqttCluster, RemoteQueues
from core.broker.shards import ShardSet
from core.cluster import placement
from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER
from core.delivery.ackqueue import (
    AckQueueConfig,
    Delivery,
)
from core.delivery.handles import (
    Subscription,
)
from core.delivery.live import LiveFeed, LiveReader
from core.delivery.message import Message
from core.log import record as rec
from core.log.store import encoded_headers, now_ms
from core.log.tags import TagFilter, tags_from_headers
from core.routing.mqtt_topic import MULTI_LEVEL, ONE_LEVEL
from core.state.retained import RetainedMessages


class RemoteSessions(Protocol):
    """Persistent sessions' queues and states in other nodes' shards
    (core/cluster/mqtt_sessions.py). A shard without a live owner, or an owner that does not
    answer, is :class:`~core.errors.ShardUnavailable`."""

    async def declare_queue(self, shard: int, name: str, *, empty: bool) -> bool:
        """:meth:`SessionCalls.declare_session_queue` on ``shard``'s owner."""
        ...

    async def discard_queue(self, shard: int, name: str) -> bool:
        """:meth:`SessionCalls.discard_session_queue` on ``shard``'s owner."""
        ...

    async def load_state(self, shard: int, client_id: str) -> bytes | None:
        """The state saved in ``shard`` (after this node's own writes asked for so far)."""
        ...

    def save_state(self, shard: int, client_id: str, state: bytes | None) -> None:
        """Save (None: delete) in ``shard`` through its owner, in the background, in order."""
        ...

    async def written(self) -> None:
        """Returns once every :meth:`save_state` asked for so far was answered (or failed)."""
        ...


class RemoteRetained(Protocol):
    """Retained messages in other nodes' shards (core/cluster/mqtt_cluster.py), and with them
    persistent sessions' queues and states (``sessions``)."""

    @property
    def sessions(self) -> RemoteSessions: ...

    def put(self, shard: int, topic_name: str, value: bytes | None) -> None:
        """Set (None: clear) in ``shard`` through its owner, in the background, in order."""
        ...

    async def matching(self, topic_filter: str, shards: list[int]) -> list[tuple[str, bytes]]:
        """What ``shards``' owners retain matching ``topic_filter`` (their owners asked in
        parallel; an owner that cannot be reached adds nothing)."""
        ...


def local_retained_matching(shards: ShardSet, topic_filter: str) -> list[tuple[str, bytes]]:
    """The retained messages of the local ``shards`` matching ``topic_filter``, each from its
    topic's slot shard only (a table holding a topic of another slot is not asked for it)."""
    found: list[tuple[str, bytes]] = []
    for shard in shards:
        for topic, value in shard.retained().matching(topic_filter):
            if shards.placements.place(placement.PLACE_RETAINED, topic) == shard.number:
                found.append((topic, value))
    return found


class SessionCalls(BrokerCalls):
    """Live subscriptions, session queues, retained messages, session states."""

    # Live subscriptions (MQTT clean sessions): no queue; one router for every protocol
    # (core/routing/live.py). A subscriber is the caller's own hashable object, handed back by
    # live_subscribers. Records stored by others reach the followers (follow_live_records).

    _live: LiveFeed | None = None
    # A cluster node's MQTT side, and its live subscriptions per filter (routes).
    _mqtt_cluster: MqttCluster | None = None
    _route_counts: dict[str, int] | None = None
    _session_closer: Callable[[str, int, bool], Awaitable[bool]] | None = None

    def _live_feed(self) -> LiveFeed:
        feed = self._live
        if feed is None:
            feed = self._live = self._node.live_feed()
            # Every local shard's index, not only the lowest one's: a record of any protocol
            # indexed in whichever local shard holds its queue reaches live subscribers.
            for shard in self._node.shards:
                feed.add_store(shard.store)
            feed.others_want = _others_want(self._mqtt_cluster)
        return feed

    def subscribe_live(
        self, context: ClientContext, topic_filter: str, subscriber: Hashable
    ) -> None:
        """Add a live subscription: a valid, non-shared MQTT filter over full topic names.
        On a cluster node the first one of a filter writes its route (in the background:
        :meth:`live_routes_written` waits for it)."""
        self._live_feed().router.add(topic_filter, subscriber)
        counts = self._route_counts
        if counts is not None:
            count = counts.get(topic_filter, 0)
            counts[topic_filter] = count + 1
            if count == 0 and self._mqtt_cluster is not None:
                self._mqtt_cluster.add_route(topic_filter)

    def unsubscribe_live(
        self, context: ClientContext, topic_filter: str, subscriber: Hashable
    ) -> bool:
        """Undo one :meth:`subscribe_live`; False if there was none."""
        removed = self._live_feed().router.remove(topic_filter, subscriber)
        counts = self._route_counts
        if removed and counts is not None and topic_filter in counts:
            count = counts[topic_filter] - 1
            if count:
                counts[topic_filter] = count
            else:
                del counts[topic_filter]
                if self._mqtt_cluster is not None:
                    self._mqtt_cluster.remove_route(topic_filter)
        return removed

    async def live_routes_written(self, context: ClientContext) -> None:
        """Returns once the routes of the live subscriptions made so far are in the cluster's
        table (at once on a single node): a SUBACK after it means a publish on any node that
        knows the table reaches the subscriber."""
        cluster = self._mqtt_cluster
        if cluster is not None:
            await cluster.routes_written()

    # -- the cluster's MQTT side (docs/cluster.md section 8) ---------------------------------

    def set_mqtt_cluster(self, cluster: MqttCluster | None) -> None:
        """Make this a cluster node's API (called once, by the process that assembles the
        node, before its MQTT listeners start): routes, fan-out and client id takeover."""
        self._mqtt_cluster = cluster
        if cluster is None:
            self._route_counts = None
            return
        self._route_counts = {}
        cluster.handle(self._deliver_fanout, self._close_taken_session)
        if self._live is not None:
            self._live.others_want = _others_want(cluster)

    def on_session_takeover(
        self,
        context: ClientContext,
        close: Callable[[str, int, bool], Awaitable[bool]] | None,
    ) -> None:
        """The gateway's hook for a client id another connection claimed (:meth:`claim_client_id`
        here or on another node): ``close(client id, gen, elsewhere)`` closes a connection of
        that client id whose gen is below ``gen`` (MQTT 5 DISCONNECT 0x8E) and says whether
        there was one; ``elsewhere``: the new connection is on another node. None: no hook."""
        self._session_closer = close

    async def claim_client_id(self, context: ClientContext) -> int:
        """A CONNECT of ``context.client_id``: on a cluster node, register it here and have
        its connection on any other node closed; returns the connection's gen (0 on a single
        node, where the gateway's own session table decides). Raises
        :class:`~core.errors.ShardUnavailable` when the node holding it lives but did not
        give it up: CONNACK 0x88 / 3.1.1 return code 3, the client retries."""
        cluster = self._mqtt_cluster
        if cluster is None:
            return 0
        return await cluster.connect(context.client_id)

    async def client_id_held_elsewhere(self, context: ClientContext, client_id: str) -> bool:
        """On a cluster node, whether the session registry names another node for
        ``client_id`` (its session is connected there, or lives there offline: a copy here is
        stale); False on a node alone."""
        cluster = self._mqtt_cluster
        registry = getattr(cluster, "registry", None)
        owner = getattr(registry, "owner", None)
        if cluster is None or not callable(owner):
            return False
        held = await owner(client_id)
        return held is not None and int(held.node) != cluster.node

    def release_client_id(self, context: ClientContext, gen: int) -> None:
        """The connection ``gen`` (from :meth:`claim_client_id`) of ``context.client_id``
        ended; nothing on a single node (gen 0)."""
        cluster = self._mqtt_cluster
        if cluster is not None and gen:
            cluster.release(context.client_id, gen)

    async def _close_taken_session(self, client_id: str, gen: int, new_node: int) -> bool:
        close = self._session_closer
        cluster = self._mqtt_cluster
        if close is None or cluster is None:
            return False
        return await close(client_id, gen, new_node != cluster.node)

    def _deliver_fanout(self, mqtt_topic: str, fields: bytes, qos: int) -> None:
        """A Fanout from another node: its record handed to the live readers as one read back
        from the log (QoS, retain and expiry come from its headers, as for a local record)."""
        feed = self._live
        if feed is None or not feed.router.count or not feed.readers:
            return
        record = rec.decode_record(fields, 0)
        message = Message(
            record.topic,
            record.queue,
            -1,  # not read from a queue here
            record.subject,
            record.key,
            record.headers,
            record.tags,
            record.body,
            record.protocol,
            record.client,
            record.address or mqtt_topic,
            record.born_ms,
            record.store_ms,
            record.flags,
            -1,
        )
        for reader in list(feed.readers):
            reader(message)

    def _fan_out(
        self,
        cluster: MqttCluster,
        context: ClientContext,
        result: PublishResult,
        topic: str,
        body: bytes | memoryview | None,
        subject: str,
        headers: Headers,
        address: str,
        qos: int,
    ) -> None:
        """Send a record delivered live here to the other nodes with matching routes, once
        each; not to the owner of its topic queue's shard when that is another node: its live
        feed reads the forwarded record back (a Fanout too would deliver it twice)."""
        nodes = cluster.nodes_for(address)
        nodes.discard(cluster.node)
        if not nodes:
            return
        shards = self._node.shards
        home = shards.queue_number(topic, result.queue)
        shard = shards.home if shards.single else shards.local(home)
        if shard is None:
            owner = cluster.owner_of(home)
            if owner is not None:
                nodes.discard(owner)
            if not nodes:
                return
        fields: bytes | None = None
        position = result.appended.position
        if shard is not None and position >= 0:
            # The frame just stored in the topic queue's shard here carries every field the
            # receiving node reads: sent as it is rather than encoded a second time.
            try:
                buf, start, size = shard.store.commitlog.read_frame(position)
                fields = bytes(buf[start : start + size])
            except (KeyError, rec.CorruptRecordError):
                fields = None
        if fields is None:
            fields = rec.encode_record(
                topic.encode(),
                result.queue,
                body,
                store_ms=now_ms(),
                headers=encoded_headers(headers) if headers else b"",
                tags=rec.encode_tags(tags_from_headers(headers)) if headers else b"",
                subject=subject.encode(),
                client=context.client_id.encode(),
                address=address.encode(),
                protocol=context.protocol,
            )
        for node in sorted(nodes):
            cluster.send(node, address, fields, qos)

    def fan_out_live_record(
        self, context: ClientContext, message: Message, mqtt_topic: str, qos: int
    ) -> None:
        """The live-record follower's call for a record this node read back
        (:meth:`follow_live_records`) under the MQTT topic name ``mqtt_topic``: on a cluster
        node, send it once to each other node with matching routes. This node read it back,
        so it owns the record's shard and is the only node that sends it; an MQTT publish was
        already sent by its publisher (publish_delivering_live), a received Fanout (offset -1)
        came from the sender: neither is sent again. An MQTT record that became visible only
        here, later (a delayed record come due, a committed half message, a dead letter), was
        sent by nobody: it goes."""
        cluster = self._mqtt_cluster
        if cluster is None or message.offset < 0:
            return
        if message.protocol == rec.PROTOCOL_MQTT and not _visible_later(message):
            return
        nodes = cluster.nodes_for(mqtt_topic)
        nodes.discard(cluster.node)
        if not nodes:
            return
        fields = rec.encode_record(
            message.topic.encode(),
            message.queue,
            message.body,
            store_ms=message.store_ms,
            born_ms=message.born_ms,
            key=message.key,
            headers=encoded_headers(message.headers) if message.headers else b"",
            tags=rec.encode_tags(message.tags) if message.tags else b"",
            subject=message.subject.encode(),
            client=message.client.encode(),
            address=message.address.encode(),
            protocol=message.protocol,
        )
        for node in sorted(nodes):
            cluster.send(node, mqtt_topic, fields, qos)

    # $share groups with members on several nodes, and wills (docs/cluster.md section 8): on a
    # cluster node, through the MqttCluster; a node alone has nothing to tell.

    async def shared_group_joined(self, context: ClientContext, name: str) -> None:
        """This node has members of the ``$share`` group whose queue is ``name``."""
        cluster = self._mqtt_cluster
        if cluster is not None:
            await cluster.share_joined(name)

    async def shared_group_left(self, context: ClientContext, name: str) -> bool:
        """This node's last member of the group left: True when no node has members (the
        caller deletes the group's queue); always True on a node alone."""
        cluster = self._mqtt_cluster
        return True if cluster is None else await cluster.share_left(name)

    async def shared_group_elsewhere(self, context: ClientContext, name: str) -> bool:
        """Whether another node has members of the group (a restart keeps its queue)."""
        cluster = self._mqtt_cluster
        return False if cluster is None else await cluster.share_elsewhere(name)

    def hold_will(self, context: ClientContext, will: bytes | None) -> None:
        """Keep the will of ``context``'s connection (the gateway's encoding) where another
        node finds it should this one die; None: it was published, or the connection ended
        normally. In the background, in order; nothing on a node alone."""
        cluster = self._mqtt_cluster
        if cluster is not None:
            cluster.hold_will(context.client_id, will)

    def on_orphaned_will(
        self, context: ClientContext, publish: Callable[[str, bytes], None] | None
    ) -> None:
        """The gateway's publisher of a dead node's will (issue 23): on a cluster node, the
        wills a node whose lease is gone left in Redis are taken by one survivor and each is
        handed to ``publish(client id, will as written for hold_will)`` once. None: no hook."""
        cluster = self._mqtt_cluster
        if cluster is not None:
            cluster.on_orphaned_will(publish)

    def has_live_subscriptions(self) -> bool:
        feed = self._live
        return feed is not None and feed.router.count > 0

    def live_subscribers(self, topic_name: str) -> tuple[Any, ...]:
        """The subscribers of every live subscription matching ``topic_name`` (each once)."""
        return self._live_feed().router.match(topic_name)

    def follow_live_records(self, context: ClientContext, reader: LiveReader) -> None:
        """Call ``reader(message)`` for every record stored by someone else (another
        protocol's publish, a delayed record when due, a commit, a dead letter) that a live
        subscription may match, soon after it is stored (core/delivery/live.py). A
        :class:`Message` is valid during the call only."""
        self._live_feed().follow(reader)

    def unfollow_live_records(self, reader: LiveReader) -> None:
        if self._live is not None:
            self._live.unfollow(reader)

    def publish_delivering_live(
        self,
        context: ClientContext,
        topic: str,
        body: bytes | memoryview | None,
        *,
        subject: str = "",
        headers: Headers = (),
        address: str = "",
        deliver_at_ms: int = 0,
        create_topic: bool | None = None,
        qos: int = 0,
    ) -> PublishOutcome | Publication:
        """:meth:`publish` for a caller that hands the record to the live subscriptions itself
        (the MQTT gateway, from the PUBLISH in hand, without reading it back): the record's own
        index entry is not read back for the followers; entries the publish made elsewhere
        (dead letters, a record held back by flow control and stored later) still are.

        Returns the outcome itself when the record is stored at once (the usual case; wait for
        durability with :meth:`when_durable` on its ``durable_mark``), a :class:`Publication`
        to await only when flow control held the publish back. One object fewer per PUBLISH
        than :meth:`publish`: this is the MQTT gateway's per-message path.

        On a cluster node the record also goes to the other nodes' live subscribers (a Fanout
        of ``address``, the MQTT topic name, with ``qos``), unless it is delayed or a half
        message (those reach live subscribers when indexed, as here)."""
        feed = self._live
        if feed is not None:
            feed.own_topic = topic
        try:
            # The node's publish called here, not through publish(): a second layer of
            # keyword arguments cost ~1 µs a message.
            started = run_eagerly(
                self._node.publish(
                    topic,
                    body,
                    subject=subject,
                    headers=headers,
                    protocol=context.protocol,
                    client=context.client_id,
                    address=address,
                    deliver_at_ms=deliver_at_ms,
                    create_topic=create_topic,
                    wait_durable=False,
                )
            )
        finally:
            if feed is not None:
                feed.end_own_publish()
        cluster = self._mqtt_cluster
        if cluster is not None and address and not deliver_at_ms:
            fan_out = (context, topic, body, subject, headers, address, qos)
            if isinstance(started, Pending):
                # Held back by flow control: sent once stored (eagerly up to that wait).
                later = run_eagerly(self._fan_out_when_stored(cluster, started, fan_out))
                assert isinstance(later, Pending)  # it waits where ``started`` waits
                return Publication(self, topic, None, later)
            if not started.half:
                self._fan_out(
                    cluster, context, started, topic, body, subject, headers, address, qos
                )
            return started
        if isinstance(started, Pending):
            return Publication(self, topic, None, started)
        return started

    async def _fan_out_when_stored(
        self,
        cluster: MqttCluster,
        started: Pending[PublishResult],
        fan_out: tuple[ClientContext, str, bytes | memoryview | None, str, Headers, str, int],
    ) -> PublishResult:
        result = await started
        if not result.half:
            context, topic, body, subject, headers, address, qos = fan_out
            self._fan_out(cluster, context, result, topic, body, subject, headers, address, qos)
        return result

    def failed_marks(self, durable_marks: Iterable[int]) -> dict[int, BaseException]:
        """Which of ``durable_marks`` (publishes' :attr:`PublishOutcome.durable_mark`) were not
        stored everywhere (a forward to another node's shard failed), with the error. A wait
        for the last of several marks (:meth:`when_durable`) says nothing of an earlier one's
        failure: a gateway acknowledging several publishes after one wait asks this too."""
        node = self._node
        if node.shards.single:  # one shard: stored in its log, durable in log order
            return {}
        return node.marks.failed(durable_marks)

    def is_durable(self, durable_mark: int, topic: str | None = None) -> bool:
        """Whether :meth:`when_durable` would return at once (a synchronous check for a batch
        of acknowledgements that mostly need no wait)."""
        node = self._node
        if not node.shards.single:  # a node-local sequence over its shards (base.py)
            return node.marks.is_durable(durable_mark, topic)
        store = node.shard.store  # (one shard: marks are its log's positions)
        return store.commitlog.flushed_position >= durable_mark or (
            topic is not None and not store.is_sync(topic)
        )

    # Routing every protocol's records to MQTT subscriptions (a route hook), and the amq.topic
    # compatibility exchange (RabbitMQ's MQTT plugin).

    def mqtt_compat_exchange(self) -> str | None:
        """The AMQP topic exchange MQTT publishes also go through (BrokerConfig.mqtt_exchange)."""
        return self._node.config.mqtt_exchange

    def add_route_hook(
        self,
        context: ClientContext,
        hook: Callable[[str, str, bytes | None, int, str], list[Destination]],
        *,
        may_route: Callable[[str], bool] | None = None,
    ) -> None:
        """Every publish (any protocol, plain or batch) also goes to what ``hook(topic,
        subject, key, protocol, address)`` returns; ``may_route(topic)`` False promises it
        returns nothing for ``topic`` now (a Kafka batch is then stored without decoding it)."""
        self._node.add_route_hook(hook, may_route=may_route)

    def remove_route_hook(
        self, hook: Callable[[str, str, bytes | None, int, str], list[Destination]]
    ) -> None:
        self._node.remove_route_hook(hook)

    def has_bindings_from(self, context: ClientContext, source: str) -> bool:
        """Whether any binding has ``source`` (cheap: a publish path's check). On a cluster
        node the bindings are the whole cluster's, other nodes' sessions' too."""
        return self._node.bindings.has_source(source)

    def bound_destinations(self, source: str, subject: str) -> set[Destination]:
        """The destinations bound on ``source`` matching ``subject`` directly (one lookup, no
        exchange-to-exchange hops: the per-publish path of the MQTT global bindings)."""
        return self._node.bindings.route(source, subject)

    # Durable queues of persistent sessions and shared groups: ack queues of their own (no
    # topic), fed by bindings, read through consume_session_queue.

    def _remote_session_queue(self, name: str) -> tuple[RemoteSessions, int] | None:
        """Where to reach the queue ``name`` when another node's shard holds it (a cluster
        node with remote sessions), else None."""
        remote = self._remote_retained
        shards = self._node.shards
        if remote is None or shards.single:
            return None
        number = shards.queue_number(name, 0)
        return None if shards.local(number) is not None else (remote.sessions, number)

    def _remote_session_state(self, client_id: str) -> tuple[RemoteSessions, int] | None:
        """Where to reach ``client_id``'s saved state when another node's shard holds it."""
        remote = self._remote_retained
        shards = self._node.shards
        if remote is None or shards.single:
            return None
        number = shards.placements.place(placement.PLACE_SESSION, client_id)
        return None if shards.local(number) is not None else (remote.sessions, number)

    async def declare_session_queue(
        self,
        context: ClientContext,
        name: str,
        *,
        tag_filter: TagFilter | None = None,
        empty: bool = False,
    ) -> bool:
        """Get or create the durable queue ``name`` (True: created, starting empty, with
        ``tag_filter``); ``empty`` drops an existing queue's backlog too. On a cluster node the
        queue stays in its shard: another node's is declared by its owner (the tag filter is
        not applied there yet)."""
        remote = self._remote_session_queue(name)
        if remote is not None:
            sessions, shard = remote
            return await sessions.declare_queue(shard, name, empty=empty)
        queue, created = await self._node.declare_ack_queue(
            name, 0, AckQueueConfig(tag_filter=tag_filter) if tag_filter is not None else None
        )
        if created or empty:
            queue.purge()
        return created

    async def discard_session_queue(self, context: ClientContext, name: str) -> bool:
        """Delete the queue, its bindings and its index; False if there was none."""
        remote = self._remote_session_queue(name)
        if remote is not None:
            sessions, shard = remote
            return await sessions.discard_queue(shard, name)
        return await self._node.discard_ack_queue(name) is not None

    def has_session_queue(self, context: ClientContext, name: str) -> bool:
        return self._node.ack_queue(name) is not None

    def session_queue_names(self, prefixes: tuple[str, ...]) -> list[str]:
        """The names of the queues (of queue number 0) starting with one of ``prefixes``."""
        return [
            topic
            for (topic, number), _queue in self._node.ack_queues()
            if number == 0 and topic.startswith(prefixes)
        ]

    def set_session_queue_tag_filter(
        self, context: ClientContext, name: str, tag_filter: TagFilter | None
    ) -> None:
        """The queue skips, by the index's tag mask, the records ``tag_filter`` refuses (None:
        none); kept in memory (the caller sets it again after a restart)."""
        queue = self._node.ack_queue(name)
        if queue is None:
            return
        current = queue.config.tag_filter
        if (current is None) != (tag_filter is None) or (
            current is not None and tag_filter is not None and current.tags != tag_filter.tags
        ):
            queue.config.tag_filter = tag_filter

    async def bind_session_queue(
        self, context: ClientContext, source: str, kind: str, pattern: str, name: str
    ) -> bool:
        """A durable binding from ``source`` (``kind``: "topic" or "mqtt") to the queue; False if
        it existed already."""
        return await self._node.bind(source, kind, pattern, (name, 0))

    async def unbind_session_queue(
        self, context: ClientContext, source: str, kind: str, pattern: str, name: str
    ) -> bool:
        return await self._node.unbind(source, kind, pattern, (name, 0))

    def session_queue_bindings(self, prefixes: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
        """``(source, kind, pattern, queue name)`` of every binding to a queue named with one of
        ``prefixes``."""
        return [
            (binding.source, binding.kind.value, binding.pattern, binding.destination[0])
            for binding in self._node.bindings.bindings()
            if binding.destination[1] == 0 and binding.destination[0].startswith(prefixes)
        ]

    def consume_session_queue(
        self,
        context: ClientContext,
        name: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        on_cancel: Callable[[str], None] | None = None,
    ) -> Subscription | None:
        """Attach a consumer (tagged with the context's client id) that is pushed the queue's
        records while it has fewer than ``prefetch`` in flight; None if there is no queue.
        A queue of another node's shard is consumed there (a ``Consume`` stream, ``prefetch``
        its credit; settled on the owner); ``on_cancel(reason)`` is called when the owner
        ends the consumer or it cannot be attached."""
        remote = self._remote_session_queue(name)
        queues = self._remote_queues
        if remote is not None and queues is not None:
            handle = RemoteQueueHandle(queues, remote[1], name, None)
            return handle.subscribe(
                context.connection_id,
                prefetch,
                deliver,
                no_ack=False,
                client_id=context.client_id,
                on_cancel=on_cancel,
            )
        queue = self._node.ack_queue(name)
        if queue is None:
            return None
        return Subscription(queue.add_consumer(context.client_id, prefetch, deliver))

    # Retained messages (core/state/retained.py) and session states (core/state/sessions.py):
    # durable in the log, values in the gateway's own layout. On a cluster node (a
    # RemoteRetained set) a topic's retained message lives in its slot's shard
    # (placement.PLACE_RETAINED, docs/cluster.md section 8): set and cleared there, an exact
    # filter read there, a wildcard one asked of every owner and merged.

    _remote_retained: RemoteRetained | None = None
    # (QueueCalls'; the remote sessions' queues are consumed through it.)
    _remote_queues: RemoteQueues | None = None

    def set_remote_retained(self, remote: RemoteRetained | None) -> None:
        """Keep retained messages in their slots' shards, reaching other nodes' through
        ``remote`` (called once, by the process that assembles a cluster node)."""
        self._remote_retained = remote

    def _retained_messages(self) -> RetainedMessages:
        # A node alone: one table, in the node's home shard.
        return self._node.shards.home.retained()

    def _retained_slot(self, topic_name: str) -> int:
        return self._node.shards.placements.place(placement.PLACE_RETAINED, topic_name)

    def store_retained(self, context: ClientContext, topic_name: str, value: bytes | None) -> None:
        """Retain ``value`` for ``topic_name`` (None clears it); on a cluster node in the
        topic's slot shard, through its owner when that is another node (in the background,
        in the order asked)."""
        remote = self._remote_retained
        if remote is None:
            self._retained_messages().put(topic_name, value)
            return
        shard = self._retained_slot(topic_name)
        local = self._node.shards.local(shard)
        if local is not None:
            local.retained().put(topic_name, value)
        else:
            remote.put(shard, topic_name, value)

    def retained_matching(
        self, context: ClientContext, topic_filter: str
    ) -> list[tuple[str, bytes]]:
        """``(topic name, value)`` of the retained messages a (non-shared) filter matches, of
        this node's shards only (:meth:`retained_matching_everywhere` asks the others too)."""
        if self._remote_retained is None:
            return self._retained_messages().matching(topic_filter)
        return local_retained_matching(self._node.shards, topic_filter)

    async def retained_matching_everywhere(
        self, context: ClientContext, topic_filter: str
    ) -> list[tuple[str, bytes]]:
        """:meth:`retained_matching` over the whole cluster: an exact filter read in its slot's
        shard, a wildcard one in every shard (the other owners asked in parallel). Does not
        suspend on a node alone."""
        remote = self._remote_retained
        if remote is None:
            return self._retained_messages().matching(topic_filter)
        shards = self._node.shards
        if ONE_LEVEL not in topic_filter and MULTI_LEVEL not in topic_filter:
            shard = self._retained_slot(topic_filter)
            if shards.local(shard) is not None:
                return local_retained_matching(shards, topic_filter)
            return await remote.matching(topic_filter, [shard])
        found = local_retained_matching(shards, topic_filter)
        others = [n for n in range(shards.count) if shards.local(n) is None]
        if others:
            found += await remote.matching(topic_filter, others)
        return found

    def retained_count(self) -> int:
        if self._remote_retained is None:
            return len(self._retained_messages())
        return sum(len(shard.retained()) for shard in self._node.shards)

    def save_session_state(self, context: ClientContext, client_id: str, state: bytes) -> None:
        """Save ``client_id``'s state in its shard (another node's: through its owner, in the
        background, in order: :meth:`session_states_written`)."""
        remote = self._remote_session_state(client_id)
        if remote is not None:
            remote[0].save_state(remote[1], client_id, state)
            return
        self._node.shards.for_session(client_id).session_states().save(client_id, state)

    def delete_session_state(self, context: ClientContext, client_id: str) -> None:
        remote = self._remote_session_state(client_id)
        if remote is not None:
            remote[0].save_state(remote[1], client_id, None)
            return
        self._node.shards.for_session(client_id).session_states().delete(client_id)

    async def load_session_state(self, context: ClientContext, client_id: str) -> bytes | None:
        """On a cluster node, ``client_id``'s state saved in its shard, whichever node saved
        it (a session last connected to another node); None on a node alone, where the
        gateway restored every session at start (:meth:`session_states`)."""
        if self._remote_retained is None:
            return None
        remote = self._remote_session_state(client_id)
        if remote is not None:
            return await remote[0].load_state(remote[1], client_id)
        return self._node.shards.for_session(client_id).session_states().table.get(client_id)

    async def session_states_written(self, context: ClientContext) -> None:
        """Returns once the states saved so far through other nodes are in their shards."""
        remote = self._remote_retained
        if remote is not None:
            await remote.sessions.written()

    def session_states(self) -> list[tuple[str, bytes]]:
        """``(client id, state)`` of every saved session."""
        return [item for shard in self._node.shards for item in shard.session_states().items()]


def _visible_later(message: Message) -> bool:
    """Whether ``message`` became visible after its publish, on its shard's owner: a delayed
    record whose time came, a committed half message, a dead letter (its publisher delivered
    none of them live)."""
    if message.flags & (rec.FLAG_DELAYED | rec.FLAG_HALF):
        return True
    return bool(message.headers) and message.header(DEAD_LETTER_TOPIC_HEADER) is not None


def _others_want(cluster: MqttCluster | None) -> Callable[[str], bool] | None:
    """The cluster's check of other nodes' routes for a log topic (NodeMqttCluster's
    ``others_want``), read by name: the MqttCluster seam (core/broker/remote.py) is a fixed
    contract without it; None (no read-back for other nodes) for one that lacks it."""
    check = getattr(cluster, "others_want", None)
    return check if callable(check) else None
