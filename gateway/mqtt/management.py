"""The MQTT listener's side of the management API: each connected client registered for
``/api/connections`` (RabbitMQ's MQTT plugin lists its clients there too, with protocol
``MQTT 3.1.1``; ``MQTT 5.0`` for 5.0 clients).

:func:`mqtt_connection_opened` (CONNECT accepted) and :func:`mqtt_connection_closed` (the
connection ends) are the state machine's two calls. An operator's close is a DISCONNECT with
0x98 Administrative action for a 5.0 client [MQTT-3.14.2.1], the socket closed for 3.1.1
(which has no server DISCONNECT), as EMQX's ``kickout``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.api import (
    PROTOCOL_MQTT_5,
    PROTOCOL_MQTT_311,
    ConnectionDetails,
    connection_name,
    split_address,
)
from gateway.mqtt.packet_types import MQTT_5
from gateway.mqtt.reason_codes import ReasonCode

if TYPE_CHECKING:
    from gateway.mqtt.session import Connection


class MqttConnectionControl:
    """One connected MQTT client (:class:`~core.api.ConnectionControl`)."""

    def __init__(
        self, connection: Connection, name: str, peer: tuple[str, int], local: tuple[str, int]
    ) -> None:
        self.connection = connection
        self.name = name
        self.peer = peer
        self.local = local

    def describe(self) -> ConnectionDetails:
        connection = self.connection
        context = connection.context
        link = connection.link
        return ConnectionDetails(
            name=self.name,
            protocol=PROTOCOL_MQTT_5 if connection.version == MQTT_5 else PROTOCOL_MQTT_311,
            user=context.user,
            vhost=context.vhost,
            peer_host=self.peer[0],
            peer_port=self.peer[1],
            host=self.local[0],
            port=self.local[1],
            client_id=connection.client_id,
            client_properties={},
            auth_mechanism="MQTT",
            tls=connection.tls,
            timeout_s=connection.keep_alive,
            # Counted once, in gateway/transport.py's reads and writes (the link is the
            # transport: MqttProtocol, under the WebSocket framing for MQTT over WebSocket).
            recv_oct=getattr(link, "recv_oct", 0),
            send_oct=getattr(link, "send_oct", 0),
            recv_cnt=getattr(link, "recv_cnt", 0),
            send_cnt=getattr(link, "send_cnt", 0),
        )

    def close_by_operator(self, reason: str) -> None:
        self.connection.close_with(ReasonCode.ADMINISTRATIVE_ACTION, reason)


_registered: dict[Connection, MqttConnectionControl] = {}


def _transport_info(connection: Connection, key: str) -> Any:
    transport = getattr(connection.link, "transport", None)
    return None if transport is None else transport.get_extra_info(key)


def mqtt_connection_opened(connection: Connection) -> None:
    """CONNECT accepted: the client shows in ``/api/connections``."""
    peer = split_address(_transport_info(connection, "peername"))
    if peer == ("", 0):  # a transport without addresses (WebSocket relays): the context's
        host, _, port = connection.context.peer.rpartition(":")
        peer = (host.strip("[]"), int(port) if port.isdigit() else 0)
    local = split_address(_transport_info(connection, "sockname"))
    name = connection_name(*peer, *local)
    control = _registered[connection] = MqttConnectionControl(connection, name, peer, local)
    connection.hub.api.register_connection(connection.context, name, control)


def mqtt_connection_closed(connection: Connection) -> None:
    control = _registered.pop(connection, None)
    if control is not None:
        connection.hub.api.unregister_connection(connection.context, control.name, control)
