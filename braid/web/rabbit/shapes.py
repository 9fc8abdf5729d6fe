"""The JSON of each object as RabbitMQ 3.10's management API shows it: queues (with the rates
between two polls), exchanges, bindings, consumers, a browsed record's properties."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from braid.web.rabbit.common import (
    EXCHANGE_TYPE_DESCRIPTIONS,
    Json,
    node_name,
    properties_key,
    rate,
)
from core.api import ChannelDetails, ConnectionDetails, QueueStats
from gateway.amqp.messages import PROPERTIES_HEADER
from gateway.amqp.properties import decode_properties


@dataclass
class QueueRates:
    """The last count seen per queue, for ``messages_details.rate`` (messages per second
    between two polls, as RabbitMQ's ``basic`` rates mode computes from its samples)."""

    samples: dict[str, tuple[float, int, int, int]] = field(default_factory=dict)

    def of(self, topic: str, stats: QueueStats) -> tuple[float, float, float]:
        now = time.monotonic()
        total = stats.ready + stats.unacked
        previous = self.samples.get(topic)
        self.samples[topic] = (now, total, stats.ready, stats.unacked)
        if previous is None or now <= previous[0]:
            return 0.0, 0.0, 0.0
        elapsed = now - previous[0]
        return (
            (total - previous[1]) / elapsed,
            (stats.ready - previous[2]) / elapsed,
            (stats.unacked - previous[3]) / elapsed,
        )


def queue_json(
    vhost: str,
    name: str,
    config: Mapping[str, Any],
    stats: QueueStats,
    rates: tuple[float, float, float],
) -> Json:
    total_rate, ready_rate, unacked_rate = rates
    return {
        "name": name,
        "vhost": vhost,
        "durable": bool(config.get("durable")),
        "auto_delete": bool(config.get("auto_delete")),
        "exclusive": bool(config.get("exclusive")),
        "arguments": dict(config.get("arguments") or {}),
        "node": node_name(),
        "type": "classic",
        "state": "running",
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
        "exclusive_consumer_tag": None,
        "single_active_consumer_tag": None,
        "consumers": stats.consumers,
        "consumer_utilisation": None,
        "messages": stats.ready + stats.unacked,
        "messages_details": rate(total_rate),
        "messages_ready": stats.ready,
        "messages_ready_details": rate(ready_rate),
        "messages_unacknowledged": stats.unacked,
        "messages_unacknowledged_details": rate(unacked_rate),
    }


def exchange_json(vhost: str, name: str, config: Mapping[str, Any]) -> Json:
    return {
        "name": name,
        "vhost": vhost,
        "type": str(config.get("type", "topic")),
        "durable": bool(config.get("durable", True)),
        "auto_delete": bool(config.get("auto_delete")),
        "internal": bool(config.get("internal")),
        "arguments": dict(config.get("arguments") or {}),
        "user_who_performed_action": "rmq-internal",
    }


def binding_json(
    vhost: str,
    source: str,
    destination: str,
    destination_type: str,
    routing_key: str,
    arguments: Mapping[str, Any],
) -> Json:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": destination_type,
        "routing_key": routing_key,
        "arguments": dict(arguments),
        "properties_key": properties_key(routing_key, arguments),
    }


def consumer_json(
    tag: str, vhost: str, queue: str, *, ack_required: bool, prefetch: int, channel: Json
) -> Json:
    return {
        "consumer_tag": tag,
        "queue": {"name": queue, "vhost": vhost},
        "ack_required": ack_required,
        "prefetch_count": prefetch,
        "exclusive": False,
        "active": True,
        "activity_status": "up",
        "arguments": {},
        "consumer_timeout": None,
        "channel_details": channel,
    }


def exchange_types_json() -> list[Json]:
    return [
        {"name": name, "description": description, "enabled": True}
        for name, description in EXCHANGE_TYPE_DESCRIPTIONS
    ]


def properties_json(headers: list[tuple[str, bytes]]) -> Json:
    """A stored AMQP record's properties as RabbitMQ's ``/get`` shows them; a record another
    protocol published has none (its headers are under ``headers``)."""
    for name, value in headers:
        if name == PROPERTIES_HEADER:
            try:
                decoded = decode_properties(value)
            except Exception:  # a record whose properties cannot be decoded is shown bare
                return {}
            return {key: jsonable(item) for key, item in dict(decoded).items() if item is not None}
    shown = {
        name: value.decode("utf-8", "replace")
        for name, value in headers
        if not name.startswith("x-braid-")
    }
    return {"headers": shown} if shown else {}


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


NO_GARBAGE_COLLECTION: Json = {
    "fullsweep_after": 0,
    "max_heap_size": 0,
    "min_bin_vheap_size": 0,
    "min_heap_size": 0,
    "minor_gcs": 0,
}


def connection_json(details: ConnectionDetails) -> Json:
    properties = jsonable(dict(details.client_properties))
    user_provided = properties.get("connection_name") if isinstance(properties, dict) else None
    shown: Json = {
        "auth_mechanism": details.auth_mechanism,
        "channel_max": details.channel_max,
        "channels": len(details.channels),
        "client_properties": properties,
        "connected_at": details.connected_at_ms,
        "frame_max": details.frame_max,
        "garbage_collection": dict(NO_GARBAGE_COLLECTION),
        "host": details.host,
        "name": details.name,
        "node": node_name(),
        "peer_cert_issuer": None,
        "peer_cert_subject": None,
        "peer_cert_validity": None,
        "peer_host": details.peer_host,
        "peer_port": details.peer_port,
        "port": details.port,
        "protocol": details.protocol,
        "recv_cnt": details.recv_cnt,
        "recv_oct": details.recv_oct,
        "recv_oct_details": rate(0.0),
        "reductions": 0,
        "reductions_details": rate(0.0),
        "send_cnt": details.send_cnt,
        "send_oct": details.send_oct,
        "send_oct_details": rate(0.0),
        "send_pend": 0,
        "ssl": details.tls,
        "ssl_cipher": None,
        "ssl_hash": None,
        "ssl_key_exchange": None,
        "ssl_protocol": None,
        "state": "running",
        "timeout": details.timeout_s,
        "type": "network",
        "user": details.user,
        "user_who_performed_action": details.user,
        "vhost": details.vhost,
    }
    if user_provided is not None:
        shown["user_provided_name"] = user_provided
    if details.client_id and not properties:  # MQTT client id, Kafka client.id
        shown["client_properties"] = {"client_id": details.client_id}
    return shown


def channel_name(details: ConnectionDetails, channel: ChannelDetails) -> str:
    """RabbitMQ's channel name: the connection's, then the number in parentheses."""
    return f"{details.name} ({channel.number})"


def channel_json(details: ConnectionDetails, channel: ChannelDetails) -> Json:
    return {
        "acks_uncommitted": 0,
        "confirm": channel.confirm,
        "connection_details": {
            "name": details.name,
            "peer_host": details.peer_host,
            "peer_port": details.peer_port,
        },
        "consumer_count": channel.consumer_count,
        "garbage_collection": dict(NO_GARBAGE_COLLECTION),
        "global_prefetch_count": channel.global_prefetch_count,
        "messages_unacknowledged": channel.messages_unacknowledged,
        "messages_uncommitted": 0,
        "messages_unconfirmed": channel.messages_unconfirmed,
        "name": channel_name(details, channel),
        "node": node_name(),
        "number": channel.number,
        "pending_raft_commands": 0,
        "prefetch_count": channel.prefetch_count,
        "reductions": 0,
        "reductions_details": rate(0.0),
        "state": "running",
        "transactional": channel.transactional,
        "user": details.user,
        "user_who_performed_action": details.user,
        "vhost": details.vhost,
    }


def consumer_channel_json(details: ConnectionDetails, channel: ChannelDetails) -> Json:
    """A consumer's ``channel_details`` (``/api/consumers``)."""
    return {
        "connection_name": details.name,
        "name": channel_name(details, channel),
        "node": node_name(),
        "number": channel.number,
        "peer_host": details.peer_host,
        "peer_port": details.peer_port,
        "user": details.user,
    }
