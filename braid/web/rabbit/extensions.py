"""``/api/braid/...``: what has no RabbitMQ analogue, in the same style (JSON lists of objects,
RabbitMQ's error bodies, the same tags: reading needs ``monitoring``, changing needs
``administrator``).

==================================================  ==========================================
``GET /api/braid/kafka/topics``                      topics with each partition's log start and
                                                     end offsets
``GET /api/braid/kafka/groups[/{group}]``            consumer groups: state, members, and per
                                                     partition the committed offset and the lag
``GET /api/braid/mqtt/sessions``                     MQTT clients: connected ones and persistent
                                                     sessions, with their queued messages
``DELETE /api/braid/mqtt/clients/{client_id}``       disconnect an MQTT client (5.0: DISCONNECT
                                                     0x98 Administrative action)
``GET /api/braid/mqtt/retained[?filter=F]``          retained messages (MQTT filter, default #)
``DELETE /api/braid/mqtt/retained/{topic}``          delete one retained message
``GET /api/braid/transactions``                      open transactions (Kafka, AMQP tx, RocketMQ
                                                     half messages)
``GET /api/braid/delays``                            delayed records per queue: count, next due
                                                     (deadletters.py)
``GET /api/braid/dead-letters``                      dead-letter queues: where from, depth
``POST /api/braid/dead-letters/{vhost}/{q}/redrive``  move dead letters back to their queue
``GET /api/braid/records/{topic}/{partition}/{o}``   one record as each protocol sees it
                                                     (records.py; administrator)
==================================================  ==========================================
"""

from __future__ import annotations

import base64
import logging

from aiohttp import web

from braid.web.auth import REQUEST_USER
from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import Json, bad_request, json_response, not_found
from braid.web.rabbit.connections import DEFAULT_CLOSE_REASON
from braid.web.rabbit.deadletters import DeadLetterResources
from braid.web.rabbit.records import RecordResources
from core.api import (
    MULTI_LEVEL,
    ONE_LEVEL,
    PROTOCOL_MQTT_5,
    PROTOCOL_MQTT_311,
    QueueStats,
    is_system_topic,
    validate_topic_filter,
)
from core.security.model import TAG_ADMINISTRATOR, TAG_MONITORING
from gateway.mqtt.addresses import session_queue_name
from gateway.mqtt.retained import decode_retained

log = logging.getLogger(__name__)

MQTT_PROTOCOLS = (PROTOCOL_MQTT_311, PROTOCOL_MQTT_5)


def payload_json(payload: bytes) -> Json:
    """A payload as ``/api/queues/.../get`` shows one: text when it is UTF-8, else base64."""
    try:
        return {"payload": payload.decode("utf-8"), "payload_encoding": "string"}
    except UnicodeDecodeError:
        return {"payload": base64.b64encode(payload).decode(), "payload_encoding": "base64"}


class ExtensionResources(DeadLetterResources, RecordResources, ResourceBase):
    async def braid(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        path = segments[1:]
        if request.method in ("GET", "HEAD"):
            self._require(request, TAG_MONITORING)
        else:
            self._require(request, TAG_ADMINISTRATOR)
        if path == ["kafka", "topics"]:
            self._allow(request, {"GET"})
            return json_response(self.kafka_topics(request))
        if path[:2] == ["kafka", "groups"] and len(path) in (2, 3):
            self._allow(request, {"GET"})
            return self.kafka_groups(request, path[2] if len(path) == 3 else None)
        if path == ["mqtt", "sessions"]:
            self._allow(request, {"GET"})
            return json_response(self.mqtt_sessions(request))
        if path[:2] == ["mqtt", "clients"] and len(path) == 3:
            self._allow(request, {"DELETE"})
            return self.disconnect_mqtt_client(request, path[2])
        if path[:2] == ["mqtt", "retained"]:
            if len(path) == 2:
                self._allow(request, {"GET"})
                return json_response(self.retained(request))
            self._allow(request, {"DELETE"})
            # The topic name's own slashes are path separators here (or %2F).
            return self.delete_retained(request, "/".join(path[2:]))
        if path == ["delays"]:
            self._allow(request, {"GET"})
            return self.delays(request)
        if path == ["dead-letters"]:
            self._allow(request, {"GET"})
            return self.dead_letters(request)
        if path[:1] == ["dead-letters"] and len(path) == 4 and path[3] == "redrive":
            self._allow(request, {"POST"})
            return await self.redrive(request, path[1], path[2])
        if path[:1] == ["records"] and len(path) == 4:
            return self.record(request, path[1:])
        if path == ["transactions"]:
            self._allow(request, {"GET"})
            return json_response(
                [
                    {
                        "transaction_id": pending.transaction_id,
                        "producer_group": pending.producer_group,
                        "half_messages": pending.halves,
                    }
                    for pending in self.api.open_transactions()
                ]
            )
        raise not_found()

    # -- Kafka -----------------------------------------------------------------------------

    def kafka_topics(self, request: web.Request) -> list[Json]:
        context = self.context(request)
        found: list[Json] = []
        for info in self.api.list_topics(context):
            if is_system_topic(info.name):
                continue
            partitions = []
            for partition in range(info.queues):
                start, end = self.api.partition_offsets(context, info.name, partition)
                partitions.append(
                    {
                        "partition": partition,
                        "log_start_offset": start,
                        "log_end_offset": end,
                        "messages": end - start,
                    }
                )
            found.append(
                {
                    "name": info.name,
                    "partitions": partitions,
                    "messages": sum(p["messages"] for p in partitions),
                }
            )
        return sorted(found, key=lambda topic: str(topic["name"]))

    def kafka_groups(self, request: web.Request, group_id: str | None) -> web.StreamResponse:
        groups = self.api.group_lags(self.context(request), group_id)
        shown = [
            {
                "group_id": group.group_id,
                "state": group.state,
                "protocol_type": group.protocol_type,
                "members": [
                    {"member_id": member, "client_id": client, "client_host": host}
                    for member, client, host in group.members
                ],
                "lag": group.lag,
                "partitions": [
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "committed_offset": p.committed,
                        "log_start_offset": p.log_start,
                        "log_end_offset": p.log_end,
                        "lag": p.lag,
                    }
                    for p in group.partitions
                ],
            }
            for group in groups
        ]
        if group_id is None:
            return json_response(shown)
        if not shown:
            raise not_found()
        return json_response(shown[0])

    # -- MQTT ------------------------------------------------------------------------------

    def mqtt_sessions(self, request: web.Request) -> list[Json]:
        context = self.context(request)
        connected = {
            details.client_id: details
            for details in self.api.list_connections(context)
            if details.protocol in MQTT_PROTOCOLS
        }
        saved = {client_id for client_id, _state in self.api.session_states()}
        found: list[Json] = []
        for client_id in sorted(saved | set(connected)):
            details = connected.get(client_id)
            stats = self.api.queue_info(context, session_queue_name(client_id))
            stats = stats or QueueStats(0, 0, 0)
            found.append(
                {
                    "client_id": client_id,
                    "connected": details is not None,
                    "persistent": client_id in saved,
                    "connection": details.name if details is not None else None,
                    "protocol": details.protocol if details is not None else None,
                    "user": details.user if details is not None else None,
                    "messages_ready": stats.ready,
                    "messages_unacknowledged": stats.unacked,
                }
            )
        return found

    def disconnect_mqtt_client(self, request: web.Request, client_id: str) -> web.StreamResponse:
        context = self.context(request)
        names = [
            details.name
            for details in self.api.list_connections(context)
            if details.protocol in MQTT_PROTOCOLS and details.client_id == client_id
        ]
        if not names:
            raise not_found(f"no MQTT client {client_id!r} is connected")
        reason = request.headers.get("X-Reason") or DEFAULT_CLOSE_REASON
        for name in names:
            self.api.close_connection(context, name, reason)
        return web.Response(status=204)

    def retained(self, request: web.Request) -> list[Json]:
        topic_filter = request.query.get("filter", "#")
        try:
            validate_topic_filter(topic_filter)
        except ValueError as error:
            raise bad_request(f"invalid MQTT topic filter {topic_filter!r}: {error}") from None
        matching = self.api.retained_matching(self.context(request), topic_filter)
        found: list[Json] = []
        for topic, raw in sorted(matching):
            message = decode_retained(topic, raw)
            if message is None:
                continue
            payload = bytes(message.payload)
            found.append(
                {
                    "topic": topic,
                    "qos": message.qos,
                    "payload_bytes": len(payload),
                    **payload_json(payload),
                    "expires_at": message.expires_at_ms or None,
                }
            )
        return found

    def delete_retained(self, request: web.Request, topic: str) -> web.StreamResponse:
        context = self.context(request)
        if not topic or ONE_LEVEL in topic or MULTI_LEVEL in topic:
            raise bad_request(f"invalid MQTT topic name {topic!r}: one topic, no wildcards")
        if not any(name == topic for name, _raw in self.api.retained_matching(context, topic)):
            raise not_found(f"no retained message for {topic!r}")
        self.api.store_retained(context, topic, None)
        log.info("management: %s deleted the retained message of %r", request[REQUEST_USER], topic)
        return web.Response(status=204)
