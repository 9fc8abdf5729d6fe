"""One MQTT client's session (``Session``): its subscriptions, the outbound QoS 1/2 window and
the messages waiting for it, delivery from live subscriptions, shared groups and the session's
ack queue. The network side (``Connection``) and the overview of both are ``session.py``.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from core.api import (
    ClientContext,
    Delivery,
    Subscription,
    now_ms,
)
from gateway.mqtt.access import DELIVER
from gateway.mqtt.addresses import filter_matches, to_log_address
from gateway.mqtt.encoder import encode_ack
from gateway.mqtt.messages import OutMessage, out_message_of
from gateway.mqtt.packet_types import PacketType
from gateway.mqtt.packets import (
    Will,
)
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.subscriptions import (
    NO_IDS,
    Inflight,
    Queued,
    Sub,
    combine,
    record_tags,
)

if TYPE_CHECKING:
    from gateway.mqtt.hub import MqttHub
    from gateway.mqtt.session import Connection
    from gateway.mqtt.shared import SharedGroup


# The same logger as the connection's: a session's lines read as they did.
log = logging.getLogger("gateway.mqtt.session")

MAX_PACKET_ID: Final = 0xFFFF
# Records an ack-queue consumer holds in memory at most (its prefetch): the client's Receive
# Maximum caps QoS 1/2 in flight, this caps what is read ahead of a slow or paused socket.
CONSUMER_PREFETCH: Final = 1000

# ---------------------------------------------------------------------------------------------
# Session
# ---------------------------------------------------------------------------------------------


class Session:
    def __init__(
        self, hub: MqttHub, client_id: str, expiry_interval: int, context: ClientContext
    ) -> None:
        self.hub = hub
        self.client_id = client_id
        # Who acts for the session: its last connection's context (its client id in any case).
        self.context = context
        self.expiry_interval = expiry_interval  # seconds; NEVER_EXPIRES
        self.persistent = expiry_interval > 0  # has an ack queue (fixed at creation)
        self.queue_name: str | None = None
        self.subscriptions: dict[str, Sub] = {}
        self.plain: list[Sub] = []  # non-shared subscriptions, for matching queue deliveries
        self.filtered = 0  # plain subscriptions with a tag filter
        self.consumers: dict[str, Subscription] = {}  # queue name -> our consumer
        self.groups: list[SharedGroup] = []  # the $share groups it is a member of
        self.connection: Connection | None = None
        self.inflight: dict[int, Inflight] = {}
        self.pending: deque[Queued] = deque()
        self._next_id = 0
        # Packet identifiers of ack-queue records in flight, kept across a reconnect so a
        # redelivery uses its original identifier [MQTT-4.4.0-1].
        self.redelivery_ids: dict[tuple[str, int], int] = {}
        self.inbound_qos2: set[int] = set()  # PUBLISH QoS 2 received, PUBREL not yet
        self.held_acks: list[Delivery] = []  # QoS 0 records written while the socket is full
        self.expiry_timer: Any = None
        self.will_timer: Any = None
        self.pending_will: Will | None = None
        self.disconnected_ms: int | None = None
        self.ended = False
        # On a cluster node: the gen of its last connection here, still registered while the
        # session lives here offline (released when it ends here).
        self.cluster_gen = 0

    def __repr__(self) -> str:
        state = "connected" if self.connection is not None else "offline"
        return f"Session({self.client_id!r}, {state}, persistent={self.persistent})"

    # -- connection ------------------------------------------------------------------------

    def attach(self, connection: Connection, present: bool) -> None:
        """A connection took this session (after its CONNACK was written)."""
        self.connection = connection
        self.context = connection.context
        self.disconnected_ms = None
        if present:
            # [MQTT-4.4.0-1]: unacknowledged PUBLISH (DUP) and PUBREL again, same identifiers.
            for packet_id, entry in self.inflight.items():
                if entry.released:
                    connection.write(
                        encode_ack(PacketType.PUBREL, packet_id, 0, connection.version)
                    )
                else:
                    connection.send_publish(
                        entry.message,
                        entry.qos,
                        packet_id,
                        entry.retain,
                        entry.subscription_ids,
                        True,
                    )
        self.start_consumers()
        self.drain()

    def start_consumers(self) -> None:
        connection = self.connection
        if connection is None:
            return
        prefetch = min(connection.send_quota, CONSUMER_PREFETCH)
        name = self.queue_name
        if name is not None and name not in self.consumers:
            consumer = self.hub.api.consume_session_queue(
                self.context, name, prefetch, self._on_queue_delivery, self._queue_cancelled
            )
            if consumer is not None:
                self.consumers[name] = consumer
        for group in self.groups:
            group.member_online()

    def _queue_cancelled(self, reason: str) -> None:
        """The owner of the session queue's shard (another node) ended our consumer, or it
        could not be attached: the client reconnects to get it again (0x80; 3.1.1: closed)."""
        connection = self.connection
        name = self.queue_name
        if name is not None:
            self.consumers.pop(name, None)
        if connection is not None:
            log.warning("mqtt %r: session queue consumer ended: %s", self.client_id, reason)
            connection.close_with(ReasonCode.UNSPECIFIED_ERROR, "session queue unavailable")

    def stop_consumer(self, queue_name: str) -> None:
        consumer = self.consumers.pop(queue_name, None)
        if consumer is not None:
            consumer.detach()  # in-flight records go back to the queue

    def detach(self) -> None:
        """The connection is gone: ack-queue records in flight go back to their queues (they
        come again, DUP, on the next connection; a shared group's, to another member); live
        messages are forgotten."""
        connection = self.connection
        self.connection = None
        held, self.held_acks = self.held_acks, []
        for delivery in held:  # QoS 0 records written to the socket: at most once
            delivery.ack()
        for name in list(self.consumers):
            self.stop_consumer(name)
        own = self.queue_name
        for packet_id, entry in list(self.inflight.items()):
            in_flight = entry.delivery
            if in_flight is not None and not entry.released:
                del self.inflight[packet_id]
                if in_flight.queue.topic != own:  # a group's: its consumer stays attached
                    self._forget_id(in_flight)
                    in_flight.nack()
        for *_, waiting in self.pending:
            if waiting is not None and waiting.queue.topic != own:
                waiting.nack()
        self.pending.clear()
        for group in self.groups:
            group.member_offline(self)
        if connection is not None:
            self.disconnected_ms = now_ms()

    # -- delivery --------------------------------------------------------------------------

    def _on_queue_delivery(self, delivery: Delivery) -> None:
        """A record from this session's own ack queue: match it against the plain subscriptions
        (bindings may match more than the filter does: see addresses.py)."""
        record = delivery.message
        message = out_message_of(record)
        topic = message.topic
        origin = message.origin
        matched = [
            sub
            for sub in self.plain
            if filter_matches(sub.levels, topic)
            and not (sub.no_local and origin == self.client_id)
            and (not sub.per_record or self.may_read(topic))
        ]
        if matched and self.filtered:
            # Only the subscriptions whose tag filter takes the record match it (the queue's
            # own filter, the union of them, already skipped most others by the index mask).
            tags = record_tags(record)
            matched = [sub for sub in matched if sub.takes(tags)]
        if not matched:
            delivery.ack()
            return
        qos, retain, ids = combine(message, matched)
        self.offer(message, qos, retain, ids, delivery)

    def on_group_delivery(self, sub: Sub, delivery: Delivery, message: OutMessage) -> None:
        """A record of a shared group this session is a member of (``shared.py`` chose it)."""
        if not filter_matches(sub.levels, message.topic) or (
            sub.per_record and not self.may_read(message.topic)
        ):
            delivery.ack()
            return
        qos = sub.qos if sub.qos < message.qos else message.qos
        retain = message.retain and sub.retain_as_published
        ids = (sub.identifier,) if sub.identifier else NO_IDS
        self.offer(message, qos, retain, ids, delivery)

    def may_read(self, topic: str) -> bool:
        """Whether the connected user may receive a record of MQTT ``topic`` through a filter
        whose first level is a wildcard (``mqtt deliver``: checked per record, cached)."""
        connection = self.connection
        if connection is None:
            return False
        address = to_log_address(topic)
        return address is not None and connection.access.allowed(
            DELIVER, address.topic, address.subject
        )

    def offer(
        self,
        message: OutMessage,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        delivery: Delivery | None,
    ) -> bool:
        """Send now, or queue behind the window; False if dropped (queue full, offline)."""
        connection = self.connection
        if connection is None:
            return False
        if connection.writing_paused:
            # Over the outgoing bound: a live message is dropped (a clean session keeps nothing
            # for a client that does not read); an ack-queue record waits here unsent, and the
            # queue's pump stops at its prefetch, so the rest stays in the log.
            if delivery is None:
                connection.metrics["messages_dropped"] += 1
                return False
            self.pending.append((message, qos, retain, subscription_ids, delivery))
            return True
        if self.pending or (qos and len(self.inflight) >= connection.send_quota):
            if delivery is None and len(self.pending) >= self.hub.options.max_queued_messages:
                connection.metrics["messages_dropped"] += 1
                return False
            self.pending.append((message, qos, retain, subscription_ids, delivery))
            return True
        self._send(connection, message, qos, retain, subscription_ids, delivery)
        return True

    def _send(
        self,
        connection: Connection,
        message: OutMessage,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...],
        delivery: Delivery | None,
    ) -> None:
        if message.expires_at_ms and message.expired(now_ms()):
            connection.metrics["messages_expired"] += 1
            if delivery is not None:
                delivery.ack()
            return
        if not qos:
            connection.send_publish(message, 0, None, retain, subscription_ids, False)
            if delivery is not None:
                if connection.writing_paused:
                    self.held_acks.append(delivery)  # stops the queue's pump at its prefetch
                else:
                    delivery.ack()
            return
        packet_id = self._packet_id(delivery)
        dup = delivery is not None and delivery.redelivered
        if not connection.send_publish(message, qos, packet_id, retain, subscription_ids, dup):
            # Larger than the client's Maximum Packet Size: discarded, as if delivered
            # [MQTT-3.1.2-25].
            if delivery is not None:
                self._forget_id(delivery)
                delivery.ack()
            return
        self.inflight[packet_id] = Inflight(message, qos, retain, subscription_ids, delivery)

    def _packet_id(self, delivery: Delivery | None) -> int:
        inflight = self.inflight
        if delivery is not None:
            key = (delivery.queue.topic, delivery.offset)
            known = self.redelivery_ids.get(key)
            if known is not None and known not in inflight:
                return known
        packet_id = self._next_id
        for _ in range(MAX_PACKET_ID):
            packet_id = packet_id % MAX_PACKET_ID + 1
            if packet_id not in inflight:
                break
        else:  # cannot happen: the window is at most 65,535
            raise RuntimeError("no free packet identifier")
        self._next_id = packet_id
        if delivery is not None:
            self.redelivery_ids[(delivery.queue.topic, delivery.offset)] = packet_id
        return packet_id

    def _forget_id(self, delivery: Delivery) -> None:
        self.redelivery_ids.pop((delivery.queue.topic, delivery.offset), None)

    def drain(self) -> None:
        """Send what waits in ``pending`` while the window has room."""
        connection = self.connection
        pending = self.pending
        while pending and connection is not None and not connection.writing_paused:
            message, qos, retain, ids, delivery = pending[0]
            if qos and len(self.inflight) >= connection.send_quota:
                break
            pending.popleft()
            self._send(connection, message, qos, retain, ids, delivery)
        for group in self.groups:  # room again: the groups' waiting records [shared.py]
            if group.backlog:
                group.refill()

    def _settle(self, entry: Inflight) -> None:
        delivery = entry.delivery
        if delivery is not None:
            entry.delivery = None
            self._forget_id(delivery)
            delivery.ack()

    def on_puback(self, packet_id: int) -> None:
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 1:
            return  # unknown identifier: nothing to do (Mosquitto ignores it too)
        del self.inflight[packet_id]
        self._settle(entry)
        self.drain()

    def on_pubrec(self, packet_id: int, reason_code: int) -> bool:
        """False if the identifier is unknown (PUBREL then carries 0x92)."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            return False
        self._settle(entry)
        if reason_code >= ReasonCode.UNSPECIFIED_ERROR:
            del self.inflight[packet_id]  # refused by the client: done [MQTT-4.3.3-?]
            self.drain()
            return True
        entry.released = True
        return True

    def on_pubcomp(self, packet_id: int) -> None:
        entry = self.inflight.get(packet_id)
        if entry is not None and entry.released:
            del self.inflight[packet_id]
            self.drain()

    # -- back-pressure ---------------------------------------------------------------------

    def on_writable(self) -> None:
        """The outgoing buffer drained below its low mark: what waited goes out."""
        held, self.held_acks = self.held_acks, []
        for delivery in held:
            delivery.ack()
        self.drain()  # refills the groups too

    # -- state -----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "expiry": self.expiry_interval,
            "subs": [sub.to_json() for sub in self.subscriptions.values()],
            "qos2": sorted(self.inbound_qos2),
            "released": sorted(pid for pid, entry in self.inflight.items() if entry.released),
            "disconnected_ms": self.disconnected_ms,
        }
