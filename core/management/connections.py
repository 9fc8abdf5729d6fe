"""The open connections of every protocol, for ``/api/connections`` and ``/api/channels``.

A gateway registers a connection once its client has logged in (AMQP Connection.Open, MQTT
CONNECT accepted; a Kafka connection at once, since every request carries its own identity) with a
:class:`ConnectionControl`: the gateway's object that describes the connection as it is now
(:class:`ConnectionDetails`, read at each listing, so a Kafka SASL login or a new AMQP channel
shows without another call) and closes it when an operator asks. It unregisters the connection
when the socket goes. Nothing here holds protocol state: the registry maps names to controls.

Names are RabbitMQ's: ``"peer_host:peer_port -> host:port"`` (the client's address, then the
listener's), unique while the connection is open since the peer's port is.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.log.store import now_ms

# The protocol names RabbitMQ shows (its MQTT plugin: "MQTT 3.1.1"; "MQTT 5.0" for 5.0).
PROTOCOL_AMQP_091 = "AMQP 0-9-1"
PROTOCOL_MQTT_311 = "MQTT 3.1.1"
PROTOCOL_MQTT_5 = "MQTT 5.0"
PROTOCOL_KAFKA_NAME = "Kafka"


@dataclass(frozen=True, slots=True)
class ChannelDetails:
    """One AMQP channel as it is now."""

    number: int
    prefetch_count: int  # basic.qos global=false (per consumer)
    global_prefetch_count: int  # basic.qos global=true (the channel)
    consumer_count: int
    messages_unacknowledged: int
    messages_unconfirmed: int
    confirm: bool
    transactional: bool
    # (queue topic, consumer tag) of each consumer, for /api/consumers' channel_details.
    consumers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class ConnectionDetails:
    """One connection as it is now (what :meth:`ConnectionControl.describe` answers)."""

    name: str
    protocol: str  # PROTOCOL_AMQP_091, PROTOCOL_MQTT_311, ...
    user: str
    vhost: str
    peer_host: str
    peer_port: int
    host: str  # the listener's address
    port: int
    client_id: str = ""  # MQTT client id, Kafka client.id, AMQP connection_name
    client_properties: Mapping[str, Any] = field(default_factory=dict)
    auth_mechanism: str = ""
    tls: bool = False
    timeout_s: int = 0  # AMQP heartbeat, MQTT keep alive
    frame_max: int = 0
    channel_max: int = 0
    recv_oct: int = 0
    send_oct: int = 0
    recv_cnt: int = 0
    send_cnt: int = 0
    channels: tuple[ChannelDetails, ...] = ()
    connected_at_ms: int = 0  # filled in by the registry


class ConnectionControl(Protocol):
    """The gateway's side of one registered connection."""

    def describe(self) -> ConnectionDetails:
        """The connection as it is now (``connected_at_ms`` is the registry's)."""
        ...

    def close_by_operator(self, reason: str) -> None:
        """Close it as the protocol does when an operator asks (AMQP Connection.Close 320
        CONNECTION_FORCED, MQTT 5.0 DISCONNECT 0x98, Kafka: the socket closed)."""
        ...


def connection_name(peer_host: str, peer_port: int, host: str, port: int) -> str:
    """RabbitMQ's connection name: ``"127.0.0.1:50412 -> 127.0.0.1:5672"``."""
    return f"{_host(peer_host)}:{peer_port} -> {_host(host)}:{port}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def split_address(address: Any) -> tuple[str, int]:
    """``(host, port)`` of a socket address (a transport's ``peername``/``sockname``)."""
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return "", 0


class ConnectionRegistry:
    """Name -> (control, when registered)."""

    def __init__(self) -> None:
        self._controls: dict[str, tuple[ConnectionControl, int]] = {}
        # Who each connection counts for, and the counts the connection limits compare
        # (core/limits/service.py): kept here so no decision has to describe every connection.
        self._owners: dict[str, tuple[str, str]] = {}
        self.by_user: dict[str, int] = {}
        self.by_vhost: dict[str, int] = {}

    def register(
        self, name: str, control: ConnectionControl, user: str = "", vhost: str = ""
    ) -> None:
        """Add ``name``, or move it to another user (a Kafka SASL login after the accept;
        it keeps its connection time)."""
        entry = self._controls.get(name)
        connected_at = now_ms() if entry is None else entry[1]
        self._uncount(name)
        self._controls[name] = (control, connected_at)
        self._owners[name] = (user, vhost)
        self.by_user[user] = self.by_user.get(user, 0) + 1
        self.by_vhost[vhost] = self.by_vhost.get(vhost, 0) + 1

    def unregister(self, name: str, control: ConnectionControl | None = None) -> None:
        """Forget ``name`` (only if it is still ``control``'s, when one is given: a name the
        kernel gave a new connection must not be dropped by the old one's late close)."""
        entry = self._controls.get(name)
        if entry is not None and (control is None or entry[0] is control):
            del self._controls[name]
            self._uncount(name)

    def _uncount(self, name: str) -> None:
        owner = self._owners.pop(name, None)
        if owner is None:
            return
        for counts, key in ((self.by_user, owner[0]), (self.by_vhost, owner[1])):
            left = counts[key] - 1
            if left:
                counts[key] = left
            else:
                del counts[key]

    def __len__(self) -> int:
        return len(self._controls)

    def describe(self, name: str) -> ConnectionDetails | None:
        entry = self._controls.get(name)
        return None if entry is None else self._details(*entry)

    def describe_all(self) -> list[ConnectionDetails]:
        return [self._details(*entry) for entry in list(self._controls.values())]

    def close(self, name: str, reason: str) -> bool:
        entry = self._controls.get(name)
        if entry is None:
            return False
        entry[0].close_by_operator(reason)
        return True

    @staticmethod
    def _details(control: ConnectionControl, connected_at_ms: int) -> ConnectionDetails:
        return dataclasses.replace(control.describe(), connected_at_ms=connected_at_ms)
