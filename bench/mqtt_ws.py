"""``python -m bench mqtt_ws``: MQTT over WebSocket, what the WebSocket layer costs the broker.

One ``braid serve`` with its MQTT and MQTT-over-WebSocket listeners. Two workloads, each with a
subscriber on plain MQTT and a publisher sending QoS 0 PUBLISH packets of ``--size`` bytes:

- ``ws``: the publisher speaks MQTT over WebSocket (each packet one masked binary frame, as
  paho and mqtt.js send them);
- ``tcp``: the same publisher on plain MQTT, for the cost of the broker without WebSocket.

Closed loop (at most ``--window`` published and not yet delivered), ``--seconds`` per run,
``--rounds`` alternating rounds. The figure is the broker's CPU time per delivered message
(µs), beside throughput; ``ws/tcp`` is the WebSocket layer's share. Then ``big``: one PUBLISH
of ``--big-mib`` MiB in one WebSocket frame written in 1 KiB pieces, against the same bytes as
1 KiB frames: broker CPU seconds for each (a codec that re-joins its buffer on every read pays
quadratically for the first).

The load client is this process (uvloop when present), raw sockets, BraidMQ's own sans-IO MQTT
codec. Bounded: about ``2 x rounds x seconds`` plus the big-frame runs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.mqtt import free_port, wait_for_port
from gateway.mqtt.codec import (
    Connack,
    Connect,
    MqttDecoder,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    encode,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
MASK = b"\x5a\xa5\x3c\xc3"


def ws_frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """One masked client frame (RFC 6455 §5.2)."""
    size = len(payload)
    head = bytes(((0x80 if fin else 0) | opcode,))
    if size < 126:
        head += bytes((0x80 | size,))
    elif size < 65536:
        head += bytes((0x80 | 126,)) + struct.pack(">H", size)
    else:
        head += bytes((0x80 | 127,)) + struct.pack(">Q", size)
    key = (MASK * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )
    return head + MASK + masked


def handshake_request() -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: mqtt\r\n\r\n"
    ).encode()


class Broker:
    def __init__(self, workdir: Path) -> None:
        self.mqtt_port = free_port()
        self.ws_port = free_port()
        config = workdir / "braid.toml"
        config.write_text('[log]\ndurability = "async"\n[mqtt]\nmax_packet_size = 268435455\n')
        command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
        command += ["--config", str(config), "--data-dir", str(workdir / "data")]
        command += ["--mqtt-port", str(self.mqtt_port), "--mqtt-ws-port", str(self.ws_port)]
        for other in ("--amqp-port", "--kafka-port", "--http-port"):
            command += [other, "0"]
        self.process = subprocess.Popen(
            command,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            stdout=subprocess.PIPE,
            stderr=(workdir / "braid.log").open("w"),
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("braid ready"):
            raise RuntimeError(f"braid did not start: {line!r}")
        wait_for_port(self.ws_port, 30, self.process)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the broker process so far (/proc, as psutil reads it)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


async def open_mqtt(port: int, client_id: str, *, ws: bool) -> tuple[Any, Any, MqttDecoder]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = MqttDecoder(4, max_packet_size=268_435_455)
    connect = encode(Connect(client_id, 4, keep_alive=0), 4)
    if ws:
        writer.write(handshake_request())
        response = await reader.readuntil(b"\r\n\r\n")
        if not response.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"WebSocket handshake refused: {response[:40]!r}")
        writer.write(ws_frame(connect))
    else:
        writer.write(connect)
    data = await reader.read(4096)
    if ws:
        data = data[2:]  # the CONNACK's frame head (4 bytes of payload: a short frame)
    packets = decoder.feed(data)
    if not packets or not isinstance(packets[0], Connack):
        raise RuntimeError(f"no CONNACK: {packets}")
    return reader, writer, decoder


async def publish_run(
    broker: Broker, *, ws: bool, size: int, window: int, seconds: float
) -> tuple[int, float, float]:
    """Messages delivered, wall seconds, broker CPU seconds."""
    topic = f"bench/ws/{time.monotonic_ns()}"
    sub_reader, sub_writer, sub_decoder = await open_mqtt(broker.mqtt_port, topic + "s", ws=False)
    sub_writer.write(encode(Subscribe(1, (Subscription(topic, 0),)), 4))
    while not any(isinstance(p, Suback) for p in sub_decoder.feed(await sub_reader.read(4096))):
        pass
    port = broker.ws_port if ws else broker.mqtt_port
    _, pub_writer, _ = await open_mqtt(port, topic + "p", ws=ws)
    packet = encode(Publish(topic, b"x" * size, 0), 4)
    wire = ws_frame(packet) if ws else packet
    sent = delivered = 0
    cpu_start = broker.cpu_s()
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        burst = window - (sent - delivered)
        if burst > 0:
            pub_writer.write(wire * burst)
            sent += burst
        delivered += len(sub_decoder.feed(await sub_reader.read(1 << 20)))
    while delivered < sent:
        delivered += len(sub_decoder.feed(await asyncio.wait_for(sub_reader.read(1 << 20), 30)))
    wall = time.monotonic() - start
    cpu = broker.cpu_s() - cpu_start
    pub_writer.close()
    sub_writer.close()
    return delivered, wall, cpu


async def big_frame_run(broker: Broker, mib: int, *, one_frame: bool) -> float:
    """Broker CPU seconds to take one PUBLISH of ``mib`` MiB in 1 KiB writes: as one frame
    (``one_frame``) or as 1 KiB frames, until a subscriber has it."""
    topic = f"bench/big/{time.monotonic_ns()}"
    sub_reader, sub_writer, sub_decoder = await open_mqtt(broker.mqtt_port, topic + "s", ws=False)
    sub_writer.write(encode(Subscribe(1, (Subscription(topic, 0),)), 4))
    while not any(isinstance(p, Suback) for p in sub_decoder.feed(await sub_reader.read(4096))):
        pass
    _, pub_writer, _ = await open_mqtt(broker.ws_port, topic + "p", ws=True)
    packet = encode(Publish(topic, b"y" * (mib << 20), 0), 4)
    piece = 1024
    if one_frame:
        wire = ws_frame(packet)
    else:
        wire = b"".join(
            ws_frame(packet[at : at + piece], 0x2 if at == 0 else 0x0, at + piece >= len(packet))
            for at in range(0, len(packet), piece)
        )
    cpu_start = broker.cpu_s()
    for at in range(0, len(wire), piece):
        pub_writer.write(wire[at : at + piece])
        await pub_writer.drain()
    while not sub_decoder.feed(await asyncio.wait_for(sub_reader.read(1 << 20), 120)):
        pass
    cpu = broker.cpu_s() - cpu_start
    pub_writer.close()
    sub_writer.close()
    return cpu


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench mqtt_ws", description=__doc__)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big-mib", type=int, default=4)
    options = parser.parse_args(argv)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with tempfile.TemporaryDirectory(prefix="bench-mqtt-ws-") as tmp, runner:
        broker = Broker(Path(tmp))
        try:
            rows: dict[str, list[tuple[float, float]]] = {"ws": [], "tcp": []}
            for _ in range(options.rounds):
                for name in ("ws", "tcp"):
                    delivered, wall, cpu = runner.run(
                        publish_run(
                            broker,
                            ws=name == "ws",
                            size=options.size,
                            window=options.window,
                            seconds=options.seconds,
                        )
                    )
                    rows[name].append((delivered / wall, cpu / delivered * 1e6))
            big_one = runner.run(big_frame_run(broker, options.big_mib, one_frame=True))
            big_many = runner.run(big_frame_run(broker, options.big_mib, one_frame=False))
        finally:
            broker.stop()
    print(f"# bench mqtt_ws, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, ", end="")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"QoS 0, {options.size} B, window {options.window}, {options.rounds} rounds\n")
    print("| publisher | msgs/s (best) | broker CPU µs/msg (best) | runs (msgs/s; µs) |")
    print("|---|---:|---:|---|")
    for name, runs in rows.items():
        spread = "; ".join(f"{rate:,.0f}, {cost:.1f}" for rate, cost in runs)
        print(
            f"| {name} | {max(r for r, _ in runs):,.0f} | {min(c for _, c in runs):.1f} | "
            f"{spread} |"
        )
    ws_cost = min(c for _, c in rows["ws"])
    tcp_cost = min(c for _, c in rows["tcp"])
    print(f"\nws/tcp broker CPU per message: {ws_cost / tcp_cost:.2f}")
    print(
        f"\n{options.big_mib} MiB PUBLISH in 1 KiB writes: broker CPU {big_one:.3f} s as one "
        f"frame, {big_many:.3f} s as 1 KiB frames (ratio {big_one / big_many:.2f})"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
