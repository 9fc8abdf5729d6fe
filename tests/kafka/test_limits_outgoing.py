"""Issue 21 item 4 (Kafka): a client that pipelines Fetch requests and never reads the
responses. Every request of a read was answered before the read returned, so one read of
pipelined Fetch requests made the broker encode and buffer a response for each of them. Kafka
mutes a channel while its response is not sent; BraidMQ stops handling a connection's requests
while its write buffer is above the write high-water mark (at most ``[limits]
max_outgoing_buffer_bytes``), and drops it after ``stalled_client_timeout_s`` there.

One broker with a 2 s stall timeout: a raw socket with a small receive window sends 2,000
Fetch requests for a partition holding ~100 KB in one write and reads nothing. What the broker
encoded for it (``braid_kafka_response_bytes_total``: every response, sent or buffered) stays
within the socket buffers and a few responses instead of 2,000 responses (~200 MB); another
client is served meanwhile; the staller is disconnected no earlier than the timeout, with the
log line."""

from __future__ import annotations

import datetime
import re
import socket
import time
from collections.abc import Iterator

import pytest
from kafka import KafkaProducer
from kio.schema.fetch.v4 import request as fetch_v4
from kio.schema.metadata.v1.request import MetadataRequest
from kio.schema.types import TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from tests.braid_process import BraidProcess
from tests.faults.volume import metrics
from tests.kafka.conftest import unique
from tests.kafka.raw import RawClient, encode_request

STALL_TIMEOUT_S = 2.0  # [limits] stalled_client_timeout_s
RECORDS = 100  # of VALUE each: one Fetch response holds them all (~100 KB)
VALUE = b"v" * 1000
FETCHES = 2000  # pipelined: ~200 MB of responses if every one were encoded
# What the broker may have encoded for the staller: the kernel's socket buffers on both sides
# (the server's send buffer autotunes up to net.ipv4.tcp_wmem's 4 MiB), the transport's 64 KiB
# write high-water mark, and the responses of the read that crossed it.
ENCODED_BOUND = 16 * 1024 * 1024
DEADLINE_S = 30.0  # only against hangs


@pytest.fixture(scope="module")
def stall_braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("stall")
    config = path / "braid.toml"
    config.write_text(f"[limits]\nstalled_client_timeout_s = {STALL_TIMEOUT_S}\n")
    with BraidProcess(
        path, listeners=("kafka", "http"), extra_args=("--config", str(config))
    ) as process:
        yield process


def _response_bytes(braid: BraidProcess) -> int:
    found = re.search(r"^braid_kafka_response_bytes_total (\d+)", metrics(braid.http_port), re.M)
    assert found is not None
    return int(found.group(1))


def _fetch(topic: str) -> fetch_v4.FetchRequest:
    return fetch_v4.FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=0)),
        min_bytes=i32(0),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            fetch_v4.FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    fetch_v4.FetchPartition(
                        partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)
                    ),
                ),
            ),
        ),
    )


def _stall_lines(braid: BraidProcess) -> list[str]:
    return [line for line in braid.stderr().splitlines() if "stalled_client_timeout_s" in line]


def test_pipelined_fetches_never_read_are_bounded_and_dropped(
    stall_braid: BraidProcess,
) -> None:
    topic = unique("stall")
    producer = KafkaProducer(bootstrap_servers=stall_braid.kafka_bootstrap)
    try:
        for _ in range(RECORDS):
            producer.send(topic, VALUE)
        producer.flush(timeout=DEADLINE_S)
    finally:
        producer.close(timeout=DEADLINE_S)
    bystander = RawClient(stall_braid.host, stall_braid.kafka_port, timeout=DEADLINE_S)
    staller = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        one = bystander.request(_fetch(topic))
        records = one.responses[0].partitions[0].records
        assert records is not None
        assert len(records) >= RECORDS * len(VALUE)  # one response holds them all
        before = _response_bytes(stall_braid)
        staller.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        staller.settimeout(DEADLINE_S)
        staller.connect((stall_braid.host, stall_braid.kafka_port))
        started = time.monotonic()
        staller.sendall(b"".join(encode_request(_fetch(topic), n) for n in range(FETCHES)))
        # Served meanwhile: the other connection's requests.
        for _ in range(3):
            assert bystander.request(MetadataRequest(topics=None)).brokers
            assert bystander.request(_fetch(topic)).responses[0].partitions[0].records
            time.sleep(0.2)
        deadline = time.monotonic() + DEADLINE_S
        while not _stall_lines(stall_braid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _stall_lines(stall_braid)
        assert time.monotonic() - started >= STALL_TIMEOUT_S
        encoded = _response_bytes(stall_braid) - before
        assert encoded < ENCODED_BOUND, f"{encoded} bytes of responses for the staller"
        # What the kernel holds still comes, then the end (a reset: the broker aborted it).
        closed = False
        try:
            while staller.recv(1 << 20):
                pass
            closed = True
        except ConnectionResetError:
            closed = True
        assert closed
        assert bystander.request(MetadataRequest(topics=None)).brokers
    finally:
        staller.close()
        bystander.close()
