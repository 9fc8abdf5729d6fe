"""``/api/queues[/{vhost}[/{name}]]`` (GET, PUT, DELETE), ``.../contents`` (purge),
``.../get`` (browse), ``.../bindings``, and ``/api/consumers[/{vhost}]``."""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from braid.web.auth import REQUEST_USER
from braid.web.rabbit.base import QUEUE_OWNERS, ResourceBase
from braid.web.rabbit.common import (
    GET_ACKMODES,
    Json,
    bad_request,
    integer,
    json_response,
    not_found,
    read_json,
    topic_of,
    unavailable,
    vhost_of_topic,
)
from braid.web.rabbit.shapes import consumer_json, properties_json
from core.api import BrowsedMessage, ClientContext, QueueStats, ShardUnavailable
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX

log = logging.getLogger(__name__)
T = TypeVar("T")


class QueueResources(ResourceBase):
    async def queues(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            return json_response(self.queues_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            return json_response(self.queues_of(context, [vhost]))
        name = segments[2]
        if len(segments) == 3:
            return await self._queue(request, vhost, name)
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + name)
        if await self._stats(context, topic) is None:
            raise not_found()
        if segments[3:] == ["contents"]:
            self._allow(request, {"DELETE"})
            purged = await self._on_owner(self.api.purge_queue(self.context(request, vhost), topic))
            log.info(
                "management: %s purged %s records of queue %r in vhost %r",
                request[REQUEST_USER],
                purged,
                name,
                vhost,
            )
            return web.Response(status=204)
        if segments[3:] == ["get"]:
            self._allow(request, {"POST"})
            return await self._get(request, vhost, name, topic)
        if segments[3:] == ["bindings"]:
            self._allow(request, {"GET"})
            return json_response(
                [
                    b
                    for b in self.bindings_of(context, [vhost])
                    if b["destination"] == name and b["destination_type"] == "queue"
                ]
            )
        raise not_found()

    async def _stats(self, context: ClientContext, topic: str) -> QueueStats | None:
        """The queue's counts, from its owner in a cluster (None: no such queue)."""
        return await self._on_owner(self.api.queue_stats(context, topic))

    async def _browse(
        self, request: web.Request, context: ClientContext, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage]:
        """A browse of ``topic``: on a cluster by the queue's owner, in one call (its records
        are settled there before the answer, so a next browse through any node sees them)."""
        owners = request.config_dict.get(QUEUE_OWNERS)
        if owners is not None:
            taken = await owners.browse_on_owner(topic, count, requeue=requeue)
            if taken is not None:
                return taken
        return await self.api.browse_queue(context, topic, count, requeue=requeue) or []

    @staticmethod
    async def _on_owner(call: Awaitable[T]) -> T:
        """``call``'s answer; 503 when the queue's owner (another cluster node) does not
        answer, as RabbitMQ answers for a queue whose node is down."""
        try:
            return await call
        except ShardUnavailable as error:
            log.warning("management: the owner of a queue did not answer: %s", error)
            raise unavailable(str(error)) from None

    async def _queue(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        context = self.context(request, vhost)
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + name)
        if request.method in ("GET", "HEAD"):
            for queue in self.queues_of(context, [vhost]):
                if queue["name"] == name:
                    return json_response(queue)
            raise not_found()
        if request.method == "DELETE":
            if_unused = request.query.get("if-unused") == "true"
            if_empty = request.query.get("if-empty") == "true"
            deleted = await self.managed_change(
                self.api.manage_delete_queue(context, name, if_unused=if_unused, if_empty=if_empty)
            )
            if not deleted:
                raise not_found()
            self.rates.samples.pop(topic, None)
            return web.Response(status=204)
        body = await read_json(request)
        arguments = body.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise bad_request("arguments must be an object")
        created = await self.managed_change(
            self.api.manage_declare_queue(
                context,
                name,
                durable=bool(body.get("durable", True)),
                auto_delete=bool(body.get("auto_delete", False)),
                arguments=arguments,
            )
        )
        return web.Response(status=201 if created else 204)

    async def _get(
        self, request: web.Request, vhost: str, name: str, topic: str
    ) -> web.StreamResponse:
        body = await read_json(request)
        # rabbitmqadmin sends numbers as strings ("count": "1"); RabbitMQ takes both.
        count = integer(body.get("count", 1))
        if count is None or count < 1:
            raise bad_request("count must be a positive integer")
        if "ackmode" in body:
            if body["ackmode"] not in GET_ACKMODES:
                raise bad_request(f"ackmode must be one of {', '.join(GET_ACKMODES)}")
            requeue = GET_ACKMODES[body["ackmode"]]
        else:  # rabbitmqadmin v1 and RabbitMQ before 3.7 send "requeue"
            requeue = bool(body.get("requeue", True))
        encoding = body.get("encoding", "auto")
        truncate = integer(body.get("truncate"))
        context = self.context(request, vhost)
        before = (await self._stats(context, topic) or QueueStats(0, 0, 0)).ready
        browsed = await self._on_owner(
            self._browse(request, context, topic, count, requeue=requeue)
        )
        answers: list[Json] = []
        for index, message in enumerate(browsed):
            payload = message.body
            if truncate is not None and truncate >= 0:
                payload = payload[:truncate]
            text: str | None = None
            if encoding != "base64":
                try:
                    text = payload.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            exchange = vhost_of_topic(message.topic)[1]
            if exchange.startswith(QUEUE_TOPIC_PREFIX):
                exchange = ""
            answers.append(
                {
                    "payload_bytes": len(message.body),
                    "redelivered": message.redelivered,
                    "exchange": exchange,
                    "routing_key": message.subject,
                    # What was still ready behind this one when it was taken.
                    "message_count": max(before - index - 1, 0),
                    "properties": properties_json(message.headers),
                    "payload": text if text is not None else base64.b64encode(payload).decode(),
                    "payload_encoding": "string" if text is not None else "base64",
                }
            )
        return json_response(answers)

    async def consumers(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        context = self.context(request)
        if len(segments) == 2:
            self._check_vhost(request, segments[1])
            vhosts = [segments[1]]
        else:
            vhosts = self.visible_vhosts(request)
        return json_response(self.consumers_of(context, vhosts))

    def consumers_of(self, context: ClientContext, vhosts: list[str]) -> list[Json]:
        """The consumers of the queues of ``vhosts`` this node's queues hold, each with the
        ``channel_details`` of its channel when the channel is this node's."""
        queues = self._queue_names(context)
        channels = self.consumer_channels(context)
        found: list[Json] = []
        for consumer in self.api.all_consumers(context):
            owner = queues.get(consumer.queue_topic)
            if owner is None or owner[0] not in vhosts:
                continue
            found.append(
                consumer_json(
                    consumer.tag,
                    owner[0],
                    owner[1],
                    ack_required=consumer.ack_required,
                    prefetch=consumer.prefetch,
                    channel=channels.get((consumer.queue_topic, consumer.tag), {}),
                )
            )
        return found
