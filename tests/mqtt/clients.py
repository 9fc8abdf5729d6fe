"""Test clients for the MQTT end-to-end tests: a thin synchronous wrapper around paho-mqtt (the
real client most devices resemble) and a raw-socket client on our own codec, for what paho
cannot do (send broken bytes, receive topic aliases, watch reason codes on the wire)."""

from __future__ import annotations

import queue
import socket
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from gateway.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Properties,
    Will,
    encode,
)

TIMEOUT = 10.0
HOST = "127.0.0.1"


def assert_clean_log(process: Any) -> None:
    """No tracebacks in a ``braid serve``'s stderr (a handler that raised is a bug)."""
    log = process.stderr()
    assert "Traceback" not in log, log[-4000:]


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def paho_properties(packet_type: int, **values: Any) -> PahoProperties:
    props = PahoProperties(packet_type)
    for name, value in values.items():
        setattr(props, name, value)
    return props


class Paho:
    """A paho-mqtt client run by its own network thread, with blocking helpers."""

    def __init__(
        self,
        port: int,
        *,
        client_id: str | None = None,
        version: int = 5,
        clean: bool = True,
        transport: str = "tcp",
        will: tuple[str, bytes, int, bool] | None = None,
        will_properties: PahoProperties | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.port = port
        self.version = version
        self.clean = clean
        self.client_id = unique("paho-") if client_id is None else client_id
        protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False,
            **kwargs,
        )
        if transport == "websockets":
            self.client.ws_set_options(path="/mqtt")
        if will is not None:
            topic, payload, qos, retain = will
            self.client.will_set(topic, payload, qos, retain, properties=will_properties)
        if username is not None:
            self.client.username_pw_set(username, password)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: tuple[Any, bool, Any] | None = None
        self.disconnect_reason: Any = None
        self.subacks: queue.Queue[Any] = queue.Queue()
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self.connack = (reason_code, bool(flags.session_present), properties)
        self.connected.set()

    def _on_message(self, _c: Any, _u: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put(message)

    def _on_disconnect(self, _c: Any, _u: Any, _f: Any, reason_code: Any, _p: Any) -> None:
        self.disconnect_reason = reason_code
        self.disconnected.set()

    def _on_subscribe(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        self.subacks.put(codes)

    def _on_unsubscribe(self, _c: Any, _u: Any, mid: int, codes: Any, _p: Any) -> None:
        self.subacks.put(codes)

    def connect(
        self,
        keepalive: int = 60,
        properties: PahoProperties | None = None,
        expiry: int | None = None,
    ) -> tuple[Any, bool, Any]:
        if self.version == 5:
            if expiry is not None:
                properties = properties or PahoProperties(PacketTypes.CONNECT)
                properties.SessionExpiryInterval = expiry
            self.client.connect(
                HOST, self.port, keepalive, clean_start=self.clean, properties=properties
            )
        else:
            self.client.connect(HOST, self.port, keepalive)
        self.client.loop_start()
        assert self.connected.wait(TIMEOUT), "no CONNACK"
        assert self.connack is not None
        return self.connack

    def subscribe(self, topic: str, qos: int = 1, **options: Any) -> Any:
        if self.version == 5 and (options or qos is not None):
            sub_options = mqtt.SubscribeOptions(
                qos=qos,
                noLocal=options.pop("no_local", False),
                retainAsPublished=options.pop("retain_as_published", False),
                retainHandling=options.pop("retain_handling", 0),
            )
            properties = options.pop("properties", None)
            self.client.subscribe(topic, options=sub_options, properties=properties)
        else:
            self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def unsubscribe(self, topic: str) -> Any:
        self.client.unsubscribe(topic)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        properties: PahoProperties | None = None,
    ) -> mqtt.MQTTMessageInfo:
        info = self.client.publish(topic, payload, qos, retain, properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"publish to {topic} not acknowledged"
        return info

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def get_all(self, count: int, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        return [
            self.messages.get(timeout=max(0.01, deadline - time.monotonic())) for _ in range(count)
        ]

    def nothing(self, wait: float = 0.5) -> None:
        try:
            message = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")

    def drop(self) -> None:
        """Close the socket without DISCONNECT (an abnormal disconnection: the Will fires)."""
        self.client.loop_stop()
        sock = self.client.socket()
        if sock is not None:
            sock.close()

    def close(self) -> None:
        if self.client.is_connected():
            self.client.disconnect()
            self.disconnected.wait(TIMEOUT)
        self.client.loop_stop()

    def __enter__(self) -> Paho:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RawClient:
    """A blocking MQTT client over a plain socket, on our codec."""

    def __init__(self, port: int, version: int = 5, timeout: float = TIMEOUT) -> None:
        self.version = version
        self.sock = socket.create_connection((HOST, port), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = MqttDecoder(version, max_packet_size=1 << 28)
        self.pending: list[Packet] = []
        self.eof = False

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.version))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(
        self,
        client_id: str = "",
        *,
        clean: bool = True,
        keep_alive: int = 60,
        properties: Properties | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
    ) -> Connack:
        self.send(
            Connect(
                client_id,
                self.version,
                clean,
                keep_alive,
                username,
                password,
                will,
                properties or Properties(),
            )
        )
        packet = self.recv()
        assert isinstance(packet, Connack), packet
        return packet

    def recv(self, timeout: float = TIMEOUT) -> Packet:
        """The next packet; AssertionError if the connection closes first."""
        packet = self.recv_or_close(timeout)
        assert packet is not None, "connection closed"
        return packet

    def recv_or_close(self, timeout: float = TIMEOUT) -> Packet | None:
        """The next packet, or None once the server closed the connection."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.eof:
                return None
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                continue
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def closed_after(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Read until the server closes; the packets it sent before."""
        packets = []
        while True:
            packet = self.recv_or_close(timeout)
            if packet is None:
                return packets
            packets.append(packet)

    def disconnect(self) -> None:
        self.send(Disconnect())
        self.close()

    def close(self) -> None:
        self.sock.close()
