"""What every resource module of the RabbitMQ management API uses: the version it answers as,
the error answers (RabbitMQ's ``{"error": ..., "reason": ...}``), topic names <-> (vhost, name)
(docs/amqp.md), reading a JSON body, and :class:`ManagementSources`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from aiohttp import web

from braid.web.auth import not_authorized
from core.api import (
    INTERNAL_CONTEXT,
    REFUSED_ACCESS,
    REFUSED_NOT_FOUND,
    REFUSED_UNAVAILABLE,
    BrokerAPI,
    ManagementRefusal,
)
from gateway.amqp.vhost import VHOST_TOPIC_PREFIX

# What the management API reports itself as (rabbitmqadmin and the Terraform provider read
# the version; 3.10.x is the release whose shapes these are).
RABBIT_COMPAT_VERSION: Final = "3.10.0"
PRODUCT_NAME: Final = "BraidMQ"
DEFAULT_EXCHANGE_ALIAS: Final = "amq.default"  # the default exchange's name in URLs
ALIVENESS_QUEUE: Final = "aliveness-test"
# Slot names of braid serve's listeners -> RabbitMQ's protocol names in /api/overview.
LISTENER_PROTOCOLS: Final = {
    "amqp": "amqp",
    "amqps": "amqp/ssl",
    "mqtt": "mqtt",
    "mqtts": "mqtt/ssl",
    "mqtt-ws": "http/web-mqtt",
    "mqtt-wss": "https/web-mqtt",
    "kafka": "kafka",
    "kafka-tls": "kafka/ssl",
    "http": "http",
    "https": "https",
}
EXCHANGE_TYPE_DESCRIPTIONS: Final = (
    ("direct", "AMQP direct exchange, as per the AMQP specification"),
    ("fanout", "AMQP fanout exchange, as per the AMQP specification"),
    ("headers", "AMQP headers exchange, as per the AMQP specification"),
    ("topic", "AMQP topic exchange, as per the AMQP specification"),
    ("x-delayed-message", "Delayed Message Exchange."),
)
GET_ACKMODES: Final = {
    "ack_requeue_true": True,
    "reject_requeue_true": True,
    "ack_requeue_false": False,
    "reject_requeue_false": False,
}

Json = dict[str, Any]


def json_response(payload: object, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, headers={"Cache-Control": "no-store"})


def not_found(reason: str = "Not Found") -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text=json.dumps({"error": "Object Not Found", "reason": reason}),
        content_type="application/json",
    )


def bad_request(reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": "bad_request", "reason": reason}),
        content_type="application/json",
    )


def unavailable(reason: str) -> web.HTTPServiceUnavailable:
    return web.HTTPServiceUnavailable(
        text=json.dumps({"error": "service_unavailable", "reason": reason}),
        content_type="application/json",
    )


def node_name() -> str:
    return f"braid@{socket.gethostname()}"


def rate(value: float) -> Json:
    return {"rate": round(value, 1)}


def vhost_of_topic(topic: str) -> tuple[str, str]:
    """``(vhost, name in that vhost)`` of a topic (docs/amqp.md's names)."""
    if topic.startswith(VHOST_TOPIC_PREFIX):
        vhost, _, rest = topic[len(VHOST_TOPIC_PREFIX) :].partition(".")
        return vhost, rest
    return "/", topic


def topic_of(vhost: str, name: str) -> str:
    return name if vhost == "/" else f"{VHOST_TOPIC_PREFIX}{vhost}.{name}"


def properties_key(routing_key: str, arguments: Mapping[str, Any]) -> str:
    """RabbitMQ's ``properties_key`` of a binding: ``~`` for an empty key without arguments,
    the escaped routing key, or the key and a hash of the arguments."""
    if not arguments:
        return quote(routing_key, safe="") if routing_key else "~"
    digest = hashlib.sha256(json.dumps(arguments, sort_keys=True).encode()).digest()
    tail = base64.urlsafe_b64encode(digest[:8]).decode().rstrip("=")
    return f"{quote(routing_key, safe='')}~{tail}"


def refusal_response(refusal: ManagementRefusal) -> web.HTTPException:
    """A refused operator action as RabbitMQ's management API answers it (a 406 of the AMQP
    side is a 400 with the same text)."""
    if refusal.kind == REFUSED_NOT_FOUND:
        return not_found(refusal.text)
    if refusal.kind == REFUSED_UNAVAILABLE:
        return unavailable(refusal.text)
    if refusal.kind == REFUSED_ACCESS:
        return not_authorized(refusal.text)
    return bad_request(refusal.text)


@dataclass(frozen=True)
class ManagementSources:
    """What the management API reads besides the user store: the Broker API and the started
    listeners (by slot name, filled in as ``braid serve`` starts them: their addresses for
    ``/api/overview`` and the health checks)."""

    api: BrokerAPI
    listeners: Mapping[str, Any]
    started_monotonic: float = field(default_factory=time.monotonic)

    def connection_count(self) -> int:
        """Open client connections of every protocol (those the gateways registered)."""
        return self.api.connection_count(INTERNAL_CONTEXT)


async def read_json(request: web.Request) -> Json:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("the body is not JSON") from None
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def integer(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def braid_version() -> str:
    try:
        from importlib.metadata import version

        return version("braidmq")
    except Exception:  # not installed as a package (a checkout)
        return "0.0.0"
