"""10,000 concurrently connected MQTT clients on one ``braid serve``: each connects, subscribes
and receives a broadcast; the broker's memory per connection is reported (from its
``/proc/<pid>/status``). The file-descriptor limit is raised for this process and the broker."""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.mqtt.codec import (
    Connect,
    MqttDecoder,
    Packet,
    Publish,
    Subscribe,
    Subscription,
    encode,
)
from tests.braid_process import BraidProcess

from .clients import assert_clean_log, unique

CLIENTS = 10_000
# Descriptors: the clients here, their peers in the broker, and some slack for both.
NEEDED_FDS = CLIENTS + 1024
CONNECT_BATCH = 500


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < NEEDED_FDS:
        if hard != resource.RLIM_INFINITY and hard < NEEDED_FDS:
            pytest.fail(f"RLIMIT_NOFILE hard limit {hard} < {NEEDED_FDS}: cannot run")
        resource.setrlimit(resource.RLIMIT_NOFILE, (NEEDED_FDS, hard))


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    raise_fd_limit()  # before the broker starts: it inherits the limit
    with BraidProcess(tmp_path_factory.mktemp("braid-scale"), listeners=("mqtt",)) as process:
        yield process
    assert_clean_log(process)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Device:
    __slots__ = ("decoder", "pending", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = MqttDecoder(4)
        self.pending: list[Packet] = []  # decoded, not yet taken by ``packet``

    async def packet(self, timeout: float) -> object:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(4096), timeout)
            assert data, "connection closed"
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)


async def connect_device(port: int, index: int, topic: str) -> Device:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    device = Device(reader, writer)
    writer.write(encode(Connect(f"dev-{index}", 4, True, 120), 4))
    writer.write(encode(Subscribe(1, (Subscription(topic, 0),)), 4))
    connack = await device.packet(60)
    suback = await device.packet(60)
    assert type(connack).__name__ == "Connack"
    assert connack.reason_code == 0
    assert type(suback).__name__ == "Suback"
    return device


@pytest.mark.slow
def test_ten_thousand_connected_clients(
    braid: BraidProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert braid.process is not None
    pid = braid.process.pid
    topic = unique("fleet")

    async def run() -> tuple[int, float, int]:
        before = rss_kib(pid)
        started = time.monotonic()
        devices: list[Device] = []
        for first in range(0, CLIENTS, CONNECT_BATCH):
            batch = range(first, min(first + CONNECT_BATCH, CLIENTS))
            devices += await asyncio.gather(
                *(connect_device(braid.mqtt_port, i, topic) for i in batch)
            )
        connect_s = time.monotonic() - started
        await asyncio.sleep(0.5)
        after = rss_kib(pid)
        # One broadcast reaches every device. (Not paho here: its select() cannot watch a
        # descriptor above 1023.)
        publisher = await connect_device(braid.mqtt_port, CLIENTS, unique("nothing"))
        publisher.writer.write(encode(Publish(topic, b"to all", 0), 4))
        received = await asyncio.gather(*(device.packet(60) for device in devices))
        assert all(isinstance(p, Publish) and p.payload == b"to all" for p in received)
        for device in devices:
            device.writer.write(b"\xe0\x00")
            device.writer.close()
        return after - before, connect_s, after

    grown_kib, connect_s, total_kib = asyncio.run(run())
    per_connection = grown_kib * 1024 / CLIENTS
    with capsys.disabled():
        print(
            f"\n{CLIENTS} MQTT clients connected and subscribed in {connect_s:.1f}s; broker RSS "
            f"{total_kib / 1024:.0f} MiB, {per_connection / 1024:.1f} KiB per connection"
        )
    assert per_connection < 64 * 1024  # a budget, not a target: see the figure printed
