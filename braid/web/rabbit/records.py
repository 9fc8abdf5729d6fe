"""``GET /api/braid/records/{topic}/{partition}/{offset}``: one stored record as each protocol
sees it (docs/mapping.md applied to it).

The views are built by each gateway's own mapping code, the functions its consumers deliver
with (``braid serve`` assembles all three gateways, so this process layer may use them; the
core does not): AMQP's :func:`~gateway.amqp.messages.delivery_properties` and
:func:`~gateway.amqp.consumer.delivered_address`, MQTT's
:func:`~gateway.mqtt.messages.out_message_of`, and for Kafka the rule of
``gateway/kafka/fetch.py``'s ``_plain_batch`` (a record without a key shows its subject as the
key) or, for a record of a stored RecordBatch, that record's own fields. So a change to a
gateway's mapping shows here at once.

Reading a record shows its body, of any vhost and topic: it needs the ``administrator`` tag.
"""

from __future__ import annotations

import base64
import math
from typing import Final

from aiohttp import web

from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import Json, bad_request, json_response, not_found, vhost_of_topic
from core.api import (
    PROTOCOL_AMQP,
    PROTOCOL_INTERNAL,
    PROTOCOL_KAFKA,
    PROTOCOL_MQTT,
    Message,
    StoredRecord,
    now_ms,
)
from core.security.model import TAG_ADMINISTRATOR
from gateway.amqp.consumer import delivered_address
from gateway.amqp.messages import delivery_properties, jsonable
from gateway.amqp.properties import decode_properties
from gateway.amqp.vhost import exchange_name, queue_name
from gateway.mqtt.messages import out_message_of

PROTOCOL_NAMES: Final = {
    PROTOCOL_INTERNAL: "internal",
    PROTOCOL_KAFKA: "kafka",
    PROTOCOL_AMQP: "amqp",
    PROTOCOL_MQTT: "mqtt",
}
_MS: Final = 1000


def bytes_json(value: bytes | None) -> Json | None:
    """Bytes as text when they are UTF-8, else base64 (``encoding`` says which)."""
    if value is None:
        return None
    try:
        return {"value": value.decode("utf-8"), "encoding": "string"}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(value).decode(), "encoding": "base64"}


def _exchange_of(topic: str) -> str:
    return exchange_name(vhost_of_topic(topic)[1])


def _queue_of(topic: str) -> str:
    return queue_name(vhost_of_topic(topic)[1])


def amqp_view(message: Message) -> Json:
    """What a basic.deliver / basic.get of this record carries (gateway/amqp/consumer.py)."""
    topic, routing_key = delivered_address(message)
    raw = delivery_properties(
        message.headers, message.protocol == PROTOCOL_AMQP, _exchange_of, _queue_of
    )
    properties = dict(decode_properties(raw))
    headers = properties.pop("headers", None)
    return {
        "vhost": vhost_of_topic(topic)[0],
        "exchange": _exchange_of(topic),
        "routing_key": routing_key,
        "properties": jsonable(properties),
        "headers": jsonable(headers or {}),
        "payload_bytes": len(message.body or b""),
    }


def mqtt_view(message: Message) -> Json:
    """What an MQTT subscriber of the record's topic is sent (gateway/mqtt/messages.py); a
    3.1.1 client gets the topic, QoS and payload only."""
    out = out_message_of(message)
    props = out.properties
    expiry = None
    if out.expires_at_ms:
        expiry = max(1, math.ceil((out.expires_at_ms - now_ms()) / _MS))
    return {
        "topic": out.topic,
        "qos": out.qos,
        "retain": out.retain,
        "payload_bytes": len(out.payload),
        "properties": {
            "payload_format_indicator": props.payload_format_indicator,
            "message_expiry_interval": expiry,
            "content_type": props.content_type,
            "response_topic": props.response_topic,
            "correlation_data": bytes_json(props.correlation_data),
            "user_properties": [[name, value] for name, value in props.user_properties],
        },
    }


def kafka_view(message: Message, topic: str, partition: int) -> Json:
    """What a Kafka consumer of ``topic``/``partition`` fetches at this offset
    (gateway/kafka/fetch.py): a Kafka record as produced; another protocol's record with its
    subject as key when it has no key, every header, its publish time as timestamp."""
    key = message.key
    if message.protocol != PROTOCOL_KAFKA and not key and message.subject:
        key = message.subject.encode()
    return {
        "topic": topic,
        "partition": partition,
        "offset": message.offset,
        "timestamp": message.born_ms or message.store_ms,
        "key": bytes_json(key),
        "value": bytes_json(message.body),
        "headers": [{"key": name, "value": bytes_json(value)} for name, value in message.headers],
    }


def record_json(stored: StoredRecord, topic: str, partition: int) -> Json:
    message = stored.message
    return {
        "topic": topic,
        "partition": partition,
        "offset": message.offset,
        "stored": {
            "published_to": message.topic,
            "subject": message.subject,
            "key": bytes_json(message.key),
            "headers": [{"name": n, "value": bytes_json(v)} for n, v in message.headers],
            "tags": message.tags,
            "protocol": PROTOCOL_NAMES.get(message.protocol, str(message.protocol)),
            "client": message.client,
            "address": message.address,
            "born_ms": message.born_ms,
            "store_ms": message.store_ms,
            "position": message.position,
            "batch_records": stored.batch_records,
            "body": bytes_json(message.body),
        },
        "amqp": amqp_view(message),
        "mqtt": mqtt_view(message),
        "kafka": kafka_view(message, topic, partition),
    }


class RecordResources(ResourceBase):
    def record(self, request: web.Request, path: list[str]) -> web.StreamResponse:
        """``path``: ``[topic, partition, offset]``."""
        self._require(request, TAG_ADMINISTRATOR)
        self._allow(request, {"GET"})
        topic, partition_text, offset_text = path
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            raise bad_request("partition and offset are integers") from None
        stored = self.api.stored_record(self.context(request), topic, partition, offset)
        if stored is None:
            raise not_found(f"no record at {topic}/{partition}/{offset}")
        return json_response(record_json(stored, topic, partition))
