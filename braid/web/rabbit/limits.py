"""RabbitMQ's per-user and per-vhost limits over HTTP, with RabbitMQ 3.10's routes and shapes
(rabbit_mgmt_wm_user_limit(s), rabbit_mgmt_wm_limit(s)), kept by the Broker API's limits service
(``core/api/limits.py``):

- ``GET /api/user-limits[/{user}]``: ``[{"user": u, "value": {"max-connections": N}}]``;
- ``PUT /api/user-limits/{user}/{name}`` ``{"value": N}`` (``max-connections``,
  ``max-channels``), ``DELETE`` the same path;
- ``GET /api/vhost-limits[/{vhost}]``: ``[{"vhost": v, "value": {"max-queues": N}}]``;
- ``PUT /api/vhost-limits/{vhost}/{name}`` ``{"value": N}`` (``max-connections``,
  ``max-queues``), ``DELETE`` the same path.

A negative value is no limit, 0 refuses every one. Changing needs ``administrator``; reading the
vhost limits needs access to the vhost, the user limits ``monitoring`` (RabbitMQ shows them to
any management user; they name other users). A change is answered once it is durable.
"""

from __future__ import annotations

from aiohttp import web

from braid.web.rabbit.base import ResourceBase
from braid.web.rabbit.common import Json, bad_request, json_response, not_found, read_json
from core.limits import LimitError
from core.security.model import TAG_ADMINISTRATOR, TAG_MONITORING


class LimitResources(ResourceBase):
    async def user_limits(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        if len(segments) == 3:
            user = segments[1]
            if self.security.store.user(user) is None:
                raise not_found("user_not_found")
            return await self._change(request, "user", user, segments[2])
        if len(segments) > 2:
            raise not_found()
        self._allow(request, {"GET"})
        self._require(request, TAG_MONITORING)
        limits = self.api.user_limits(self.context(request))
        if len(segments) == 2:
            if self.security.store.user(segments[1]) is None:
                raise not_found()
            limits = {k: v for k, v in limits.items() if k == segments[1]}
        return json_response(
            [{"user": user, "value": value} for user, value in sorted(limits.items())]
        )

    async def vhost_limits(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        if len(segments) == 3:
            vhost = segments[1]
            if vhost not in self.security.vhosts:
                raise not_found("vhost_not_found")
            return await self._change(request, "vhost", vhost, segments[2])
        if len(segments) > 2:
            raise not_found()
        self._allow(request, {"GET"})
        visible = self.visible_vhosts(request)
        if len(segments) == 2:
            self._check_vhost(request, segments[1])
            visible = [segments[1]]
        limits = self.api.vhost_limits(self.context(request))
        return json_response(
            [
                {"vhost": vhost, "value": value}
                for vhost, value in sorted(limits.items())
                if vhost in visible
            ]
        )

    async def _change(
        self, request: web.Request, kind: str, name: str, limit: str
    ) -> web.StreamResponse:
        self._allow(request, {"PUT", "DELETE"})
        self._require(request, TAG_ADMINISTRATOR)
        context = self.context(request, name if kind == "vhost" else "/")
        api = self.api
        if request.method == "DELETE":
            if kind == "user":
                position = await api.clear_user_limit(context, name, limit)
            else:
                position = await api.clear_vhost_limit(context, name, limit)
        else:
            body: Json = await read_json(request)
            if "value" not in body:
                raise bad_request("[{key_missing,value}]")  # rabbit_mgmt_util:with_decode
            try:
                if kind == "user":
                    position = await api.set_user_limit(context, name, limit, body["value"])
                else:
                    position = await api.set_vhost_limit(context, name, limit, body["value"])
            except LimitError as error:
                raise bad_request(str(error)) from None
        await api.when_durable(position)
        return web.Response(status=204)
