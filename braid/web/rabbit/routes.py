"""The handlers put together, and the first path segment after ``/api/`` -> its handler
(``braid/web/management.py`` dispatches to these after its own users and permissions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from aiohttp import web

from braid.web.rabbit.connections import ConnectionResources
from braid.web.rabbit.definitions import DefinitionResources
from braid.web.rabbit.exchanges import ExchangeResources
from braid.web.rabbit.extensions import ExtensionResources
from braid.web.rabbit.limits import LimitResources
from braid.web.rabbit.overview import OverviewResources
from braid.web.rabbit.queues import QueueResources


class RabbitResources(
    OverviewResources,
    ExchangeResources,
    QueueResources,
    DefinitionResources,
    ConnectionResources,
    ExtensionResources,
    LimitResources,
):
    """Every handler; :func:`rabbit_route` picks one by the path's segments."""


Handler = Callable[[RabbitResources, web.Request, list[str]], Any]


ROUTES: Final[dict[str, Handler]] = {
    "overview": RabbitResources.overview,
    "nodes": RabbitResources.nodes,
    "exchanges": RabbitResources.exchanges,
    "queues": RabbitResources.queues,
    "bindings": RabbitResources.bindings,
    "consumers": RabbitResources.consumers,
    "definitions": RabbitResources.definitions,
    "health": RabbitResources.health,
    "aliveness-test": RabbitResources.aliveness,
    "connections": RabbitResources.connections,
    "channels": RabbitResources.channels,
    "braid": RabbitResources.braid,
    "user-limits": RabbitResources.user_limits,
    "vhost-limits": RabbitResources.vhost_limits,
}
# /api/vhosts/{vhost}/<this>; the other /api/vhosts paths are braid/web/management.py's.
VHOST_ROUTES: Final[dict[str, Handler]] = {
    "connections": RabbitResources.vhost_connections,
    "channels": RabbitResources.vhost_connections,
}


def rabbit_route(segments: list[str]) -> Handler | None:
    """The handler of the path (its segments after ``/api/``), or None: not one of these."""
    if len(segments) == 3 and segments[0] == "vhosts":
        return VHOST_ROUTES.get(segments[2])
    return ROUTES.get(segments[0])
