"""BraidServer in-process: listener slots (how gateways get registered), start failures, stop."""

from __future__ import annotations

import asyncio

import pytest

from braid.config import ListenerSettings, ServerSettings
from braid.server import (
    LISTENERS,
    BraidServer,
    ListenerSlot,
    ServerContext,
    StartupError,
    format_address,
)
from core.broker import Node
from core.log.store import now_ms

from .conftest import free_port


class EchoListener:
    """A stand-in gateway: a real TCP server that echoes one line."""

    def __init__(self, name: str, server: asyncio.Server, events: list[tuple[str, str]]) -> None:
        self.name = name
        self.server = server
        self.events = events

    @property
    def address(self) -> tuple[str, int] | None:
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    async def close(self) -> None:
        self.events.append(("close", self.name))
        self.server.close()
        await self.server.wait_closed()


def echo_factory(name: str, events: list[tuple[str, str]], seen: list[ServerContext]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    async def factory(context: ServerContext, host: str, port: int) -> EchoListener:
        seen.append(context)
        events.append(("start", name))
        return EchoListener(name, await asyncio.start_server(handle, host, port), events)

    return factory


def settings_for(tmp_path, **ports: int) -> ServerSettings:
    values = {"amqp_port": 0, "mqtt_port": 0, "mqtt_ws_port": 0, "kafka_port": 0, "http_port": 0}
    values.update(ports)
    return ServerSettings(
        data_dir=str(tmp_path / "data"),
        listeners=ListenerSettings(host="127.0.0.1", **values),
    )


def test_every_port_setting_has_a_slot():
    assert [slot.name for slot in LISTENERS] == [
        "amqp",
        "mqtt",
        "mqtt-ws",
        "kafka",
        "http",
        "amqps",
        "mqtts",
        "mqtt-wss",
        "kafka-tls",
        "https",
    ]
    for slot in LISTENERS:
        assert hasattr(ListenerSettings(), slot.port_setting)


def test_format_address():
    assert format_address(None) == "-"
    assert format_address(("127.0.0.1", 1)) == "127.0.0.1:1"
    assert format_address(("::1", 2)) == "[::1]:2"


async def test_listener_slots_start_in_order_and_close_in_reverse(tmp_path):
    events: list[tuple[str, str]] = []
    contexts: list[ServerContext] = []
    slots = (
        ListenerSlot("alpha", "amqp_port", echo_factory("alpha", events, contexts)),
        ListenerSlot("beta", "mqtt_port", echo_factory("beta", events, contexts)),  # port 0: off
        ListenerSlot("gamma", "kafka_port", None),  # not implemented: '-'
        ListenerSlot("delta", "mqtt_ws_port", echo_factory("delta", events, contexts)),
    )
    alpha_port, delta_port = free_port(), free_port()
    settings = settings_for(
        tmp_path, amqp_port=alpha_port, kafka_port=free_port(), mqtt_ws_port=delta_port
    )
    server = BraidServer(settings, slots)
    await server.start()
    try:
        assert server.ready_line() == (
            f"braid ready: data={tmp_path / 'data'} alpha=127.0.0.1:{alpha_port} beta=- "
            f"gamma=- delta=127.0.0.1:{delta_port}"
        )
        assert events == [("start", "alpha"), ("start", "delta")]
        assert all(isinstance(context.broker, Node) for context in contexts)
        assert contexts[0].broker.shard.store is server.store
        reader, writer = await asyncio.open_connection("127.0.0.1", alpha_port)
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
        ok, details = server.health()
        assert ok
        assert details["listeners"] == {
            "alpha": f"127.0.0.1:{alpha_port}",
            "beta": None,
            "gamma": None,
            "delta": f"127.0.0.1:{delta_port}",
        }
    finally:
        await server.stop()
    assert events[2:] == [("close", "delta"), ("close", "alpha")]
    assert (tmp_path / "data" / "clean_shutdown").exists()
    ok, details = server.health()
    assert not ok
    assert details["reason"] == "stopping"
    await server.stop()  # idempotent


async def test_a_listener_that_cannot_start_undoes_the_start(tmp_path):
    events: list[tuple[str, str]] = []

    async def refuse(context: ServerContext, host: str, port: int) -> EchoListener:
        raise OSError(98, "address already in use")

    slots = (
        ListenerSlot("first", "amqp_port", echo_factory("first", events, [])),
        ListenerSlot("second", "mqtt_port", refuse),
    )
    server = BraidServer(
        settings_for(tmp_path, amqp_port=free_port(), mqtt_port=free_port()), slots
    )
    with pytest.raises(StartupError, match=r"cannot listen for second on 127\.0\.0\.1:"):
        await server.start()
    assert events == [("start", "first"), ("close", "first")]
    assert (tmp_path / "data" / "clean_shutdown").exists()
    # The lock is released: the directory can be served again.
    again = BraidServer(settings_for(tmp_path), slots[:1])
    await again.start()
    await again.stop()


async def test_broker_metrics_are_exported(tmp_path):
    server = BraidServer(settings_for(tmp_path), ())
    await server.start()
    try:
        assert server.broker is not None
        server.broker.shard.metrics["dropped"] += 3
        text = server.metrics.render()
    finally:
        await server.stop()
    assert "# TYPE braid_broker_dropped_total counter\nbraid_broker_dropped_total 3\n" in text
    assert "# TYPE braid_log_appends_total counter" in text
    assert "braid_broker_flow_blocked 0\n" in text
    assert "braid_broker_ack_queues 0\n" in text


async def test_transaction_and_timer_metrics_are_exported(tmp_path):
    server = BraidServer(settings_for(tmp_path), ())
    await server.start()
    try:
        broker = server.broker
        assert broker is not None
        await broker.declare_topic("orders", 1)
        # One half message left open, one committed through the braid.txn convention, one
        # delayed record pending.
        await broker.publish("orders", b"open", headers=[("x-braid-txn-id", b"t-open")])
        await broker.publish("orders", b"done", headers=[("x-braid-txn-id", b"t-done")])
        await broker.publish("braid.txn", b"commit", subject="t-done")
        await broker.publish("orders", b"later", deliver_at_ms=now_ms() + 3_600_000)
        text = server.metrics.render()
    finally:
        await server.stop()
    assert "braid_transactions_pending 1\n" in text
    assert "braid_transactions_committed_total 1\n" in text
    assert "braid_half_messages_halves_total 2\n" in text
    assert "braid_half_messages_outcomes_total 1\n" in text
    assert "braid_timers_pending 1\n" in text
    assert "# TYPE braid_timers_scheduled_total counter" in text
