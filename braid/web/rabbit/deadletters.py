"""``/api/braid/delays`` and ``/api/braid/dead-letters``: delayed records waiting for their time,
the dead-letter queues, and moving dead letters back to their queue.

``GET /api/braid/delays`` lists per queue (a topic's partition, an AMQP queue) the delayed
records that will become visible there (AMQP ``x-delayed-message`` exchanges, MQTT
``$delayed/...``, Kafka ``x-delay`` headers, delayed retries): how many and the next due time.

``GET /api/braid/dead-letters`` lists the queues dead letters reach, with the queues that
dead-letter into them and their depth. ``POST /api/braid/dead-letters/{vhost}/{queue}/redrive``
(optional JSON body ``{"count": N}``) moves up to N ready dead letters back to the queue each
died in, once each even across a crash (``core/deadletter/redrive.py`` says how).
"""

from __future__ import annotations

import logging

from aiohttp import web

from braid.web.auth import REQUEST_USER
from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import (
    Json,
    bad_request,
    integer,
    json_response,
    not_found,
    read_json,
    topic_of,
    vhost_of_topic,
)
from core.security.model import TAG_ADMINISTRATOR
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX, queue_name

log = logging.getLogger(__name__)


def queue_names(topic: str) -> Json:
    """``vhost`` and ``queue`` of an AMQP queue's topic; None for others (a partition)."""
    vhost, rest = vhost_of_topic(topic)
    if not rest.startswith(QUEUE_TOPIC_PREFIX):
        return {"vhost": None, "queue": None}
    return {"vhost": vhost, "queue": queue_name(rest)}


class DeadLetterResources(ResourceBase):
    def delays(self, request: web.Request) -> web.StreamResponse:
        context = self.context(request)
        found = [
            {
                "topic": delayed.topic,
                "partition": delayed.queue,
                **queue_names(delayed.topic),
                "messages": delayed.messages,
                "next_due_ms": delayed.next_due_ms,
            }
            for delayed in self.api.pending_delays(context)
        ]
        return json_response(found)

    def dead_letters(self, request: web.Request) -> web.StreamResponse:
        found: list[Json] = []
        for queue in self.api.dead_letter_queues(self.context(request)):
            found.append(
                {
                    "topic": queue.topic,
                    **queue_names(queue.topic),
                    "dead_letter_exchanges": [vhost_of_topic(t)[1] for t in queue.exchanges],
                    "dead_lettered_from": [queue_names(t)["queue"] or t for t in queue.sources],
                    "messages": queue.ready + queue.unacked,
                    "messages_ready": queue.ready,
                    "messages_unacknowledged": queue.unacked,
                    "consumers": queue.consumers,
                }
            )
        return json_response(found)

    async def redrive(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        self._require(request, TAG_ADMINISTRATOR)
        self._check_vhost(request, vhost)
        body = await read_json(request)
        count = integer(body.get("count")) if "count" in body else None
        if "count" in body and (count is None or count < 1):
            raise bad_request("count must be a positive integer")
        topic = topic_of(vhost, QUEUE_TOPIC_PREFIX + name)
        result = self.api.redrive_dead_letters(
            self.context(request, vhost),
            topic,
            count,
            lambda origin: queue_name(vhost_of_topic(origin)[1]),
        )
        if result is None:
            raise not_found(f"no queue '{name}' in vhost '{vhost}'")
        log.info(
            "management: %s moved %d dead letter(s) of %r in vhost %r back",
            request[REQUEST_USER],
            result.moved_total,
            name,
            vhost,
        )
        return json_response(
            {
                "moved": result.moved_total,
                "to": [
                    {**queue_names(origin), "topic": origin, "messages": moved}
                    for origin, moved in sorted(result.moved.items())
                ],
                "left": [{"offset": offset, "reason": why} for offset, why in result.left],
            }
        )
