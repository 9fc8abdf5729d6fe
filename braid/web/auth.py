"""HTTP Basic auth against the user store, for every path but the open ones.

As RabbitMQ's management plugin: a request without valid credentials is answered 401 with
``WWW-Authenticate: Basic realm="BraidMQ"`` and ``{"error": "not_authorized", "reason": ...}``;
users of ``loopback_users`` (``guest``) only from loopback addresses; a user without a
management tag (``management``, ``policymaker``, ``monitoring``, ``administrator``) is
refused (401, "Not management user"). The login goes through the same
:meth:`~core.security.SecurityService.login_password` as every protocol: the host's slow-down,
the audit line for a failure, and the remembered argon2 check (so a script's requests do not
each cost a hash).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web

from braid.web.operations import OPEN_PATHS
from core.security import SecurityService
from core.security.model import TAG_ADMINISTRATOR, TAG_MANAGEMENT, TAG_MONITORING, TAG_POLICYMAKER

REALM: Final = "BraidMQ"
MANAGEMENT_TAGS: Final = (TAG_MANAGEMENT, TAG_POLICYMAKER, TAG_MONITORING, TAG_ADMINISTRATOR)
REQUEST_USER: Final = web.RequestKey("braid.user", str)
REQUEST_TAGS: Final = web.RequestKey("braid.tags", tuple[str, ...])

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def not_authorized(reason: str) -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text=json.dumps({"error": "not_authorized", "reason": reason}),
        content_type="application/json",
        headers={"WWW-Authenticate": f'Basic realm="{REALM}"'},
    )


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic ...`` header, or None."""
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


def peer_of(request: web.BaseRequest) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if not peer:
        return ""
    host, port = str(peer[0]), int(peer[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def basic_auth_middleware(
    security: SecurityService,
) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def basic_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.match_info.http_exception is not None:
            return await handler(request)  # open, or no such path (404) or method (405)
        credentials = parse_basic(request.headers.get("Authorization"))
        if credentials is None:
            raise not_authorized("Not authorized: credentials required")
        user, password = credentials
        result = await security.login_password("http", peer_of(request), user, password, "BASIC")
        if not result.ok:
            if result.reason == "not_authorized":
                raise not_authorized("User can only log in via localhost")
            raise not_authorized("Login failed")
        if not any(tag in MANAGEMENT_TAGS for tag in result.tags):
            raise not_authorized("Not management user")
        request[REQUEST_USER] = result.user
        request[REQUEST_TAGS] = result.tags
        return await handler(request)

    return basic_auth
