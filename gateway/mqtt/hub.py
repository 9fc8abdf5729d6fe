"""``MqttHub``: the MQTT side of the broker, shared by the TCP and WebSocket listeners of one
broker (one per :class:`BrokerAPI`): the sessions by client id, the live subscriptions of clean
sessions, shared-subscription groups, retained messages, durable session state, and the publish
path. It uses the broker through the Broker API only (``core/api/``).

Durable state (everything is in the log, ARCHITECTURE.md):

- a persistent session's queue ``__mqtt.session.<client id>`` and its subscriptions as core
  bindings to it (``declare_session_queue``, ``bind_session_queue``: durable in ``__meta``);
- shared groups' ack queues ``__mqtt.share.<group>/<filter>`` and their bindings;
- ``__sessions``: per persistent session a JSON record (session expiry, subscriptions with their
  options, QoS 2 identifiers in flight, the time it went offline), so a restart rebuilds the
  sessions and reconciles the bindings with them (``save_session_state``, ``session_states``);
- ``__retained``: retained messages (``retained.py``, ``store_retained``).

Publishing (``publish_packet``): topic name -> (log topic, subject) (``addresses.py``), headers
from the properties (``messages.py``), ``BrokerAPI.publish_delivering_live`` (stores now, in
packet order; the PUBACK waits for durability in the connection), then the retained table and the
live subscriptions, handed the message in hand. The filters with a wildcard first level are
bindings on ``GLOBAL_SOURCE``, routed by the full topic name in the broker's route hook
(``_route_hook``), whatever protocol published the record.

A clean session's plain subscriptions are live subscriptions of the broker's one live router
(``subscribe_live``, core/routing/live.py). Records of other protocols (and delayed records when
their time comes) reach them through ``follow_live_records``: the core reads back each record of
a topic the live router has subscriptions for and hands it to ``_on_live_record``.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
import weakref
from collections.abc import Coroutine
from typing import Any, Final

from core.api import (
    LEVEL_SEPARATOR,
    PRODUCER_GROUP_HEADER,
    PROTOCOL_MQTT,
    TXN_ID_HEADER,
    BrokerAPI,
    ClientContext,
    Destination,
    Message,
    Publication,
    PublishOutcome,
    RoutingError,
    ShardUnavailable,
    TagFilter,
    TopicError,
    mqtt_name_of,
    now_ms,
    parse_shared_subscription,
    routing_key_of,
    start_eagerly,
    tags_from_headers,
    validate_topic_filter,
)
from gateway.mqtt.access import PUBLISH, SUBSCRIBE, WILL, Access
from gateway.mqtt.addresses import (
    DELAYED_PREFIX,
    GLOBAL_SOURCE,
    GROUP_QUEUE_PREFIX,
    HALF_PREFIX,
    SESSION_QUEUE_PREFIX,
    SHARE_PREFIX,
    BindingSpec,
    binding_plan,
    group_queue_name,
    mqtt_topic_of,
    parse_delayed,
    parse_half,
    session_queue_name,
    to_log_address,
)
from gateway.mqtt.client_session import Session
from gateway.mqtt.messages import (
    OutMessage,
    forwarded_properties,
    out_message_of,
    publish_headers,
)
from gateway.mqtt.options import MqttOptions
from gateway.mqtt.packets import Publish, Subscription, Will
from gateway.mqtt.properties import NO_PROPERTIES
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.retained import RetainedStore
from gateway.mqtt.session import NEVER_EXPIRES, Connection
from gateway.mqtt.shared import SharedGroup
from gateway.mqtt.subscriptions import Inflight, Sub, combine, record_tags
from gateway.mqtt.sys import SYS_LEVEL, SysTopics, is_sys_topic
from gateway.mqtt.wills import will_from_record, will_record

__all__ = ["MqttHub", "MqttOptions"]  # MqttOptions: where the listeners and tests found it

log = logging.getLogger(__name__)

ASSIGNED_CLIENT_ID_PREFIX: Final = "braid-"
# Seconds before an expiry that could not ask the session registry is tried again.
EXPIRY_RETRY_S: Final = 5.0
SESSION_RECORD_VERSION: Final = 1

Outcome = tuple[int, int, str]  # (reason code, end position to wait durable for, log topic)
_NO_HEADERS: Final[list[tuple[str, bytes]]] = []  # never mutated
_REFUSED_TOPIC: Final[Outcome] = (ReasonCode.TOPIC_NAME_INVALID, 0, "")
# A publish the user may not make: 5.0 PUBACK 0x87; 3.1.1 acknowledged and dropped (or the
# connection closed: [auth] mqtt_denied_publish).
_DENIED: Final[Outcome] = (ReasonCode.NOT_AUTHORIZED, 0, "")


_hubs: weakref.WeakKeyDictionary[BrokerAPI, MqttHub] = weakref.WeakKeyDictionary()


class MqttHub:
    @classmethod
    def acquire(cls, api: BrokerAPI, options: MqttOptions | None = None) -> MqttHub:
        """The hub of the broker behind ``api``, made on first use; every listener built on the
        same API shares it (sessions are per client id, whichever transport it comes over).
        Pair with release."""
        hub = _hubs.get(api)
        if hub is None or hub.closed:
            hub = _hubs[api] = cls(api, options or MqttOptions())
        hub.users += 1
        return hub

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.close()

    def __init__(self, api: BrokerAPI, options: MqttOptions) -> None:
        self.api = api
        self.options = options
        # What the hub does on its own behalf (restoring sessions, expiring them, retained
        # messages' upkeep); a client's own actions carry its connection's context.
        self.context = ClientContext(PROTOCOL_MQTT, connection_id="mqtt-hub")
        self.users = 0
        self.closed = False
        self.sessions: dict[str, Session] = {}
        # Live subscriptions (clean sessions' plain ones, in the broker's live router) that
        # have a tag filter: records' tags are looked at only while there are any.
        self.live_tag_filtered = 0
        self.groups: dict[str, SharedGroup] = {}
        self.retained = RetainedStore(api, self.context)
        self.global_bindings = 0
        self.metrics: dict[str, int] = {
            "sessions_expired": 0,
            "wills_published": 0,
            "retained_stored": 0,
            "delayed_published": 0,
            "half_published": 0,
            "tapped_records": 0,
        }
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.get_running_loop()
        # Plain subscriptions whose first level is $SYS, of every session: the $SYS tree's
        # values reach them from memory (sys.py), not through the broker's routing.
        self.sys_subscriptions: set[Sub] = set()
        self.sys_topics = SysTopics(self, options.sys_interval) if options.sys_interval else None
        self.amqp_exchange = options.amqp_exchange or api.mqtt_compat_exchange()
        api.follow_live_records(self.context, self._on_live_record)
        api.add_route_hook(self.context, self._route_hook, may_route=self._may_route)
        api.on_session_takeover(self.context, self._close_taken_session)
        api.on_orphaned_will(self.context, self._publish_orphaned_will)
        # Done before this returns on a single node (its metadata changes never wait).
        start_eagerly(self._load(), self.spawn)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        api = self.api
        api.remove_route_hook(self._route_hook)
        api.unfollow_live_records(self._on_live_record)
        api.on_session_takeover(self.context, None)
        api.on_orphaned_will(self.context, None)
        if self.sys_topics is not None:
            self.sys_topics.close()
        for session in self.sessions.values():
            for timer in (session.expiry_timer, session.will_timer):
                if timer is not None:
                    timer.cancel()
            if session.queue_name is None:  # the broker's live router outlives this hub
                for sub in session.plain:
                    api.unsubscribe_live(session.context, sub.filter, sub)
        for task in list(self._tasks):
            task.cancel()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("mqtt task failed", exc_info=task.exception())

    # -- client ids --------------------------------------------------------------------------

    @staticmethod
    def new_client_id() -> str:
        return ASSIGNED_CLIENT_ID_PREFIX + uuid.uuid4().hex[:20]

    # -- sessions --------------------------------------------------------------------------

    async def open_session(
        self, connection: Connection, client_id: str, clean_start: bool, expiry: int
    ) -> tuple[Session, bool]:
        """The session a CONNECT gets, and whether it existed ("session present")."""
        if self.sys_topics is not None:  # $SYS sums the counters of every listener
            self.sys_topics.add_listener_counters(connection.metrics)
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            existing.connection.take_over()
            existing = self.sessions.get(client_id)
        if existing is None or existing.connection is None:
            existing = await self._session_saved_elsewhere(connection.context, client_id)
        if existing is not None and clean_start:
            await self.end_session(existing)  # [MQTT-3.1.2-4]
            existing = None
        if existing is not None:
            if existing.queue_name is not None:
                # Its queue's shard must be served (another node's: its owner answers), else
                # ShardUnavailable: CONNACK 0x88, not a session that receives nothing.
                await self.api.declare_session_queue(connection.context, existing.queue_name)
            self._cancel_timers(existing)
            if existing.pending_will is not None:  # back before the Will Delay [MQTT-3.1.3-9]
                existing.pending_will = None
                self.api.hold_will(existing.context, None)
            existing.expiry_interval = expiry
            existing.disconnected_ms = None  # online: a crash now restarts its expiry clock
            self.persist(existing)
            return existing, True
        session = Session(self, client_id, expiry, connection.context)
        if session.persistent:
            name = session.queue_name = session_queue_name(client_id)
            # A new session starts empty, whatever an old queue held.
            await self.api.declare_session_queue(connection.context, name, empty=True)
        self.sessions[client_id] = session
        self.persist(session)
        return session, False

    async def _session_saved_elsewhere(
        self, context: ClientContext, client_id: str
    ) -> Session | None:
        """On a cluster node, the persistent session ``client_id`` last had on another node
        (its state in its shard, docs/cluster.md section 8), rebuilt here; None if it has
        none (or it expired meanwhile). ShardUnavailable when its shards cannot be reached."""
        raw = await self.api.load_session_state(context, client_id)
        kept = self.sessions.get(client_id)
        if raw is None or (kept is not None and kept.connection is not None):
            return kept
        data = json.loads(raw)
        if kept is not None:
            # An offline copy here (restored at start, or left by a refused CONNECT): the state
            # in the shard is the newer one when the session was used on another node since.
            mine = kept.to_json()
            if all(mine[key] == data.get(key) for key in ("subs", "qos2", "released")):
                return kept
            self._cancel_timers(kept)
            del self.sessions[client_id]
        await self._restore(client_id, data, now_ms())
        session = self.sessions.get(client_id)
        if session is not None:
            log.info("mqtt %r: session resumed from its saved state", client_id)
        return session

    async def _close_taken_session(self, client_id: str, gen: int, elsewhere: bool) -> bool:
        """A cluster node claimed ``client_id`` for its connection ``gen``
        (``BrokerAPI.claim_client_id``): close an older connection of it here (0x8E). A
        persistent session that moved to another node is dropped here, connected or not, not
        ended: its queue, bindings and saved state are the cluster's, and its expiry here must
        not delete them. The answer waits until its last state is saved in its shard, where
        the new node reads it."""
        session = self.sessions.get(client_id)
        if session is None:
            return False
        connection = session.connection
        if connection is not None and connection.cluster_gen >= gen:
            return False
        if connection is not None:
            connection.take_over()
        if session.persistent and elsewhere:
            self._cancel_timers(session)
            if self.sessions.get(client_id) is session:
                del self.sessions[client_id]
            await self.api.session_states_written(self.context)
        return connection is not None

    def detach(self, session: Session, connection: Connection, will: Will | None) -> None:
        """``connection`` is gone from ``session``: keep it (persistent) or end it."""
        if session.connection is not connection:
            return
        session.detach()
        if will is not None:
            self._schedule_will(session, will, connection.context)
        elif connection.will is not None:  # a normal DISCONNECT: the will is dropped
            self.api.hold_will(connection.context, None)
        if session.expiry_interval == 0 or session.ended:
            self.end_session_soon(session)
            return
        self.persist(session)
        self._schedule_expiry(session, session.expiry_interval)

    def end_session_soon(self, session: Session) -> None:
        """:meth:`end_session` from a callback that cannot wait (a connection gone, a timer):
        done before this returns on a single node, else in a task."""
        start_eagerly(self.end_session(session), self.spawn)

    async def end_session(self, session: Session) -> None:
        if session.ended:
            return
        session.ended = True
        self._cancel_timers(session)
        if session.connection is not None:
            session.detach()
        if session.cluster_gen:  # its registration to this node (session.py: _go_away)
            self.api.release_client_id(session.context, session.cluster_gen)
            session.cluster_gen = 0
        for topic_filter in list(session.subscriptions):
            await self.unsubscribe(session, topic_filter, persist=False)
        if session.queue_name is not None:
            await self.api.discard_session_queue(session.context, session.queue_name)
        if session.persistent:
            self.api.delete_session_state(session.context, session.client_id)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        will = session.pending_will
        if will is not None:
            session.pending_will = None
            self._publish_will(session.context, will)

    def set_expiry(self, session: Session, expiry: int) -> None:
        cap = self.options.max_session_expiry
        session.expiry_interval = min(expiry, cap) if cap is not None else expiry
        self.persist(session)

    def persist(self, session: Session) -> None:
        if session.persistent and not session.ended:
            record = session.to_json()
            record["v"] = SESSION_RECORD_VERSION
            self.api.save_session_state(
                session.context, session.client_id, json.dumps(record).encode()
            )

    def _cancel_timers(self, session: Session) -> None:
        for timer in (session.expiry_timer, session.will_timer):
            if timer is not None:
                timer.cancel()
        session.expiry_timer = session.will_timer = None

    def _schedule_expiry(self, session: Session, seconds: float) -> None:
        if session.expiry_interval == NEVER_EXPIRES:
            return
        if session.expiry_timer is not None:
            session.expiry_timer.cancel()
        session.expiry_timer = self._loop.call_later(max(0.0, seconds), self._expire, session)

    def _expire(self, session: Session) -> None:
        session.expiry_timer = None
        if session.connection is None and not session.ended:
            start_eagerly(self._expire_unless_moved(session), self.spawn)

    async def _expire_unless_moved(self, session: Session) -> None:
        """End an expired session, unless (a cluster node) its client id is registered to
        another node: the session lives there and this copy (restored at start) is stale: it
        is dropped, not ended, as a takeover drops one."""
        client_id = session.client_id
        try:
            moved = await self.api.client_id_held_elsewhere(self.context, client_id)
        except Exception as error:  # Redis unreachable: ask again later
            log.warning("mqtt: expiry of session %r postponed: %s", client_id, error)
            session.expiry_timer = self._loop.call_later(EXPIRY_RETRY_S, self._expire, session)
            return
        if session.connection is not None or session.ended:
            return
        if moved:
            log.info("mqtt: session %r lives on another node: copy here dropped", client_id)
            self._cancel_timers(session)
            if self.sessions.get(client_id) is session:
                del self.sessions[client_id]
            return
        self.metrics["sessions_expired"] += 1
        await self.end_session(session)

    # -- wills -----------------------------------------------------------------------------

    def hold_will(self, session: Session, will: Will) -> None:
        """A connection of ``session`` with ``will`` is open: on a cluster node the will is
        written down for the node that would publish it should this one die."""
        self.api.hold_will(session.context, will_record(will, session.expiry_interval))

    def _schedule_will(self, session: Session, will: Will, context: ClientContext) -> None:
        delay = will.properties.will_delay_interval or 0
        if delay == 0 or session.expiry_interval == 0:
            self._publish_will(context, will)
            return
        session.pending_will = will
        wait = min(delay, session.expiry_interval)
        session.will_timer = self._loop.call_later(wait, self._will_due, session)

    def _will_due(self, session: Session) -> None:
        session.will_timer = None
        will, session.pending_will = session.pending_will, None
        if will is not None:
            self._publish_will(session.context, will)

    def _publish_will(self, context: ClientContext, will: Will) -> None:
        packet = Publish(
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            False,
            1 if will.qos else None,
            will.properties,
        )
        self.metrics["wills_published"] += 1
        self.api.hold_will(context, None)
        if self.api.publishing_blocked():
            self.spawn(self._publish_will_later(context, packet))
            return
        outcome = self.publish_packet(context, None, packet.topic, packet)
        if not isinstance(outcome, tuple):
            self.spawn(outcome)

    async def _publish_will_later(self, context: ClientContext, packet: Publish) -> None:
        await self.api.wait_publishing_allowed()
        outcome = self.publish_packet(context, None, packet.topic, packet)
        if not isinstance(outcome, tuple):
            await outcome

    def _publish_orphaned_will(self, client_id: str, record: bytes) -> None:
        """A will of a connection on a node that died (issue 23), taken by this node: published
        after its delay, as that node would have (its permission was checked at CONNECT)."""
        try:
            will, delay_s = will_from_record(record)
        except Exception as error:  # a record another version wrote
            log.warning("mqtt: will of %r (a dead node's) not readable: %s", client_id, error)
            return
        log.info("mqtt: publishing the will of %r (its node died) in %d s", client_id, delay_s)
        packet = Publish(
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            False,
            1 if will.qos else None,
            will.properties,
        )
        self.metrics["wills_published"] += 1
        self._loop.call_later(
            delay_s, lambda: self.spawn(self._publish_will_later(self.context, packet))
        )

    def may_publish_will(self, access: Access, will: Will) -> bool:
        """The will's publish permission, checked at CONNECT (its target as a PUBLISH to the
        same topic name would have; a name that cannot be published is refused later, as any
        publish)."""
        target = will.topic
        if target.startswith(DELAYED_PREFIX):
            delayed = parse_delayed(target)
            target = delayed.topic if delayed is not None else target
        elif target.startswith(HALF_PREFIX):
            half = parse_half(target)
            target = half.topic if half is not None else target
        address = to_log_address(target)
        return address is None or access.allowed(WILL, address.topic, address.subject)

    # -- publishing ------------------------------------------------------------------------

    def publish_packet(
        self, context: ClientContext, publisher: Connection | None, topic: str, packet: Publish
    ) -> Outcome | Coroutine[Any, Any, Outcome]:
        """Store one PUBLISH of ``context``'s client in the log and hand it to live
        subscribers; returns the reason code of the acknowledgement and what to wait durable
        for. Call with flow control not blocked: then the record is stored now (else a
        coroutine to await finishes it)."""
        deliver_at = 0
        target = topic
        half = None
        if topic[:1] == "$":
            if topic.startswith(DELAYED_PREFIX):
                delayed = parse_delayed(topic)
                if delayed is None:
                    return _REFUSED_TOPIC
                target = delayed.topic
                if delayed.delay_s:
                    deliver_at = now_ms() + delayed.delay_s * 1000
            elif topic.startswith(HALF_PREFIX):
                half = parse_half(topic)
                if half is None:
                    return _REFUSED_TOPIC
                target = half.topic
            elif topic.startswith(SHARE_PREFIX):
                return _REFUSED_TOPIC
            elif is_sys_topic(topic):  # the broker's own tree: 0x87, as Mosquitto (sys.py)
                log.info(
                    "mqtt %s: publish to %r refused: $SYS is the broker's", context.client_id, topic
                )
                return _DENIED
        address = to_log_address(target)
        if address is None:
            return _REFUSED_TOPIC
        if publisher is not None and not publisher.access.allowed(
            PUBLISH, address.topic, address.subject
        ):
            return _DENIED
        props = packet.properties
        expires_at = 0
        if props is not NO_PROPERTIES:
            if props.payload_format_indicator == 1 and not _is_utf8(packet.payload):
                return (ReasonCode.PAYLOAD_FORMAT_INVALID, 0, "")
            if props.message_expiry_interval is not None:
                expires_at = now_ms() + props.message_expiry_interval * 1000
        qos = packet.qos
        retain = packet.retain
        headers = (
            publish_headers(props, qos, retain, expires_at)
            if qos or retain or (props is not NO_PROPERTIES)
            else _NO_HEADERS
        )
        if half is not None:  # the topic prefix says what 5.0 user properties would
            headers = [
                *headers,
                (TXN_ID_HEADER, half.txn_id.encode()),
                (PRODUCER_GROUP_HEADER, half.producer_group.encode()),
            ]
        log_topic = address.topic
        try:
            outcome = self.api.publish_delivering_live(
                context,
                log_topic,
                packet.payload,
                subject=address.subject,
                headers=headers,
                address=target,
                deliver_at_ms=deliver_at,
                create_topic=True,
                qos=qos,
            )
        except TopicError as error:
            log.info("mqtt %s: publish to %r refused: %s", context.client_id, target, error)
            return _REFUSED_TOPIC
        # (isinstance of the plain outcome class: Publication is an Awaitable, an ABC, whose
        # isinstance check is slow)
        if not isinstance(outcome, PublishOutcome):  # flow control held it back: finish later
            return self._publish_finish(outcome, context, target, packet)
        if deliver_at:
            self.metrics["delayed_published"] += 1
        elif outcome.half:
            # A transactional half message (x-braid-txn-id): invisible, and never retained,
            # until its commit; the commit's LINK reaches live subscribers as an index entry.
            self.metrics["half_published"] += 1
        elif retain or self.api.has_live_subscriptions():
            message = OutMessage(
                target,
                packet.payload,
                qos,
                retain,
                context.client_id,
                expires_at,
                forwarded_properties(props),
            )
            if retain:
                self._retain(context, message)
            tags = tags_from_headers(headers) if self.live_tag_filtered else None
            self.deliver_live(message, tags)
        return (0, outcome.durable_mark, log_topic)

    async def _publish_finish(
        self, publication: Publication, context: ClientContext, target: str, packet: Publish
    ) -> Outcome:
        # Live subscribers get it read back from the log (it was stored after our publish call).
        outcome = await publication
        if packet.retain and not outcome.half:
            self._retain(
                context,
                OutMessage(
                    target,
                    packet.payload,
                    packet.qos,
                    True,
                    context.client_id,
                    0,
                    forwarded_properties(packet.properties),
                ),
            )
        return (0, outcome.durable_mark, outcome.delivered_to[0][0])

    def _retain(self, context: ClientContext, message: OutMessage) -> None:
        self.retained.put(message, context)
        self.metrics["retained_stored"] += 1

    def deliver_live(self, message: OutMessage, tags: list[str] | None = None) -> None:
        """Hand a message to the clean sessions subscribed to its topic (``tags``: the record's,
        given when some live subscription has a tag filter)."""
        subs: tuple[Sub, ...] = self.api.live_subscribers(message.topic)
        if not subs:
            return
        origin = message.origin
        if len(subs) == 1:
            for sub in subs:
                session = sub.session
                if sub.no_local and origin == session.client_id:
                    return
                if sub.tag_filter is not None and not sub.takes(tags):
                    return
                if sub.per_record and not session.may_read(message.topic):
                    return
                qos = sub.qos if sub.qos < message.qos else message.qos
                ids: tuple[int, ...] = (sub.identifier,) if sub.identifier else ()
                session.offer(message, qos, message.retain and sub.retain_as_published, ids, None)
            return
        by_session: dict[Session, list[Sub]] = {}
        for sub in subs:
            if sub.no_local and origin == sub.session.client_id:
                continue
            if sub.tag_filter is not None and not sub.takes(tags):
                continue  # per subscription: another of the session's may still match
            if sub.per_record and not sub.session.may_read(message.topic):
                continue
            by_session.setdefault(sub.session, []).append(sub)
        for session, matched in by_session.items():
            qos, retain, all_ids = combine(message, matched)
            session.offer(message, qos, retain, all_ids, None)

    async def send_retained(self, session: Session, sub: Sub) -> None:
        messages = await self.retained.matching(
            session.context, LEVEL_SEPARATOR.join(sub.levels), now_ms()
        )
        if self.sys_topics is not None and sub.levels[0] == SYS_LEVEL:
            messages += self.sys_topics.matching(session, sub.levels)  # kept in memory
        for message in messages:
            if sub.no_local and message.origin == session.client_id:
                continue
            if sub.tag_filter is not None and not sub.takes(_properties_tags(message)):
                continue
            if sub.per_record and not session.may_read(message.topic):
                continue
            qos = sub.qos if sub.qos < message.qos else message.qos
            ids = (sub.identifier,) if sub.identifier else ()
            session.offer(message, qos, True, ids, None)  # RETAIN 1 [MQTT-3.3.1-9]

    # -- routing of every protocol's publishes to MQTT subscriptions ----------------------

    def _may_route(self, topic: str) -> bool:
        """Whether :meth:`_route_hook` can return anything for a record of ``topic``."""
        return topic[:2] != "__" and (
            self.global_bindings > 0 or bool(self.amqp_exchange) or self._others_global()
        )

    def _others_global(self) -> bool:
        """Whether other nodes' sessions have filters with a wildcard first level (bindings on
        GLOBAL_SOURCE this hub did not make: a cluster's bindings are everyone's)."""
        return self.api.has_bindings_from(self.context, GLOBAL_SOURCE)

    def _route_hook(
        self, topic: str, subject: str, key: bytes | None, protocol: int, address: str
    ) -> list[Destination]:
        """Broker route hook: the session queues of filters with a wildcard first level (bound
        on GLOBAL_SOURCE) that the record's MQTT topic name matches, whatever protocol published
        it; in RabbitMQ compatibility mode also amq.topic's bindings and back."""
        if topic[:2] == "__":
            return []
        exchange = self.amqp_exchange
        api = self.api
        found: list[Destination] = []
        if protocol == PROTOCOL_MQTT and address:
            name = address
            if exchange:
                found.extend(api.routed_destinations(exchange, routing_key_of(name)))
        elif exchange and topic == exchange:
            # An AMQP publish to amq.topic with routing key a.b.c is MQTT a/b/c.
            name = mqtt_name_of(subject)
            log_address = to_log_address(name)
            if log_address is not None:
                found.extend(api.routed_destinations(log_address.topic, log_address.subject))
        else:
            name = mqtt_topic_of(topic, subject, key)
        if self.global_bindings or self._others_global():
            found.extend(api.bound_destinations(GLOBAL_SOURCE, name))
        return found

    # -- records of other protocols for clean sessions -------------------------------------

    def _on_live_record(self, message: Message) -> None:
        """A record stored by someone else that a live subscription may match (the core reads
        it back for us: ``follow_live_records``)."""
        self.metrics["tapped_records"] += 1
        tags = record_tags(message) if self.live_tag_filtered else None
        out = out_message_of(message)
        self.deliver_live(out, tags)
        # On a cluster node: what this node read back (an AMQP or Kafka record of a shard it
        # owns) also goes to the other nodes' subscribers; nothing on a single node.
        self.api.fan_out_live_record(self.context, message, out.topic, out.qos)

    # -- subscriptions ---------------------------------------------------------------------

    async def subscribe(
        self,
        session: Session,
        request: Subscription,
        identifier: int,
        tag_filter: TagFilter | None = None,
    ) -> tuple[int, Sub | None, bool]:
        """(reason code, subscription, whether it is new) for one SUBSCRIBE entry.
        ``tag_filter`` (user property ``tag-filter``): a plain subscription takes only records
        with one of its tags (a SUBSCRIBE replacing it replaces its filter too); a shared
        subscription's applies to its group's queue when this subscription creates it."""
        topic_filter = request.topic_filter
        try:
            shared = parse_shared_subscription(topic_filter)
            if shared is None:
                validate_topic_filter(topic_filter)
        except RoutingError:
            return ReasonCode.TOPIC_FILTER_INVALID, None, False
        inner = shared.filter if shared is not None else topic_filter
        plan = binding_plan(inner)
        if plan is None:
            return ReasonCode.NOT_AUTHORIZED, None, False
        first = plan[0]
        connection = session.connection
        if (
            first.source != GLOBAL_SOURCE
            and connection is not None
            and not connection.access.allowed(SUBSCRIBE, first.source, first.pattern)
        ):
            return ReasonCode.NOT_AUTHORIZED, None, False  # 3.1.1: 0x80
        existing = session.subscriptions.get(topic_filter)
        if existing is not None:  # replaced: new options, same subscription [MQTT-3.8.4-3]
            existing.qos = request.qos
            existing.no_local = request.no_local
            existing.retain_as_published = request.retain_as_published
            existing.retain_handling = request.retain_handling
            existing.identifier = identifier
            if existing.group is None and existing.tag_filter is not tag_filter:
                self._set_tag_filter(session, existing, tag_filter)
            self.persist(session)
            return request.qos, existing, False
        sub = await self._add_sub(
            session,
            topic_filter,
            inner,
            plan,
            shared.group if shared is not None else None,
            request.qos,
            request.no_local,
            request.retain_as_published,
            request.retain_handling,
            identifier,
            tag_filter,
        )
        self.persist(session)
        if sub.group is not None and session.connection is not None:
            sub.group.member_online()
        return request.qos, sub, True

    async def _add_sub(
        self,
        session: Session,
        topic_filter: str,
        inner: str,
        plan: list[BindingSpec],
        share: str | None,
        qos: int,
        no_local: bool,
        retain_as_published: bool,
        retain_handling: int,
        identifier: int,
        tag_filter: TagFilter | None = None,
    ) -> Sub:
        group = (
            await self._group(session.context, share, inner, plan, tag_filter)
            if share is not None
            else None
        )
        sub = Sub(
            session,
            topic_filter,
            inner.split("/"),
            qos,
            no_local,
            retain_as_published,
            retain_handling,
            identifier,
            group,
            tag_filter,
        )
        if group is not None:
            group.members[session] = sub
            session.groups.append(group)
        else:
            if session.queue_name is not None:
                await self._bind(session.context, plan, session.queue_name)
            else:
                self._add_live(session, sub)
                # A cluster node: the route is in the cluster's table before the SUBACK.
                await self.api.live_routes_written(session.context)
            session.plain.append(sub)
            if sub.levels[0] == SYS_LEVEL:
                self.sys_subscriptions.add(sub)
            if tag_filter is not None:
                session.filtered += 1
            self._sync_queue_filter(session)
        session.subscriptions[topic_filter] = sub
        return sub

    def _set_tag_filter(self, session: Session, sub: Sub, tag_filter: TagFilter | None) -> None:
        """A plain subscription's tag filter replaced (a SUBSCRIBE to the same filter)."""
        live = session.queue_name is None
        if live:
            self._remove_live(session, sub)
        session.filtered += (tag_filter is not None) - (sub.tag_filter is not None)
        sub.tag_filter = tag_filter
        if live:
            self._add_live(session, sub)
        self._sync_queue_filter(session)

    def _add_live(self, session: Session, sub: Sub) -> None:
        self.api.subscribe_live(session.context, sub.filter, sub)
        if sub.tag_filter is not None:
            self.live_tag_filtered += 1

    def _remove_live(self, session: Session, sub: Sub) -> None:
        if self.api.unsubscribe_live(session.context, sub.filter, sub) and (
            sub.tag_filter is not None
        ):
            self.live_tag_filtered -= 1

    def _sync_queue_filter(self, session: Session) -> None:
        """A persistent session's queue skips, by the index's tag mask and without reading
        bodies, the records none of its plain subscriptions could take: when every one has a
        tag filter, the queue's filter is the union of theirs (kept in memory: rebuilt from the
        subscriptions on restart); else none. Each record read is still matched per
        subscription (``Session._on_queue_delivery``)."""
        if session.queue_name is None:
            return
        plain = session.plain
        union: TagFilter | None = None
        if plain and session.filtered == len(plain):
            union = TagFilter(tag for sub in plain if sub.tag_filter for tag in sub.tag_filter.tags)
        self.api.set_session_queue_tag_filter(session.context, session.queue_name, union)

    async def unsubscribe(
        self, session: Session, topic_filter: str, *, persist: bool = True
    ) -> bool:
        sub = session.subscriptions.pop(topic_filter, None)
        if sub is None:
            return False
        group = sub.group
        if group is not None:
            session.groups.remove(group)
            group.remove(session)
            if not group.members:
                await self._drop_group(session.context, group)
        else:
            session.plain.remove(sub)
            self.sys_subscriptions.discard(sub)
            if sub.tag_filter is not None:
                session.filtered -= 1
            self._sync_queue_filter(session)
            if session.queue_name is not None:
                inner = sub.filter
                still = {
                    spec for other in session.plain for spec in binding_plan(other.filter) or ()
                }
                for spec in binding_plan(inner) or ():
                    if spec not in still:
                        await self._unbind(session.context, spec, session.queue_name)
            else:
                self._remove_live(session, sub)
        if persist:
            self.persist(session)
        return True

    async def _bind(self, context: ClientContext, plan: list[BindingSpec], queue_name: str) -> None:
        bind = self.api.bind_session_queue
        for spec in plan:
            if await bind(context, spec.source, spec.kind, spec.pattern, queue_name) and (
                spec.source == GLOBAL_SOURCE
            ):
                self.global_bindings += 1

    async def _unbind(self, context: ClientContext, spec: BindingSpec, queue_name: str) -> None:
        if await self.api.unbind_session_queue(
            context, spec.source, spec.kind, spec.pattern, queue_name
        ) and (spec.source == GLOBAL_SOURCE):
            self.global_bindings -= 1

    async def _group(
        self,
        context: ClientContext,
        share: str,
        inner: str,
        plan: list[BindingSpec],
        tag_filter: TagFilter | None = None,
    ) -> SharedGroup:
        name = group_queue_name(share, inner)
        group = self.groups.get(name)
        if group is not None:
            return group
        # On a cluster node other nodes may read the queue too: this node is written down
        # as one with members before it declares the queue (_drop_group's check).
        await self.api.shared_group_joined(context, name)
        # The group's tag filter is set when its queue is created (durable with it).
        await self.api.declare_session_queue(context, name, tag_filter=tag_filter)
        await self._bind(context, plan, name)
        strategy = self.options.shared_subscription_strategy
        group = self.groups[name] = SharedGroup(self, name, share, inner, plan, strategy)
        return group

    async def _drop_group(self, context: ClientContext, group: SharedGroup) -> None:
        self.groups.pop(group.name, None)
        group.stop()
        if not await self.api.shared_group_left(context, group.name):
            return  # members on other nodes: the queue and its bindings stay theirs
        global_specs = sum(1 for spec in group.plan if spec.source == GLOBAL_SOURCE)
        if await self.api.discard_session_queue(context, group.name):
            self.global_bindings -= global_specs

    # -- restart ---------------------------------------------------------------------------

    async def _load(self) -> None:
        """Rebuild persistent sessions from ``__sessions`` and reconcile queues and bindings."""
        now = now_ms()
        api = self.api
        context = self.context
        for client_id, raw in api.session_states():
            try:
                await self._restore(client_id, json.loads(raw), now)
            except ShardUnavailable as error:  # its queue's shard: restored at its CONNECT
                log.warning("mqtt: session %r not restored now: %s", client_id, error)
                self.sessions.pop(client_id, None)
            except (ValueError, KeyError, TypeError):
                log.exception("mqtt: session %r cannot be restored; dropped", client_id)
                api.delete_session_state(context, client_id)
        ours = (SESSION_QUEUE_PREFIX, GROUP_QUEUE_PREFIX)
        expected_queues = {s.queue_name for s in self.sessions.values()} | set(self.groups)
        for name in api.session_queue_names(ours):
            if name not in expected_queues and not await self._saved_elsewhere(name):
                await api.discard_session_queue(context, name)
        expected: set[tuple[str, str, str, str]] = set()
        for session in self.sessions.values():
            if session.queue_name is not None:
                for sub in session.plain:
                    for spec in binding_plan(sub.filter) or ():
                        expected.add((*spec, session.queue_name))
        for group in self.groups.values():
            for spec in group.plan:
                expected.add((*spec, group.name))
        self.global_bindings = 0
        for key in api.session_queue_bindings(ours):
            source, kind, pattern, name = key
            # (On a cluster node the bindings are the whole cluster's: those of queues of
            # other nodes' shards, or of sessions saved in other shards, are not this hub's.)
            if (
                key not in expected
                and api.queue_is_local(name)
                and not await self._saved_elsewhere(name)
            ):
                await api.unbind_session_queue(context, source, kind, pattern, name)
            elif source == GLOBAL_SOURCE:
                self.global_bindings += 1
        if self.sessions:
            log.info("mqtt: %d persistent sessions restored", len(self.sessions))

    async def _saved_elsewhere(self, queue_name: str) -> bool:
        """Whether the session queue ``queue_name`` belongs to a session whose state another
        node's shard holds (a cluster: kept; ask again when that shard cannot be reached)."""
        if queue_name.startswith(GROUP_QUEUE_PREFIX):
            return await self.api.shared_group_elsewhere(self.context, queue_name)
        if not queue_name.startswith(SESSION_QUEUE_PREFIX):
            return False
        client_id = queue_name[len(SESSION_QUEUE_PREFIX) :]
        try:
            return await self.api.load_session_state(self.context, client_id) is not None
        except ShardUnavailable:
            return True

    async def _restore(self, client_id: str, data: dict[str, Any], now: int) -> None:
        expiry = int(data["expiry"])
        context = ClientContext(PROTOCOL_MQTT, connection_id="mqtt-hub", client_id=client_id)
        session = Session(self, client_id, expiry, context)
        session.queue_name = name = session_queue_name(client_id)
        # One lost with its index starts empty.
        await self.api.declare_session_queue(context, name)
        self.sessions[client_id] = session
        for entry in data["subs"]:
            topic_filter, qos, no_local, rap, handling, identifier = entry[:6]
            # A 7th element: the subscription's tag filter expression (absent: none).
            tag_filter = TagFilter.parse(entry[6]) if len(entry) > 6 and entry[6] else None
            shared = parse_shared_subscription(topic_filter)
            inner = shared.filter if shared is not None else topic_filter
            plan = binding_plan(inner)
            if plan is None:
                continue
            await self._add_sub(
                session,
                topic_filter,
                inner,
                plan,
                shared.group if shared is not None else None,
                int(qos),
                bool(no_local),
                bool(rap),
                int(handling),
                int(identifier),
                tag_filter,
            )
        session.inbound_qos2 = {int(pid) for pid in data.get("qos2", ())}
        for pid in data.get("released", ()):
            entry = Inflight(_PLACEHOLDER, 2, False, (), None)
            entry.released = True
            session.inflight[int(pid)] = entry
        gone = data.get("disconnected_ms") or now
        session.disconnected_ms = gone
        if expiry != NEVER_EXPIRES:
            left = expiry - (now - gone) / 1000
            if left <= 0:
                self.metrics["sessions_expired"] += 1
                await self.end_session(session)
                return
            self._schedule_expiry(session, left)
        if not data.get("disconnected_ms"):
            self.persist(session)  # it was connected when the broker stopped: offline since now


_PLACEHOLDER: Final = OutMessage("", b"", 2, False, "", 0, NO_PROPERTIES)


def _properties_tags(message: OutMessage) -> list[str]:
    """The tags of a message kept as MQTT properties (a retained message): its
    ``x-braid-tags`` user properties."""
    return tags_from_headers(
        [(name, value.encode()) for name, value in message.properties.user_properties]
        if message.properties is not NO_PROPERTIES
        else []
    )


def _is_utf8(payload: bytes | memoryview) -> bool:
    try:
        bytes(payload).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
