"""Issue 21 item 4 for what an AMQP client may make the broker hold or send: direct reply-to
replies obey the connection's outgoing bound, and ``channel.flow(active=false)`` is refused as
RabbitMQ refuses it.

Direct reply-to (``amq.rabbitmq.reply-to``) replies have no queue: they went straight into the
requester's connection whatever its outgoing buffer held, so a requester that stops reading while
a responder keeps replying grew the broker's memory without bound (RabbitMQ 3.10.8 does the
same: 2,000 replies of 64 KiB to a requester that never reads grew the node's RSS from 143 to
265 MiB, kept after the replies stopped). Here, in one ``braid serve`` with a 64 KiB
``max_outgoing_buffer_bytes`` and a 2 s stall timeout, a raw-socket requester (a 4 KiB receive
buffer) sends one request and reads nothing more while a pika responder sends it ``REPLIES``
replies of 64 KiB, about twice what the bound and the kernel's socket buffers can hold: every
reply is confirmed to the responder at once, the replies that do not fit are dropped and counted
(``braid_amqp_replies_dropped_total``; the written ones are counted as delivered: the two make
the total), the bytes written to the requester (``send_oct``) stay under the bound plus the
kernel's buffers, another consumer and another direct reply-to requester are served meanwhile,
and the stalled requester is disconnected after the timeout as any stalled consumer. Before this
work every reply was written (``send_oct`` was ``REPLIES`` x 64 KiB) and nothing was counted.

``channel.flow``: RabbitMQ (rabbit_channel.erl since 3.3, and 3.10.8 on the wire) answers
``active=false`` with Connection.Close 540 ``NOT_IMPLEMENTED - active=false`` (class 20, method
20) and ``active=true`` with Flow-Ok; BraidMQ used to pause only the channel's acknowledging
consumers, never its no-ack ones."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import body, commands, header, heartbeat
from pamqp import frame as pamqp_frame

from tests.braid_process import BraidProcess
from tests.faults.test_slow_consumer import closed_by_broker, disconnect_times, recv_exactly
from tests.faults.test_slow_consumer_amqp import (
    AMQP_HEADER,
    HealthyConsumer,
    SentSampler,
    amqp_counter,
    kernel_send_buffer_max,
    pika_connection,
    send,
)
from tests.faults.volume import wait_for

KIB = 1024
MAX_OUTGOING = 64 * KIB  # [limits] max_outgoing_buffer_bytes (its smallest value)
STALL_TIMEOUT_S = 2.0  # [limits] stalled_client_timeout_s
REPLY_BODY = b"r" * (64 * KIB)
# What the broker may write to a requester that never reads: the bound, the reply that crossed
# it, the kernel's send buffer (autotuned up to tcp_wmem's maximum) and the client's receive
# window (as tests/faults/test_slow_consumer_amqp.py's SENT_BOUND).
SENT_BOUND = 2 * MAX_OUTGOING + 128 * KIB + kernel_send_buffer_max() + 64 * KIB
REPLIES = 2 * SENT_BOUND // len(REPLY_BODY)  # about twice what can be written
HEALTHY = 100  # messages for the consumer of another connection
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"
DEADLINE_S = 30.0  # for a hang only


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("slow-requester")
    config = path / "braid.toml"
    config.write_text(
        f"[limits]\nmax_outgoing_buffer_bytes = {MAX_OUTGOING}\n"
        f"stalled_client_timeout_s = {STALL_TIMEOUT_S}\n"
    )
    with BraidProcess(path, listeners=("amqp", "http"), extra_args=("--config", str(config))) as b:
        yield b


def expect(sock: socket.socket, kind: type) -> Any:
    """The next method frame (heartbeats and message contents skipped): a ``kind``."""
    while True:
        head = recv_exactly(sock, 7)
        _type, _channel, size = struct.unpack(">BHI", head)
        _, _, frame = pamqp_frame.unmarshal(head + recv_exactly(sock, size + 1))
        if not isinstance(frame, heartbeat.Heartbeat | header.ContentHeader | body.ContentBody):
            assert isinstance(frame, kind), f"expected {kind.__name__}, got {frame!r}"
            return frame


def raw_client(braid: BraidProcess) -> socket.socket:
    """A raw AMQP client, logged in with channel 1 open, no heartbeats, a 4 KiB receive buffer
    (so the broker's buffers are what fill once it stops reading)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(DEADLINE_S)
    sock.connect(("127.0.0.1", braid.amqp_port))
    sock.sendall(AMQP_HEADER)
    expect(sock, commands.Connection.Start)
    send(sock, 0, commands.Connection.StartOk({"product": "raw"}, "PLAIN", "\0guest\0guest"))
    tune = expect(sock, commands.Connection.Tune)
    send(sock, 0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
    send(sock, 0, commands.Connection.Open("/"))
    expect(sock, commands.Connection.OpenOk)
    send(sock, 1, commands.Channel.Open())
    expect(sock, commands.Channel.OpenOk)
    return sock


def stalled_requester(braid: BraidProcess, request_queue: str) -> socket.socket:
    """A raw client that consumes its direct replies, publishes one request to
    ``request_queue`` asking for replies there, and then reads nothing more."""
    sock = raw_client(braid)
    send(sock, 1, commands.Basic.Consume(queue=DIRECT_REPLY_TO, consumer_tag="r", no_ack=True))
    expect(sock, commands.Basic.ConsumeOk)
    properties = commands.Basic.Properties(reply_to=DIRECT_REPLY_TO)
    request = b"request"
    sock.sendall(
        pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key=request_queue), 1)
        + pamqp_frame.marshal(header.ContentHeader(0, len(request), properties), 1)
        + pamqp_frame.marshal(body.ContentBody(request), 1)
    )
    return sock


def take_request(channel: Any, queue: str) -> str:
    """The reply address of the next request in ``queue`` (waiting for it to arrive)."""
    found: list[str] = []

    def taken() -> bool:
        method, properties, _body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            found.append(properties.reply_to)
        return bool(found)

    wait_for(taken, f"a request in {queue}", DEADLINE_S)
    return found[0]


def healthy_round_trip(braid: BraidProcess, request_queue: str) -> bytes:
    """One direct reply-to request and reply between two pika connections."""
    requester = pika_connection(braid)
    responder = pika_connection(braid)
    try:
        replies: list[bytes] = []
        channel = requester.channel()
        channel.basic_consume(
            DIRECT_REPLY_TO, lambda _ch, _m, _p, data: replies.append(data), auto_ack=True
        )
        channel.basic_publish(
            "", request_queue, b"ping", pika.BasicProperties(reply_to=DIRECT_REPLY_TO)
        )
        responding = responder.channel()
        address = take_request(responding, request_queue)
        responding.basic_publish("", address, b"pong")
        deadline = time.monotonic() + DEADLINE_S
        while not replies and time.monotonic() < deadline:
            requester.process_data_events(time_limit=0.05)
        assert replies, "the healthy requester got no reply"
        return replies[0]
    finally:
        requester.close()
        responder.close()


def test_replies_to_a_requester_that_does_not_read_are_dropped_and_counted(
    braid: BraidProcess,
) -> None:
    request_queue, healthy_requests, healthy_queue = "rpc-stalled", "rpc-healthy", "plain"
    setup = pika_connection(braid)
    for queue in (request_queue, healthy_requests, healthy_queue):
        setup.channel().queue_declare(queue)
    setup.close()
    healthy = HealthyConsumer(braid, healthy_queue)
    responder = pika_connection(braid)
    logged_before = len(disconnect_times(braid))
    disconnects_before = amqp_counter(braid, "stalled_disconnects")
    stalled_at = datetime.now()
    sock = stalled_requester(braid, request_queue)
    sampler = SentSampler(braid, sock.getsockname()[1])
    try:
        channel = responder.channel()
        address = take_request(channel, request_queue)
        assert address.startswith(f"{DIRECT_REPLY_TO}.")
        channel.confirm_delivery()
        delivered_before = amqp_counter(braid, "delivered")
        dropped_before = amqp_counter(braid, "replies_dropped")
        # The responder is not held back: each reply is confirmed (pika waits for each).
        for _ in range(REPLIES):
            channel.basic_publish("", address, REPLY_BODY)
        # (Each reply is written or dropped before its confirm: the counters are final.)
        written = amqp_counter(braid, "delivered") - delivered_before
        dropped = amqp_counter(braid, "replies_dropped") - dropped_before
        assert written > 0
        assert dropped > 0
        assert written + dropped == REPLIES, (written, dropped)
        # Others are served meanwhile: a consumer, and a direct reply-to round trip.
        publisher = pika_connection(braid)
        publishing = publisher.channel()
        for number in range(HEALTHY):
            publishing.basic_publish("", healthy_queue, b"%d" % number)
        publisher.close()
        assert healthy_round_trip(braid, healthy_requests) == b"pong"
        wait_for(lambda: healthy.received >= HEALTHY, "the healthy consumer's messages")
        # The stalled requester is disconnected, no earlier than the timeout, with a log line.
        sampler.thread.join(DEADLINE_S)
        assert not sampler.thread.is_alive(), f"still connected, {sampler.sent} bytes sent"
        wait_for(lambda: len(disconnect_times(braid)) > logged_before, "the stall log line")
        assert disconnect_times(braid)[-1] >= stalled_at + timedelta(seconds=STALL_TIMEOUT_S)
        wait_for(lambda: closed_by_broker(sock), "the stalled socket to be closed")
    finally:
        sampler.close()
        sock.close()
        responder.close()
        healthy.close()
    # What was written to it stayed bounded (before: every reply, REPLIES x 64 KiB).
    assert 0 < sampler.sent <= SENT_BOUND, (sampler.sent, SENT_BOUND)
    assert healthy.received == HEALTHY
    assert amqp_counter(braid, "stalled_disconnects") == disconnects_before + 1
    assert "direct reply-to replies dropped" in braid.stderr()


def test_channel_flow_false_is_refused_as_rabbitmq_refuses_it(braid: BraidProcess) -> None:
    queue = "flow"
    connection = pika_connection(braid)
    channel = connection.channel()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"before")
    sock = raw_client(braid)
    try:
        send(sock, 1, commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=True))
        expect(sock, commands.Basic.ConsumeOk)
        expect(sock, commands.Basic.Deliver)
        # active=true: Flow-Ok, and the no-ack consumer keeps getting its deliveries.
        send(sock, 1, commands.Channel.Flow(active=True))
        assert expect(sock, commands.Channel.FlowOk).active is True
        channel.basic_publish("", queue, b"after flow(true)")
        expect(sock, commands.Basic.Deliver)
        # active=false: a hard error, as RabbitMQ's.
        send(sock, 1, commands.Channel.Flow(active=False))
        close = expect(sock, commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - active=false")
        assert (close.class_id, close.method_id) == (20, 20)
        send(sock, 0, commands.Connection.CloseOk())
        wait_for(lambda: closed_by_broker(sock), "the connection to close")
    finally:
        sock.close()
    # pika sees what RabbitMQ's clients see; other connections are untouched.
    other = pika_connection(braid)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as refused:
        other.channel().flow(False)
    assert refused.value.reply_code == 540
    assert refused.value.reply_text == "NOT_IMPLEMENTED - active=false"
    channel.basic_publish("", queue, b"still served")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"still served"
    connection.close()
