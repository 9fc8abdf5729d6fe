"""Users and permissions over HTTP, the RabbitMQ way, so ``rabbitmqadmin`` and scripts written
for RabbitMQ's management API work unchanged:

====================================================  =========================================
``GET /api/whoami``                                    the authenticated user and its tags
``GET /api/users``                                     every user (name, hash, algorithm, tags)
``GET|PUT|DELETE /api/users/{name}``                   one user; PUT ``{"password": ...}`` or
                                                       ``{"password_hash": ..., "hashing_algorithm":
                                                       ...}``, and ``"tags"``
``GET /api/users/{name}/permissions``                  its vhost permissions
``GET /api/users/{name}/topic-permissions``            its topic permissions
``GET /api/permissions``                               every vhost permission
``GET|PUT|DELETE /api/permissions/{vhost}/{user}``     one; PUT ``{"configure", "write", "read"}``
``GET /api/topic-permissions``                         every topic permission
``GET|PUT|DELETE /api/topic-permissions/{vhost}/{user}``  PUT ``{"exchange", "write", "read"}``;
                                                       DELETE clears the user's in that vhost
``GET /api/vhosts``, ``GET /api/vhosts/{vhost}``       the configured vhosts
====================================================  =========================================

Everything but ``/api/whoami`` needs the ``administrator`` tag (RabbitMQ: 401 "Not
administrator user"). Path segments are percent-decoded one by one from the raw path, so the
vhost ``/`` is ``%2F`` as RabbitMQ's clients send it. Answers: 200 with JSON, 201 created, 204
changed or deleted, 400 ``{"error": "bad_request", "reason": ...}``, 404 ``{"error": "Object
Not Found", "reason": "Not Found"}``, 405 for another method.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web

from braid.web.auth import REQUEST_TAGS, REQUEST_USER, not_authorized
from braid.web.rabbit import ManagementSources, RabbitResources, rabbit_route
from core.security import SecurityError, SecurityService
from core.security.model import TAG_ADMINISTRATOR, TopicPermission, User, VhostPermission
from core.security.passwords import NO_PASSWORD_HASH, RABBIT_SHA256, PasswordHash, PasswordHashError

API_PREFIX: Final = "/api/"
# RabbitMQ's default hashing algorithm for a password_hash given without one.
DEFAULT_IMPORTED_ALGORITHM: Final = RABBIT_SHA256

Route = Callable[[web.Request, list[str]], Awaitable[web.StreamResponse]]


def _json(payload: object, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, headers={"Cache-Control": "no-store"})


def not_found() -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text=json.dumps({"error": "Object Not Found", "reason": "Not Found"}),
        content_type="application/json",
    )


def bad_request(reason: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": "bad_request", "reason": reason}),
        content_type="application/json",
    )


def _path_segments(request: web.Request) -> list[str]:
    """The percent-decoded segments after ``/api/`` (``%2F`` stays inside its segment)."""
    raw = request.raw_path.split("?", 1)[0]
    rest = raw[len(API_PREFIX) :]
    return [unquote(part) for part in rest.split("/")] if rest else []


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise bad_request("the body is not JSON") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise bad_request(f"{key} is missing or not a string")
    return value


def user_json(user: User) -> dict[str, object]:
    return {
        "name": user.name,
        "password_hash": user.password.value,
        "hashing_algorithm": user.password.algorithm,
        "tags": list(user.tags),
        "limits": {},
    }


def permission_json(vhost: str, user: str, permission: VhostPermission) -> dict[str, object]:
    return {"user": user, "vhost": vhost, **permission.to_json()}


def topic_permission_json(vhost: str, user: str, permission: TopicPermission) -> dict[str, object]:
    return {"user": user, "vhost": vhost, **permission.to_json()}


class ManagementAPI:
    def __init__(self, security: SecurityService, sources: ManagementSources | None = None) -> None:
        self.security = security
        self.store = security.store
        # The broker's own resources (queues, exchanges, ...: braid/web/rabbit/); without
        # the Broker API (a test app), only users and permissions are served.
        self.resources = None if sources is None else RabbitResources(security, sources)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        segments = _path_segments(request)
        if not segments:
            raise not_found()
        if segments == ["whoami"]:
            self._allow(request, {"GET"})
            user: str = request[REQUEST_USER]
            tags: tuple[str, ...] = request[REQUEST_TAGS]
            return _json({"name": user, "tags": list(tags)})
        if self.resources is not None:
            resource = rabbit_route(segments)
            if resource is not None:
                # Each resource checks the tags it needs (management, monitoring, administrator).
                response: web.StreamResponse = await resource(self.resources, request, segments)
                return response
        if TAG_ADMINISTRATOR not in request[REQUEST_TAGS]:
            raise not_authorized("Not administrator user")
        route = _ROUTES.get((segments[0], len(segments)))
        if route is None and segments[0] == "users" and len(segments) == 3:
            route = _ROUTES.get(("users/" + segments[2], 3))
        if route is None:
            raise not_found()
        try:
            return await route(self, request, segments)
        except SecurityError as error:
            if error.status == 404:
                raise not_found() from None
            raise bad_request(str(error)) from None

    @staticmethod
    def _allow(request: web.Request, methods: set[str]) -> None:
        if request.method == "HEAD" and "GET" in methods:
            return
        if request.method not in methods:
            raise web.HTTPMethodNotAllowed(request.method, sorted(methods))

    # -- users -----------------------------------------------------------------------------

    async def users(self, request: web.Request, _segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        return _json([user_json(user) for user in self.store.users()])

    async def user(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        name = segments[1]
        if request.method in ("GET", "HEAD"):
            user = self.store.user(name)
            if user is None:
                raise not_found()
            return _json(user_json(user))
        if request.method == "DELETE":
            if not await self.security.delete_user(name):
                raise not_found()
            return web.Response(status=204)
        body = await _body(request)
        tags = body.get("tags", "")
        if not isinstance(tags, str | list):
            raise bad_request("tags must be a comma-separated string or a list")
        password = body.get("password")
        if "password" in body:
            if not isinstance(password, str):
                raise bad_request("password must be a string")
            created = await self.security.put_user(name, password=password, tags=tags)
        elif "password_hash" in body:
            created = await self.security.put_user(
                name, password_hash=self._imported_hash(body), tags=tags
            )
        else:
            raise bad_request("Must specify a password or a password_hash")
        return web.Response(status=201 if created else 204)

    @staticmethod
    def _imported_hash(body: dict[str, Any]) -> PasswordHash:
        value = _text(body, "password_hash")
        if not value:
            return NO_PASSWORD_HASH
        algorithm = body.get("hashing_algorithm", DEFAULT_IMPORTED_ALGORITHM)
        if not isinstance(algorithm, str):
            raise bad_request("hashing_algorithm must be a string")
        try:
            return PasswordHash(algorithm, value)
        except PasswordHashError as error:
            raise bad_request(str(error)) from None

    async def user_permissions(
        self, request: web.Request, segments: list[str]
    ) -> web.StreamResponse:
        self._allow(request, {"GET"})
        name = segments[1]
        if self.store.user(name) is None:
            raise not_found()
        return _json(
            [
                permission_json(vhost, user, permission)
                for vhost, user, permission in self.store.permissions()
                if user == name
            ]
        )

    async def user_topic_permissions(
        self, request: web.Request, segments: list[str]
    ) -> web.StreamResponse:
        self._allow(request, {"GET"})
        name = segments[1]
        if self.store.user(name) is None:
            raise not_found()
        return _json(
            [
                topic_permission_json(vhost, user, permission)
                for vhost, user, permission in self.store.topic_permissions()
                if user == name
            ]
        )

    # -- vhost permissions -----------------------------------------------------------------

    async def permissions(self, request: web.Request, _segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        return _json(
            [
                permission_json(vhost, user, permission)
                for vhost, user, permission in self.store.permissions()
            ]
        )

    async def permission(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        vhost, name = segments[1], segments[2]
        if request.method in ("GET", "HEAD"):
            permission = self.store.permission(vhost, name)
            if permission is None:
                raise not_found()
            return _json(permission_json(vhost, name, permission))
        if request.method == "DELETE":
            if not await self.security.clear_permission(vhost, name):
                raise not_found()
            return web.Response(status=204)
        body = await _body(request)
        permission = VhostPermission(
            _text(body, "configure"), _text(body, "write"), _text(body, "read")
        )
        created = self.store.permission(vhost, name) is None
        await self.security.set_permission(vhost, name, permission)
        return web.Response(status=201 if created else 204)

    # -- topic permissions -----------------------------------------------------------------

    async def topic_permissions(
        self, request: web.Request, _segments: list[str]
    ) -> web.StreamResponse:
        self._allow(request, {"GET"})
        return _json(
            [
                topic_permission_json(vhost, user, permission)
                for vhost, user, permission in self.store.topic_permissions()
            ]
        )

    async def topic_permission(
        self, request: web.Request, segments: list[str]
    ) -> web.StreamResponse:
        self._allow(request, {"GET", "PUT", "DELETE"})
        vhost, name = segments[1], segments[2]
        if request.method in ("GET", "HEAD"):
            found = self.store.topic_permissions_of(vhost, name)
            if not found:
                raise not_found()
            return _json(
                [
                    topic_permission_json(vhost, name, permission)
                    for _exchange, permission in sorted(found.items())
                ]
            )
        if request.method == "DELETE":
            exchange = request.query.get("exchange")
            if not await self.security.clear_topic_permissions(vhost, name, exchange):
                raise not_found()
            return web.Response(status=204)
        body = await _body(request)
        permission = TopicPermission(
            _text(body, "exchange"), _text(body, "write"), _text(body, "read")
        )
        created = permission.exchange not in self.store.topic_permissions_of(vhost, name)
        await self.security.set_topic_permission(vhost, name, permission)
        return web.Response(status=201 if created else 204)

    # -- vhosts ----------------------------------------------------------------------------

    async def vhosts(self, request: web.Request, _segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        return _json([{"name": vhost} for vhost in self.security.vhosts])

    async def vhost(self, request: web.Request, segments: list[str]) -> web.StreamResponse:
        self._allow(request, {"GET"})
        if segments[1] not in self.security.vhosts:
            raise not_found()
        return _json({"name": segments[1]})


_ROUTES: Final[
    dict[
        tuple[str, int],
        Callable[[ManagementAPI, web.Request, list[str]], Awaitable[web.StreamResponse]],
    ]
] = {
    ("users", 1): ManagementAPI.users,
    ("users", 2): ManagementAPI.user,
    ("users/permissions", 3): ManagementAPI.user_permissions,
    ("users/topic-permissions", 3): ManagementAPI.user_topic_permissions,
    ("permissions", 1): ManagementAPI.permissions,
    ("permissions", 3): ManagementAPI.permission,
    ("topic-permissions", 1): ManagementAPI.topic_permissions,
    ("topic-permissions", 3): ManagementAPI.topic_permission,
    ("vhosts", 1): ManagementAPI.vhosts,
    ("vhosts", 2): ManagementAPI.vhost,
}


def add_management_routes(
    app: web.Application, security: SecurityService, sources: ManagementSources | None = None
) -> None:
    api = ManagementAPI(security, sources)
    app.router.add_route("*", "/api/{tail:.*}", api.dispatch)
