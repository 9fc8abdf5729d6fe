"""The open connections of every protocol: the Broker API's calls for the management API's
``/api/connections`` and ``/api/channels`` (issue 19; the registry is
``core/management/connections.py``).

A gateway calls :meth:`ConnectionCalls.register_connection` once a client has logged in, with
its own :class:`ConnectionControl` (describe the connection as it is now; close it for an
operator), and :meth:`ConnectionCalls.unregister_connection` when the socket goes. The management
API lists them (:class:`ConnectionDetails`, values made for the call) and closes one by name.
"""

from __future__ import annotations

import logging

from core.api.base import BrokerCalls, ClientContext
from core.management.connections import (
    ConnectionControl,
    ConnectionDetails,
    ConnectionRegistry,
)

log = logging.getLogger(__name__)


class ConnectionCalls(BrokerCalls):
    """Register, list and close client connections."""

    _connection_registry: ConnectionRegistry | None = None

    def _connections(self) -> ConnectionRegistry:
        registry = self._connection_registry
        if registry is None:
            registry = self._connection_registry = ConnectionRegistry()
        return registry

    def register_connection(
        self, context: ClientContext, name: str, control: ConnectionControl
    ) -> None:
        """A client logged in on the connection ``name`` (RabbitMQ's ``"peer -> listener"``,
        :func:`~core.management.connections.connection_name`)."""
        self._connections().register(name, control, context.user, context.vhost)

    def unregister_connection(
        self, context: ClientContext, name: str, control: ConnectionControl | None = None
    ) -> None:
        """The connection ``name`` is gone (a no-op for one never registered)."""
        self._connections().unregister(name, control)

    def list_connections(self, context: ClientContext) -> list[ConnectionDetails]:
        """Every open connection of every protocol, as each is now."""
        return self._connections().describe_all()

    def connection_details(self, context: ClientContext, name: str) -> ConnectionDetails | None:
        return self._connections().describe(name)

    def connection_count(self, context: ClientContext) -> int:
        return len(self._connections())

    def close_connection(self, context: ClientContext, name: str, reason: str) -> bool:
        """Close the connection ``name`` as its protocol does for an operator; False when
        there is none. Logged with who asked."""
        closed = self._connections().close(name, reason)
        if closed:
            log.info(
                "management: connection %r closed by %r from %s: %s",
                name,
                context.user,
                context.peer or "?",
                reason,
            )
        return closed
