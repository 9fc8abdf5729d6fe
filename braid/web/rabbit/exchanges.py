"""Exchanges and bindings: ``/api/exchanges[/{vhost}[/{name}]]`` (GET, PUT, DELETE),
``.../publish``, ``.../bindings/source|destination``; ``/api/bindings[/{vhost}]`` and
``/api/bindings/{vhost}/e/{src}/{q|e}/{dst}[/{props}]``."""

from __future__ import annotations

import base64
from urllib.parse import quote

from aiohttp import web

from braid.web.auth import peer_of
from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import (
    DEFAULT_EXCHANGE_ALIAS,
    bad_request,
    json_response,
    not_found,
    properties_key,
    read_json,
)
from core.api import TopicError
from gateway.amqp.errors import AmqpError
from gateway.amqp.messages import publish_info
from gateway.amqp.properties import encode_properties


class ExchangeResources(ResourceBase):
    async def exchanges(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            return json_response(self.exchanges_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            return json_response(self.exchanges_of(context, [vhost]))
        name = "" if segments[2] == DEFAULT_EXCHANGE_ALIAS else segments[2]
        if len(segments) == 3:
            return await self._exchange(request, vhost, name)
        if len(segments) == 4 and segments[3] == "publish" and request.method == "POST":
            return await self._publish(request, vhost, name)
        if (
            len(segments) == 5
            and segments[3] == "bindings"
            and segments[4]
            in (
                "source",
                "destination",
            )
        ):
            self._allow(request, {"GET"})
            key = segments[4]
            kind_ok = (
                (lambda b: True)
                if key == "source"
                else (lambda b: b["destination_type"] == "exchange")
            )
            return json_response(
                [b for b in self.bindings_of(context, [vhost]) if b[key] == name and kind_ok(b)]
            )
        raise not_found()

    async def _exchange(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        context = self.context(request, vhost)
        if request.method in ("GET", "HEAD"):
            for exchange in self.exchanges_of(context, [vhost]):
                if exchange["name"] == name:
                    return json_response(exchange)
            raise not_found()
        if request.method == "DELETE":
            if_unused = request.query.get("if-unused") == "true"
            deleted = await self.managed_change(
                self.api.manage_delete_exchange(context, name, if_unused=if_unused)
            )
            if not deleted:
                raise not_found()
            return web.Response(status=204)
        body = await read_json(request)
        ex_type = body.get("type", "direct")
        arguments = body.get("arguments") or {}
        if not isinstance(ex_type, str) or not isinstance(arguments, dict):
            raise bad_request("type must be a string and arguments an object")
        created = await self.managed_change(
            self.api.manage_declare_exchange(
                context,
                name,
                ex_type,
                durable=bool(body.get("durable", True)),
                auto_delete=bool(body.get("auto_delete", False)),
                internal=bool(body.get("internal", False)),
                arguments=arguments,
            )
        )
        return web.Response(status=201 if created else 204)

    async def _publish(self, request: web.Request, vhost: str, name: str) -> web.StreamResponse:
        context = self.context(request, vhost)
        body = await read_json(request)
        routing_key = body.get("routing_key", "")
        payload = body.get("payload", "")
        encoding = body.get("payload_encoding", "string")
        properties = body.get("properties") or {}
        if not isinstance(routing_key, str) or not isinstance(payload, str):
            raise bad_request("routing_key and payload must be strings")
        if not isinstance(properties, dict):
            raise bad_request("properties must be an object")
        if encoding == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except ValueError:
                raise bad_request("payload is not base64") from None
        elif encoding == "string":
            data = payload.encode()
        else:
            raise bad_request(f"payload_encoding must be string or base64, not {encoding!r}")
        try:
            info = publish_info(encode_properties(properties))
        except (AmqpError, TypeError, ValueError, KeyError) as error:
            raise bad_request(f"invalid properties: {error}") from None
        topic = self.managed(lambda: self.api.manage_publish_topic(context, name, routing_key))
        if topic is None:
            return json_response({"routed": False})
        try:
            publication = self.api.publish(
                context,
                topic,
                data,
                subject=routing_key,
                headers=info.headers,
                routing_headers=info.table,
                address=peer_of(request),
                create_topic=False,
            )
            outcome = await publication
        except TopicError as error:
            raise bad_request(str(error)) from None
        routed = any(self.api.has_ack_queue(d) for d in outcome.delivered_to)
        return json_response({"routed": routed})

    # -- bindings --------------------------------------------------------------------------

    async def bindings(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        context = self.context(request)
        if len(segments) == 1:
            self._allow(request, {"GET"})
            return json_response(self.bindings_of(context, self.visible_vhosts(request)))
        vhost = segments[1]
        self._check_vhost(request, vhost)
        if len(segments) == 2:
            self._allow(request, {"GET"})
            return json_response(self.bindings_of(context, [vhost]))
        if len(segments) not in (6, 7) or segments[2] != "e" or segments[4] not in ("q", "e"):
            raise not_found()
        source, destination = segments[3], segments[5]
        destination_type = "queue" if segments[4] == "q" else "exchange"
        matching = [
            b
            for b in self.bindings_of(context, [vhost], with_default=False)
            if b["source"] == source
            and b["destination"] == destination
            and b["destination_type"] == destination_type
        ]
        amqp_context = self.context(request, vhost)
        if len(segments) == 6:
            self._allow(request, {"GET", "POST"})
            if request.method in ("GET", "HEAD"):
                return json_response(matching)
            body = await read_json(request)
            routing_key = body.get("routing_key", "")
            arguments = body.get("arguments") or {}
            if not isinstance(routing_key, str) or not isinstance(arguments, dict):
                raise bad_request("routing_key must be a string and arguments an object")
            await self._bind(
                amqp_context,
                source,
                destination_type,
                destination,
                routing_key,
                arguments,
                unbind=False,
            )
            location = (
                f"/api/bindings/{quote(vhost, safe='')}/e/{quote(source, safe='')}/"
                f"{segments[4]}/{quote(destination, safe='')}/"
                f"{properties_key(routing_key, arguments)}"
            )
            return web.Response(status=201, headers={"Location": location})
        self._allow(request, {"GET", "DELETE"})
        props = segments[6]
        found = [b for b in matching if b["properties_key"] in (props, quote(props, safe=""))]
        if not found:
            raise not_found()
        if request.method in ("GET", "HEAD"):
            return json_response(found[0])
        binding = found[0]
        await self._bind(
            amqp_context,
            source,
            destination_type,
            destination,
            binding["routing_key"],
            binding["arguments"],
            unbind=True,
        )
        return web.Response(status=204)
