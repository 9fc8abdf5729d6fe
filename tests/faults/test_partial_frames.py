"""Issue 21 item 5: partial requests do not pin memory.

Raw sockets against ``braid serve`` with ``[limits] incomplete_request_timeout_s = 2``:

- a Kafka request declared larger than ``kafka_max_request_bytes_before_login`` (Kafka's
  ``sasl.server.max.receive.size``, 512 KiB) before the client logged in is refused at its size
  prefix (the socket closed, a log line), where it used to be buffered up to 100 MiB; after a
  login (an anonymous Metadata request) the same size is read;
- a request left partly received (Kafka request, AMQP frame, MQTT packet) closes its connection
  after the timeout, with a log line;
- a Kafka client producing and consuming meanwhile is unaffected.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer

from tests.braid_process import BraidProcess

DEADLINE_S = 30.0
TIMEOUT_S = 2  # [limits] incomplete_request_timeout_s of the broker under test
BEFORE_LOGIN_CAP = 524288
CONFIG = f"""
[limits]
incomplete_request_timeout_s = {TIMEOUT_S}
"""


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("partial")
    config = path / "braid.toml"
    config.write_text(CONFIG)
    with BraidProcess(
        path, listeners=("amqp", "mqtt", "kafka"), extra_args=("--config", str(config))
    ) as process:
        yield process


def wait_for_log(braid: BraidProcess, text: str, count: int = 1) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while braid.stderr().count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in the log:\n{braid.stderr()}"
        time.sleep(0.05)


def closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the socket (True), within the deadline."""
    sock.settimeout(DEADLINE_S)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def kafka_request(api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    client_id = b"raw"
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id))
    payload = header + client_id + body
    return struct.pack(">i", len(payload)) + payload


def read_response(sock: socket.socket) -> bytes:
    sock.settimeout(DEADLINE_S)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        assert chunk, "closed instead of answering"
        head += chunk
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        assert chunk, "closed in the middle of a response"
        body += chunk
    return body


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)


def test_kafka_request_over_the_cap_before_login_refused(braid: BraidProcess) -> None:
    with connect(braid.kafka_port) as sock:
        # A Produce declared as 90 MiB, its first 256 KiB sent: refused at the size prefix.
        sock.sendall(struct.pack(">i", 90 * 1024 * 1024) + b"\0" * (256 * 1024))
        assert closed_by_server(sock)
    wait_for_log(braid, "before login ([limits] kafka_max_request_bytes_before_login)")
    assert f"invalid request size {90 * 1024 * 1024} (allowed 8..{BEFORE_LOGIN_CAP})" in (
        braid.stderr()
    )


def test_kafka_after_login_a_larger_request_is_read_then_times_out(braid: BraidProcess) -> None:
    with connect(braid.kafka_port) as sock:
        # Metadata v1 for no topic (an empty array): an anonymous client is logged in by it.
        sock.sendall(kafka_request(3, 1, 1, struct.pack(">i", 0)))
        read_response(sock)
        before = braid.stderr().count("did not complete within")
        # Now a 1 MiB request (over the before-login cap) is read, not refused; left half
        # sent, it is dropped after the timeout.
        sock.sendall(struct.pack(">i", 1024 * 1024) + b"\0" * (512 * 1024))
        assert closed_by_server(sock)
    wait_for_log(braid, "did not complete within", before + 1)
    assert f"invalid request size {1024 * 1024}" not in braid.stderr()


def test_kafka_after_api_versions_a_larger_produce_is_read(braid: BraidProcess) -> None:
    """librdkafka's first request on a broker connection after ApiVersions can be a Produce of
    up to 1,000,000 bytes: it logs the client in (anonymous here) and is read, not refused (it
    was, and the producer retried on new connections without ever being acknowledged)."""
    with connect(braid.kafka_port) as sock:
        sock.sendall(kafka_request(18, 0, 1, b""))  # ApiVersions v0
        read_response(sock)
        before = braid.stderr().count("did not complete within")
        # A Produce (api key 0) declared as 1 MiB, left half sent: read, then timed out.
        sock.sendall(struct.pack(">i", 1024 * 1024) + b"\0" * (512 * 1024))
        assert closed_by_server(sock)
    wait_for_log(braid, "did not complete within", before + 1)
    assert f"invalid request size {1024 * 1024}" not in braid.stderr()


def test_partial_kafka_request_times_out(braid: BraidProcess) -> None:
    before = braid.stderr().count("did not complete within")
    with connect(braid.kafka_port) as sock:
        sock.sendall(struct.pack(">i", 1000) + b"\0" * 100)
        assert closed_by_server(sock)
    wait_for_log(braid, "did not complete within", before + 1)


def test_partial_amqp_frame_times_out(braid: BraidProcess) -> None:
    before = braid.stderr().count("did not complete within")
    with connect(braid.amqp_port) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        # A Connection.Start-Ok frame declared as 2000 octets, 100 of them sent (the handshake
        # timeout, RabbitMQ's 10 s, would close it too, later).
        sock.sendall(struct.pack(">BHI", 1, 0, 2000) + b"\0" * 100)
        assert closed_by_server(sock)
    wait_for_log(braid, "did not complete within", before + 1)


def test_partial_mqtt_packet_times_out(braid: BraidProcess) -> None:
    before = braid.stderr().count("did not complete within")
    with connect(braid.mqtt_port) as sock:
        # A CONNECT declared as 500 bytes (remaining length 0xF4 0x03), 10 of them sent.
        sock.sendall(b"\x10\xf4\x03" + b"\x00\x04MQTT\x05\x02\x00\x3c")
        assert closed_by_server(sock)
    wait_for_log(braid, "did not complete within", before + 1)


def test_other_kafka_clients_unaffected(braid: BraidProcess) -> None:
    """A producer and a consumer work while a partial request and an over-cap one are open."""
    partial = connect(braid.kafka_port)
    partial.sendall(struct.pack(">i", 80 * 1024 * 1024) + b"\0" * 1024)
    half = connect(braid.kafka_port)
    half.sendall(struct.pack(">i", 4000) + b"\0" * 100)
    try:
        producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
        for i in range(20):
            producer.send("partial-frames-ok", f"m{i}".encode())
        producer.flush(DEADLINE_S)
        producer.close()
        consumer = KafkaConsumer(
            "partial-frames-ok",
            bootstrap_servers=braid.kafka_bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=int(DEADLINE_S * 1000),
        )
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 20:
                break
        consumer.close()
        assert values == [f"m{i}".encode() for i in range(20)]
    finally:
        partial.close()
        half.close()


def test_malformed_http_request_logged(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 21 item 8: an HTTP request with a broken header gets aiohttp's 400 and one log
    line naming the peer."""
    with BraidProcess(tmp_path_factory.mktemp("http"), listeners=("http",)) as braid:
        with connect(braid.http_port) as sock:
            sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\nBroken header\r\n\r\n")
            sock.settimeout(DEADLINE_S)
            assert sock.recv(65536).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        wait_for_log(braid, "http 127.0.0.1: malformed request answered 400")
