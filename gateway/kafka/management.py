"""The Kafka listener's side of the management API: each client connection registered for
``/api/connections`` from the moment it is accepted (every Kafka request carries its own
identity, so there is no login step to wait for: the user after a SASL login and the
``client.id`` of the latest request header show at the next listing).

:func:`kafka_connection_opened` and :func:`kafka_connection_closed` are the listener's two
calls. An operator's close closes the socket, which is all a Kafka broker can do (the protocol
has no server-side goodbye; clients reconnect, as after a broker's ``connections.max.idle.ms``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.api import (
    PROTOCOL_KAFKA_NAME,
    BrokerAPI,
    ConnectionDetails,
    connection_name,
    split_address,
)

if TYPE_CHECKING:
    from gateway.kafka.server import KafkaConnection


class KafkaConnectionControl:
    """One Kafka client connection (:class:`~core.api.ConnectionControl`)."""

    def __init__(
        self, owner: KafkaConnection, name: str, peer: tuple[str, int], local: tuple[str, int]
    ) -> None:
        self.owner = owner
        self.name = name
        self.peer = peer
        self.local = local

    def describe(self) -> ConnectionDetails:
        connection = self.owner.connection
        client = connection.client
        login = connection.login
        return ConnectionDetails(
            name=self.name,
            protocol=PROTOCOL_KAFKA_NAME,
            user=client.user,
            vhost=client.vhost,
            peer_host=self.peer[0],
            peer_port=self.peer[1],
            host=self.local[0],
            port=self.local[1],
            client_id=connection.client_id or "",
            client_properties={},
            auth_mechanism=login.mechanism or ("SSL" if login.certificate_user else ""),
            tls=connection.tls,
            # Counted once, in gateway/transport.py's reads and writes.
            recv_oct=self.owner.recv_oct,
            send_oct=self.owner.send_oct,
            recv_cnt=self.owner.recv_cnt,
            send_cnt=self.owner.send_cnt,
        )

    def close_by_operator(self, reason: str) -> None:
        self.owner.close()


_registered: dict[KafkaConnection, KafkaConnectionControl] = {}


def kafka_connection_opened(api: BrokerAPI, owner: KafkaConnection) -> None:
    """Accepted: the connection shows in ``/api/connections``."""
    transport = owner.transport
    peer = split_address(None if transport is None else transport.get_extra_info("peername"))
    local = split_address(None if transport is None else transport.get_extra_info("sockname"))
    name = connection_name(*peer, *local)
    control = _registered[owner] = KafkaConnectionControl(owner, name, peer, local)
    api.register_connection(owner.connection.client, name, control)


def kafka_connection_closed(api: BrokerAPI, owner: KafkaConnection) -> None:
    control = _registered.pop(owner, None)
    if control is not None:
        api.unregister_connection(owner.connection.client, control.name, control)
