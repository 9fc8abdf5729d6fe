"""Inbound QoS 1/2 flow of one connection: the PUBACK / PUBREC / PUBCOMP a client is owed, written
once what they acknowledge is durable, and the server's Receive Maximum, which bounds how many
of the client's QoS 1/2 PUBLISHes may be unacknowledged at once (MQTT 5.0 §4.9 Flow Control).

What counts against the Receive Maximum (the client's send quota, seen from our side): a QoS 1
PUBLISH until its PUBACK is written; a QoS 2 PUBLISH until the exchange is complete, that is
until the PUBCOMP answering its PUBREL goes out (or until its PUBREC, when that carries an error
code) [MQTT-3.3.4-7, 3.3.4-8]. One more is a Protocol Error: DISCONNECT 0x93 (Receive Maximum
exceeded) [MQTT-3.3.4-9]; a 3.1.1 client, which has no such packet, is disconnected the same
way (Mosquitto's test ``03-publish-qos2-max-inflight-exceeded`` checks both).

The count is per network connection, as the quota is [MQTT-4.9.0-1]: a QoS 2 exchange begun on
an earlier connection of the session (its PUBREL still to come) does not count, unless the
client sends its PUBLISH again on this one. We count a unit free the moment we write (or queue)
the acknowledgement, before the client reads it, so our count is never above the client's own:
a client that keeps to the quota is never disconnected.

Acknowledgements wait for durability in the order they were queued: one wait per log topic for
the last record of a read (durability is in log order), then every acknowledgement of that read
in one write.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from core.api import ShardUnavailable
from gateway.mqtt.encoder import encode_ack
from gateway.mqtt.errors import MqttProtocolError
from gateway.mqtt.packet_types import MQTT_5, PacketType
from gateway.mqtt.packets import Publish
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.mqtt.client_session import Session
    from gateway.mqtt.session import Connection

log = logging.getLogger(__name__)

# (reason code, end position to wait durable for, log topic): what a publish's outcome says.
Outcome = tuple[int, int, str]
# A queued acknowledgement: (end position to wait for (0: none), log topic, packet bytes,
# units of the Receive Maximum it gives back once written).
QueuedAck = tuple[int, str, bytes, int]


class InboundFlow:
    """The acknowledgements one connection owes its client and its Receive Maximum count."""

    __slots__ = ("acks", "connection", "in_flight", "limit", "qos2_ids", "waiting")

    def __init__(self, connection: Connection, limit: int) -> None:
        self.connection = connection
        self.limit = limit  # the server's Receive Maximum
        self.acks: deque[QueuedAck] = deque()
        self.waiting = False  # a durability wait is under way (the rest queue behind it)
        # QoS 1/2 PUBLISHes of this connection not acknowledged yet (see the module docstring).
        self.in_flight = 0
        # QoS 2 identifiers counted in ``in_flight`` until their PUBCOMP.
        self.qos2_ids: set[int] = set()

    def exceeded(self) -> MqttProtocolError:
        return MqttProtocolError(
            ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
            f"more than Receive Maximum ({self.limit}) QoS 1/2 publishes unacknowledged "
            "[MQTT-3.3.4-9]",
        )

    def duplicate(self, packet_id: int) -> None:
        """A QoS 2 PUBLISH already received (its PUBREC was lost): PUBREC again, not stored
        twice [MQTT-4.3.3-10]. Sent again on a new connection, it counts on this one."""
        if packet_id not in self.qos2_ids:
            if self.in_flight >= self.limit:
                raise self.exceeded()
            self.qos2_ids.add(packet_id)
            self.in_flight += 1
        version = self.connection.version
        self.acks.append((0, "", encode_ack(PacketType.PUBREC, packet_id, 0, version), 0))

    def acknowledge(self, packet: Publish, outcome: Outcome) -> None:
        """Queue the PUBACK / PUBREC of a stored QoS 1/2 publish."""
        code, end, log_topic = outcome
        packet_id = packet.packet_id
        assert packet_id is not None
        version = self.connection.version
        self.in_flight += 1
        if packet.qos == 1:
            data = encode_ack(PacketType.PUBACK, packet_id, code, version)
            self.acks.append((end, log_topic, data, 1))
            return
        data = encode_ack(PacketType.PUBREC, packet_id, code, version)
        if code < ReasonCode.UNSPECIFIED_ERROR:
            session = self.connection.session
            assert session is not None
            session.inbound_qos2.add(packet_id)
            self.qos2_ids.add(packet_id)
            self.acks.append((end, log_topic, data, 0))
        else:  # refused: the exchange ends with this PUBREC [MQTT-4.3.3-?]
            self.acks.append((end, log_topic, data, 1))

    def released(self, packet_id: int, known: bool) -> None:
        """PUBREL came: PUBCOMP, after any acknowledgement still waiting [MQTT-4.3.3-11]."""
        code = 0 if known else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
        connection = self.connection
        data = encode_ack(PacketType.PUBCOMP, packet_id, code, connection.version)
        frees = 0
        if packet_id in self.qos2_ids:
            self.qos2_ids.discard(packet_id)
            frees = 1
        if self.acks:
            self.acks.append((0, "", data, frees))
        else:
            self.in_flight -= frees
            connection.write(data)

    def flush(self) -> None:
        """Write the queued acknowledgements once what they acknowledge is durable (one wait per
        topic for the last record of the batch: durability is in log order), each publish whose
        forward to another node failed refused (``BrokerAPI.failed_marks``)."""
        acks = self.acks
        last_end: dict[str, int] = {}
        for end, log_topic, _, _ in acks:
            if end:
                last_end[log_topic] = end
        waits: list[Awaitable[None]] = []
        connection = self.connection
        api = connection.hub.api
        for log_topic, end in last_end.items():
            if not api.is_durable(end, log_topic):
                waits.append(api.when_durable(end, log_topic))
        if not waits:
            self._settle(len(acks), None)
            return
        self.waiting = True
        connection.hub.spawn(self._when_durable(waits, len(acks)))

    async def _when_durable(self, waits: list[Awaitable[None]], count: int) -> None:
        connection = self.connection
        unavailable: ShardUnavailable | None = None
        try:
            for wait in waits:
                try:
                    await wait
                except ShardUnavailable as error:  # the last publish's forward failed
                    unavailable = error
        except Exception:
            log.exception("mqtt %s: durability wait failed", connection.client_id)
            connection.close_with(ReasonCode.UNSPECIFIED_ERROR, "storage error")
            return
        finally:
            self.waiting = False
        if connection.closed:
            self.acks.clear()
            return
        self._settle(count, unavailable)
        if self.acks and not connection.closed:
            self.flush()

    def _settle(self, count: int, unavailable: ShardUnavailable | None) -> None:
        """Write the first ``count`` queued acknowledgements, durable now: as they are, except
        those of publishes not stored (a forward to another node's shard failed: the wait for
        the batch's last mark does not say so for the earlier ones), refused with 0x80; all
        of them when a wait failed and no mark is named. 3.1.1 has no such code: the
        connection is closed at the first, so that the client sends it again."""
        acks = self.acks
        connection = self.connection
        failed = connection.hub.api.failed_marks(
            {end for end, _, _, _ in (acks[i] for i in range(count)) if end}
        )
        refuse_all = unavailable is not None and not failed
        if failed or refuse_all:
            log.warning(
                "mqtt %s: %s publishes not stored, refused: %s",
                connection.client_id,
                "all" if refuse_all else len(failed),
                unavailable or next(iter(failed.values())),
            )
        write = connection.link.write
        version = connection.version
        session = connection.session
        freed = 0
        for _ in range(count):
            end, _, data, frees = acks.popleft()
            if refuse_all or (end and end in failed):
                if version != MQTT_5:
                    self.in_flight -= freed
                    acks.clear()
                    connection.close_with(ReasonCode.UNSPECIFIED_ERROR, "storage unavailable")
                    return
                data, frees = self._refusal(data, frees, session)
            freed += frees
            write(data)
        self.in_flight -= freed

    def _refusal(self, data: bytes, frees: int, session: Session | None) -> tuple[bytes, int]:
        """An acknowledgement as a refusal (0x80), and the units it frees: a refused PUBREC
        ends its QoS 2 exchange; a PUBCOMP stays as it is."""
        kind = data[0] >> 4
        packet_id = int.from_bytes(data[2:4], "big")  # acks are short: 1-byte length
        version = self.connection.version
        if kind == PacketType.PUBACK:
            return encode_ack(
                PacketType.PUBACK, packet_id, ReasonCode.UNSPECIFIED_ERROR, version
            ), frees
        if kind == PacketType.PUBREC and packet_id in self.qos2_ids:
            self.qos2_ids.discard(packet_id)
            if session is not None:
                session.inbound_qos2.discard(packet_id)
            return encode_ack(
                PacketType.PUBREC, packet_id, ReasonCode.UNSPECIFIED_ERROR, version
            ), 1
        return data, frees
