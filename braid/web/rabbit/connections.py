"""``/api/connections[/{name}]`` (GET; DELETE closes one), ``/api/connections/{name}/channels``,
``/api/channels[/{name}]`` and ``/api/vhosts/{vhost}/connections|channels``: the open
connections of all three protocols from the Broker API's registry (``core/api/connections.py``),
with RabbitMQ 3.10's shapes.

As RabbitMQ's management plugin: a user sees its own connections, ``monitoring`` and
``administrator`` see all; a connection is closed by its own user or an ``administrator``, with
the reason of the ``X-Reason`` header or ``Closed via management plugin`` (an AMQP client gets
Connection.Close 320 ``CONNECTION_FORCED - <reason>``, an MQTT 5.0 client DISCONNECT 0x98, a
Kafka client a closed socket).
"""

from __future__ import annotations

from aiohttp import web

from braid.web.auth import REQUEST_USER, not_authorized
from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import json_response, not_found
from braid.web.rabbit.shapes import channel_json, channel_name, connection_json
from core.api import ConnectionDetails
from core.security.model import TAG_ADMINISTRATOR

# RabbitMQ's reason when the request gives none (rabbit_mgmt_wm_connection:delete_resource).
DEFAULT_CLOSE_REASON = "Closed via management plugin"
CLOSE_REASON_HEADER = "X-Reason"


class ConnectionResources(ResourceBase):
    def visible_connections(
        self, request: web.Request, vhost: str | None = None
    ) -> list[ConnectionDetails]:
        """The connections the user may see (its own; every one for ``monitoring`` and
        ``administrator``), of ``vhost`` when given, by name."""
        user: str = request[REQUEST_USER]
        sees_all = self._sees_all(request)
        found = [
            details
            for details in self.api.list_connections(self.context(request))
            if (sees_all or details.user == user) and (vhost is None or details.vhost == vhost)
        ]
        return sorted(found, key=lambda d: d.name)

    async def connections(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        if len(segments) == 1:
            self._allow(request, {"GET"})
            return json_response([connection_json(d) for d in self.visible_connections(request)])
        name = segments[1]
        details = self._visible_connection(request, name)
        if len(segments) == 3 and segments[2] == "channels":
            self._allow(request, {"GET"})
            return json_response([channel_json(details, c) for c in details.channels])
        if len(segments) != 2:
            raise not_found()
        self._allow(request, {"GET", "DELETE"})
        if request.method == "DELETE":
            user: str = request[REQUEST_USER]
            if details.user != user and TAG_ADMINISTRATOR not in self._tags(request):
                raise not_authorized("Not administrator user")
            reason = request.headers.get(CLOSE_REASON_HEADER) or DEFAULT_CLOSE_REASON
            self.api.close_connection(self.context(request), name, reason)
            return web.Response(status=204)
        return json_response(connection_json(details))

    def _visible_connection(self, request: web.Request, name: str) -> ConnectionDetails:
        details = self.api.connection_details(self.context(request), name)
        user: str = request[REQUEST_USER]
        if details is None or not (self._sees_all(request) or details.user == user):
            raise not_found()
        return details

    async def channels(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        pairs = [(d, c) for d in self.visible_connections(request) for c in d.channels]
        if len(segments) == 1:
            return json_response([channel_json(d, c) for d, c in pairs])
        if len(segments) == 2:
            name = segments[1]
            for details, channel in pairs:
                if channel_name(details, channel) == name:
                    return json_response(channel_json(details, channel))
        raise not_found()

    async def vhost_connections(
        self, request: web.Request, segments: list[str]
    ) -> web.StreamResponse:
        """``/api/vhosts/{vhost}/connections`` and ``/api/vhosts/{vhost}/channels``."""
        self._allow(request, {"GET"})
        vhost = segments[1]
        self._check_vhost(request, vhost)
        listed = self.visible_connections(request, vhost)
        if segments[2] == "connections":
            return json_response([connection_json(d) for d in listed])
        return json_response([channel_json(d, c) for d in listed for c in d.channels])
