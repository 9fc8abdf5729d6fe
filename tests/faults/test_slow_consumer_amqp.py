"""Issue 21 item 4 for AMQP: a consumer with no prefetch limit (basic.consume without basic.qos,
acknowledging or no-ack) on a connection whose socket nobody reads must not grow the broker's
memory without bound, must not stop other consumers, is disconnected after
``[limits] stalled_client_timeout_s``, and loses nothing it was not handed.

A raw-socket AMQP client (a 4 KiB receive buffer) consumes a queue holding ``BACKLOG`` 1 KiB
messages, then reads nothing more, while a pika publisher adds ``WHILE_STALLED`` more. Before
this work (at ad33fba, with 15,000 + 5,000) the queue's pump wrote every message into that
connection's buffer (send_oct 22,140,490 bytes, the broker's memory with it), and the connection
stayed open as long as the socket did. Here send_oct stayed at 2.88 MB (2,600 messages: the
kernel's socket buffers, under the 4.3 MiB ``SENT_BOUND``).

Here, in one ``braid serve`` with a 64 KiB ``max_outgoing_buffer_bytes`` and a 3 s stall timeout:
the bytes the broker wrote to the stalled connection (``send_oct`` in ``/api/connections``)
stay under the bound plus what the kernel's socket buffers can take; a pika consumer on another
queue gets its messages meanwhile; the stalled connection is closed no earlier than the timeout,
with a log line; then a new pika consumer gets every message the stalled one had not acked
(acknowledging mode: all of them, the ones it held redelivered), or every one it was not handed
(no-ack mode: what the broker counted as delivered plus what is left make the total)."""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from pamqp import body, commands, heartbeat
from pamqp import frame as pamqp_frame

from tests.braid_process import BraidProcess
from tests.faults.test_slow_consumer import closed_by_broker, disconnect_times, recv_exactly
from tests.faults.volume import metrics, wait_for

KIB = 1024
MAX_OUTGOING = 64 * KIB  # [limits] max_outgoing_buffer_bytes (its smallest value)
STALL_TIMEOUT_S = 3.0  # [limits] stalled_client_timeout_s
BODY = b"m" * KIB
BACKLOG = 10_000  # in the queue before the stalled consumer subscribes
WHILE_STALLED = 3_000  # published to it while it stalls
HEALTHY = 200  # messages for the healthy consumer on another queue
GUEST = ("guest", "guest")
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


def kernel_send_buffer_max() -> int:
    """The most a TCP socket's send buffer may autotune to (net.ipv4.tcp_wmem's maximum)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


# What the broker may have written to a stalled connection: the bound, the last delivery that
# crossed it (a frame_max of 128 KiB), the transport's buffer below the bound and the kernel's:
# the broker's send buffer (autotuned up to tcp_wmem's maximum, 4 MiB on Linux) and the
# client's 4 KiB receive window. Before this work it was all BACKLOG + WHILE_STALLED messages.
SENT_BOUND = 2 * MAX_OUTGOING + 128 * KIB + kernel_send_buffer_max() + 64 * KIB


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("slow-amqp")
    config = path / "braid.toml"
    config.write_text(
        f"[limits]\nmax_outgoing_buffer_bytes = {MAX_OUTGOING}\n"
        f"stalled_client_timeout_s = {STALL_TIMEOUT_S}\n"
    )
    with BraidProcess(path, listeners=("amqp", "http"), extra_args=("--config", str(config))) as b:
        yield b


def pika_connection(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )


def publish(braid: BraidProcess, queue: str, first: int, count: int) -> None:
    """``count`` messages to ``queue``, numbered from ``first`` (the number leads the body)."""
    connection = pika_connection(braid)
    try:
        channel = connection.channel()
        for number in range(first, first + count - 1):
            channel.basic_publish("", queue, b"%08d" % number + BODY)
        # Only the last one confirmed (pika waits for each confirm): as the broker takes a
        # channel's publishes in order, all are in the queue once it is.
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"%08d" % (first + count - 1) + BODY)
    finally:
        connection.close()


def declare(braid: BraidProcess, *queues: str) -> None:
    connection = pika_connection(braid)
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_declare(queue)
    finally:
        connection.close()


def ready_count(braid: BraidProcess, queue: str) -> int:
    connection = pika_connection(braid)
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


def consume_all(braid: BraidProcess, queue: str, expected: int) -> list[int]:
    """The numbers of ``expected`` messages taken from ``queue`` by a pika consumer (acked)."""
    numbers: list[int] = []
    connection = pika_connection(braid)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1000)
        for method, _properties, body in channel.consume(queue, inactivity_timeout=30):
            assert method is not None, f"timed out after {len(numbers)} of {expected}"
            numbers.append(int(body[:8]))
            if len(numbers) % 500 == 0 or len(numbers) == expected:
                channel.basic_ack(method.delivery_tag, multiple=True)
            if len(numbers) == expected:
                break
        channel.cancel()
    finally:
        connection.close()
    return numbers


def send(sock: socket.socket, channel: int, method: Any) -> None:
    sock.sendall(pamqp_frame.marshal(method, channel))


def expect(sock: socket.socket, kind: type) -> Any:
    """The next frame (heartbeats skipped), which must be a ``kind``."""
    while True:
        head = recv_exactly(sock, 7)
        _type, _channel, size = struct.unpack(">BHI", head)
        _, _, frame = pamqp_frame.unmarshal(head + recv_exactly(sock, size + 1))
        if not isinstance(frame, heartbeat.Heartbeat):
            assert isinstance(frame, kind), f"expected {kind.__name__}, got {frame!r}"
            return frame


def stalled_consumer(braid: BraidProcess, queue: str, *, no_ack: bool) -> socket.socket:
    """A raw AMQP client that consumes ``queue`` with no prefetch limit (no basic.qos), no
    heartbeats, reads Basic.ConsumeOk and then nothing more (a 4 KiB receive buffer, so the
    broker's buffers are what fill)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", braid.amqp_port))
    sock.sendall(AMQP_HEADER)
    expect(sock, commands.Connection.Start)
    send(sock, 0, commands.Connection.StartOk({"product": "stalled"}, "PLAIN", "\0guest\0guest"))
    tune = expect(sock, commands.Connection.Tune)
    send(sock, 0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    send(sock, 0, commands.Connection.Open("/"))
    expect(sock, commands.Connection.OpenOk)
    send(sock, 1, commands.Channel.Open())
    expect(sock, commands.Channel.OpenOk)
    send(sock, 1, commands.Basic.Consume(queue=queue, consumer_tag="stalled", no_ack=no_ack))
    expect(sock, commands.Basic.ConsumeOk)
    return sock


def sent_to(braid: BraidProcess, port: int) -> int | None:
    """``send_oct`` of the connection from local ``port``, None once it is gone."""
    listing = requests.get(
        f"http://127.0.0.1:{braid.http_port}/api/connections", auth=GUEST, timeout=30
    ).json()
    for connection in listing:
        if connection["peer_port"] == port:
            return int(connection["send_oct"])
    return None


def amqp_counter(braid: BraidProcess, name: str) -> int:
    """``braid_amqp_<name>_total`` from ``/metrics``."""
    found = re.search(rf"^braid_amqp_{name}_total (\d+)", metrics(braid.http_port), re.M)
    assert found is not None, name
    return int(found.group(1))


class SentSampler:
    """Polls a connection's ``send_oct`` in a thread until the connection is gone."""

    def __init__(self, braid: BraidProcess, port: int) -> None:
        self.braid = braid
        self.port = port
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            sent = sent_to(self.braid, self.port)
            if sent is None:
                return
            self.sent = max(self.sent, sent)
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


class HealthyConsumer:
    """A pika consumer on its own queue, in a thread, counting what it gets."""

    def __init__(self, braid: BraidProcess, queue: str) -> None:
        self.connection = pika_connection(braid)
        self.received = 0
        self.stop = threading.Event()
        channel = self.connection.channel()
        channel.basic_consume(queue, self.on_message, auto_ack=True)
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def on_message(self, *_args: Any) -> None:
        self.received += 1

    def run(self) -> None:
        while not self.stop.is_set():
            self.connection.process_data_events(time_limit=0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.connection.close()


def stall_and_recover(braid: BraidProcess, name: str, *, no_ack: bool) -> tuple[int, int]:
    """The scenario; (bytes the broker wrote to the stalled connection, its delivered count)."""
    queue, healthy_queue = f"{name}-stalled", f"{name}-healthy"
    declare(braid, queue, healthy_queue)
    publish(braid, queue, 0, BACKLOG)
    healthy = HealthyConsumer(braid, healthy_queue)
    logged_before = len(disconnect_times(braid))
    delivered_before = amqp_counter(braid, "delivered")
    disconnects_before = amqp_counter(braid, "stalled_disconnects")
    stalled_at = datetime.now()
    sock: socket.socket | None = None
    sampler: SentSampler | None = None
    try:
        sock = stalled_consumer(braid, queue, no_ack=no_ack)
        sampler = SentSampler(braid, sock.getsockname()[1])
        # The publisher is not held back by the stalled consumer of its queue.
        publish(braid, queue, BACKLOG, WHILE_STALLED)
        # Another consumer is served meanwhile.
        publish(braid, healthy_queue, 0, HEALTHY)
        wait_for(lambda: healthy.received >= HEALTHY, "the healthy consumer's messages")
        # What the broker wrote to it, up to its disconnection (a deadline for a hang only).
        sampler.thread.join(STALL_TIMEOUT_S * 15)
        assert not sampler.thread.is_alive(), f"still connected, {sampler.sent} bytes sent to it"
        sent = sampler.sent
        # Closed (aborted) no earlier than the stall timeout, with the log line.
        wait_for(
            lambda: len(disconnect_times(braid)) > logged_before, "the stalled-client log line"
        )
        when = disconnect_times(braid)[-1]
        assert when >= stalled_at + timedelta(seconds=STALL_TIMEOUT_S), (when, stalled_at)
        wait_for(partial(closed_by_broker, sock), "the stalled socket to be closed")
    finally:
        if sampler is not None:
            sampler.close()
        if sock is not None:
            sock.close()
        healthy.close()
    assert healthy.received == HEALTHY
    assert amqp_counter(braid, "stalled_disconnects") == disconnects_before + 1
    # (The healthy consumer's deliveries are counted too.)
    return sent, amqp_counter(braid, "delivered") - delivered_before - HEALTHY


def test_a_stalled_acknowledging_consumer_is_bounded_and_loses_nothing(
    braid: BraidProcess,
) -> None:
    sent, delivered = stall_and_recover(braid, "acking", no_ack=False)
    assert 0 < sent <= SENT_BOUND, (sent, SENT_BOUND)
    assert delivered > 0
    # Nothing was acknowledged: every message is back, the ones it held redelivered.
    total = BACKLOG + WHILE_STALLED
    assert ready_count(braid, "acking-stalled") == total
    assert sorted(consume_all(braid, "acking-stalled", total)) == list(range(total))


def test_a_stalled_no_ack_consumer_is_bounded_and_keeps_what_it_was_not_handed(
    braid: BraidProcess,
) -> None:
    sent, delivered = stall_and_recover(braid, "no-ack", no_ack=True)
    assert 0 < sent <= SENT_BOUND, (sent, SENT_BOUND)
    # A no-ack delivery counts as settled once written (as in RabbitMQ): those handed to the
    # socket are gone with it; every other one is still in the queue, in order.
    total = BACKLOG + WHILE_STALLED
    assert 0 < delivered < total
    left = ready_count(braid, "no-ack-stalled")
    assert delivered + left == total, (delivered, left)
    assert consume_all(braid, "no-ack-stalled", left) == list(range(delivered, total))


def read_bodies(sock: socket.socket, count: int) -> list[int]:
    """The numbers of the next ``count`` message bodies a raw consumer receives."""
    numbers: list[int] = []
    while len(numbers) < count:
        head = recv_exactly(sock, 7)
        _type, _channel, size = struct.unpack(">BHI", head)
        _, _, frame = pamqp_frame.unmarshal(head + recv_exactly(sock, size + 1))
        if isinstance(frame, body.ContentBody):
            numbers.append(int(frame.value[:8]))
    return numbers


def test_a_consumer_that_reads_again_gets_everything_and_stays(braid: BraidProcess) -> None:
    """Stopped deliveries resume when the buffer drains: a consumer that stops reading for
    less than the stall timeout, then reads, gets the whole queue in order."""
    queue = "resumed"
    declare(braid, queue)
    publish(braid, queue, 0, BACKLOG)
    disconnects_before = amqp_counter(braid, "stalled_disconnects")
    sock = stalled_consumer(braid, queue, no_ack=True)
    try:
        time.sleep(STALL_TIMEOUT_S / 3)  # over the bound, not for long enough to be dropped
        assert read_bodies(sock, BACKLOG) == list(range(BACKLOG))
        assert sent_to(braid, sock.getsockname()[1]) is not None  # still connected
    finally:
        sock.close()
    assert amqp_counter(braid, "stalled_disconnects") == disconnects_before
    assert ready_count(braid, queue) == 0
