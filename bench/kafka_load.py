"""``python -m bench.kafka_load``: a lean Kafka load producer, run as its own process.

Why: on a 2-core machine a Python process driving librdkafka (confluent-kafka) spends ~0.9 µs
of CPU per 100-byte record even with ``produce_batch``, so it saturates before the broker does
(docs/kafka.md, "Benchmark"). This producer spends almost nothing per record, so what the
benchmark measures is the broker; and it runs in its own process, so the broker's CPU and the
client's are measured apart.

What it sends, on one TCP connection (``TCP_NODELAY``):

1. ApiVersions v0; the broker must take Produce v7 (aiokafka's version; BraidMQ takes 3-10,
   librdkafka sends 10, kafka-python 9);
2. ``--records`` records as Produce v7 requests (``acks=-1``, no transactional id, one topic,
   partition 0), each carrying ONE RecordBatch of ``--per-batch`` records of ``--size`` bytes
   (magic 2, no compression, producer id -1, so no idempotence), with up to ``--in-flight``
   requests outstanding (librdkafka's ``max.in.flight`` defaults to 5). When ``--per-batch``
   does not divide ``--records`` the last request carries the remainder.

Every response is read and checked: its correlation id is the oldest outstanding one, its
topic and partition are the ones sent, the partition's error_code is 0, and each base offset is
the previous one plus the previous batch's record count. Any failure, and any socket operation
taking longer than ``--timeout``, ends the program with status 1 and a message on stderr.

The batches are built once, before the clock starts (``gateway.kafka.records.build_batch``),
and the same bytes are sent again and again; only the correlation id changes. That is
legitimate for measuring the broker: BraidMQ stores each batch as received (never re-encoded,
``gateway/kafka/produce.py``), so its work per request (receive, CRC-32C check, header search,
append, fsync for acks=-1) is the same whether the client encoded the records once or every
time. Encoding records is client work, which is exactly what this producer leaves out. Every
batch therefore carries the same records: record i of a batch has the value
``record_value(i, size)`` and the timestamp of the moment the batch was built.

Output: one JSON line on stdout, ``{"records", "requests", "per_batch", "size", "in_flight",
"seconds", "cpu_seconds", "first_offset"}``; ``seconds`` is the wall time from the first
Produce sent to the last response read, ``cpu_seconds`` this process's CPU time (user +
system) over the same span. With ``--wait`` it connects, checks ApiVersions and builds the
batches, then prints ``ready`` and waits for a line on stdin before starting the clock, so that
a caller can read the broker's CPU time around exactly the timed part.
"""

from __future__ import annotations

import argparse
import collections
import json
import select
import socket
import struct
import sys
import time
from typing import Final

from gateway.kafka.records import RecordInput, build_batch

PRODUCE: Final = 0
API_VERSIONS: Final = 18
PRODUCE_VERSION: Final = 7
ACKS_ALL: Final = -1
CLIENT_ID: Final = b"braid-bench-load"
# Broker-side wait for acks=-1 (the request's timeout_ms).
PRODUCE_TIMEOUT_MS: Final = 30_000

# Request header v1: size, api_key, api_version, correlation_id, client_id (int16 length).
_HEADER: Final = struct.Struct(">ihhih")
CORRELATION_AT: Final = 8  # offset of the correlation id in a frame
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_API_VERSION: Final = struct.Struct(">hhh")  # api_key, min_version, max_version
# Produce v7 partition response: index, error_code, base_offset, log_append_time_ms,
# log_start_offset.
_PRODUCE_PARTITION: Final = struct.Struct(">ihqqq")

# Hex digits (the confluent-kafka rounds of bench/kafka.py send hex too), deterministic so
# that a test can check what arrived.
_FILLER: Final = (bytes(range(256)).hex() * 4).encode()


class LoadError(Exception):
    """The broker answered something other than success, or out of order."""


def record_value(index: int, size: int) -> bytes:
    """The value of record ``index`` of every batch: its index, then filler, ``size`` bytes."""
    value = b"%08d " % index
    while len(value) < size:
        value += _FILLER
    return value[:size]


def request_frame(api_key: int, api_version: int, body: bytes) -> bytearray:
    """A request frame with correlation id 0 (patched at ``CORRELATION_AT`` before sending)."""
    size = _HEADER.size - 4 + len(CLIENT_ID) + len(body)
    header = _HEADER.pack(size, api_key, api_version, 0, len(CLIENT_ID))
    return bytearray(header + CLIENT_ID + body)


def produce_frame(topic: str, batch: bytes) -> bytearray:
    """Produce v7 of one batch to partition 0: transactional_id null, acks, timeout_ms,
    topic_data [name, partition_data [index, records]] (non-flexible encoding)."""
    name = topic.encode()
    body = b"".join(
        [
            struct.pack(">hhi", -1, ACKS_ALL, PRODUCE_TIMEOUT_MS),
            struct.pack(">ih", 1, len(name)),
            name,
            struct.pack(">iii", 1, 0, len(batch)),
            batch,
        ]
    )
    return request_frame(PRODUCE, PRODUCE_VERSION, body)


class Connection:
    def __init__(self, bootstrap: str, timeout: float) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.settimeout(timeout)  # every send and receive below
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, frame: bytearray, correlation_id: int) -> None:
        _I32.pack_into(frame, CORRELATION_AT, correlation_id)
        self.sock.sendall(frame)

    def read_exactly(self, size: int) -> bytes:
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            count = self.sock.recv_into(view[got:])
            if count == 0:
                raise LoadError("the broker closed the connection")
            got += count
        return bytes(data)

    def receive(self, correlation_id: int) -> bytes:
        """The next response frame's body after the (v0) response header, which must answer
        ``correlation_id``."""
        (size,) = _I32.unpack(self.read_exactly(4))
        frame = self.read_exactly(size)
        (answered,) = _I32.unpack_from(frame)
        if answered != correlation_id:
            raise LoadError(f"response to request {answered}, expected {correlation_id}")
        return frame[4:]

    def close(self) -> None:
        self.sock.close()


def check_api_versions(connection: Connection) -> None:
    """ApiVersions v0: the broker must list Produce with PRODUCE_VERSION in its range."""
    connection.send(request_frame(API_VERSIONS, 0, b""), 1)
    body = connection.receive(1)
    (error,) = _I16.unpack_from(body)
    if error:
        raise LoadError(f"ApiVersions error_code {error}")
    (count,) = _I32.unpack_from(body, 2)
    for i in range(count):
        key, low, high = _API_VERSION.unpack_from(body, 6 + i * _API_VERSION.size)
        if key == PRODUCE:
            if not low <= PRODUCE_VERSION <= high:
                raise LoadError(f"the broker takes Produce v{low}-v{high}, not v{PRODUCE_VERSION}")
            return
    raise LoadError("the broker does not list Produce in ApiVersions")


def produce_base_offset(body: bytes, topic: str) -> int:
    """The base offset of a Produce v7 response to one batch for ``topic`` partition 0."""
    (topics, name_length) = struct.unpack_from(">ih", body)
    name = body[6 : 6 + name_length].decode()
    at = 6 + name_length
    (partitions,) = _I32.unpack_from(body, at)
    if topics != 1 or partitions != 1 or name != topic:
        raise LoadError(f"unexpected response: {topics} topic(s) {name!r}, {partitions} partitions")
    index, error, base_offset, _, _ = _PRODUCE_PARTITION.unpack_from(body, at + 4)
    if index != 0 or error != 0:
        raise LoadError(f"{topic}/{index}: error_code {error}")
    return int(base_offset)


def run(args: argparse.Namespace) -> dict[str, float | int]:
    if args.records < 1 or args.per_batch < 1 or args.in_flight < 1 or args.size < 0:
        raise LoadError("--records, --per-batch, --in-flight must be positive, --size >= 0")
    full, rest = divmod(args.records, args.per_batch)
    # (frame, records in it) per request, each batch built once.
    frames: list[tuple[bytearray, int]] = []
    for count, requests in ((args.per_batch, full), (rest, 1 if rest else 0)):
        if requests:
            records: list[RecordInput] = [
                (None, None, record_value(i, args.size), []) for i in range(count)
            ]
            frame = produce_frame(args.topic, build_batch(records))
            frames += [(frame, count)] * requests
    connection = Connection(args.bootstrap, args.timeout)
    try:
        check_api_versions(connection)
        if args.wait:
            print("ready", flush=True)
            readable, _, _ = select.select([sys.stdin], [], [], args.timeout)
            if not readable:
                raise LoadError(f"no go on stdin within {args.timeout:g} s")
            sys.stdin.readline()
        pending: collections.deque[tuple[int, int]] = collections.deque()  # (correlation, count)
        sent = 0
        first_offset = -1
        expected: int | None = None
        cpu_start = time.process_time()
        started = time.perf_counter()
        while sent < len(frames) or pending:
            while sent < len(frames) and len(pending) < args.in_flight:
                frame, count = frames[sent]
                sent += 1
                connection.send(frame, sent + 1)  # 1 was ApiVersions
                pending.append((sent + 1, count))
            correlation_id, count = pending.popleft()
            base_offset = produce_base_offset(connection.receive(correlation_id), args.topic)
            if expected is None:
                first_offset = base_offset
            if base_offset < 0 or (expected is not None and base_offset != expected):
                raise LoadError(f"base offset {base_offset}, expected {expected}")
            expected = base_offset + count
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_start
    finally:
        connection.close()
    return {
        "records": args.records,
        "requests": len(frames),
        "per_batch": args.per_batch,
        "size": args.size,
        "in_flight": args.in_flight,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "first_offset": first_offset,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kafka_load", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap", required=True, help="host:port of the broker")
    parser.add_argument("--topic", required=True, help="an existing topic (partition 0)")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--per-batch", type=int, default=1000, help="records per request")
    parser.add_argument("--in-flight", type=int, default=5, help="requests outstanding")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per socket wait")
    parser.add_argument("--wait", action="store_true", help="print ready, wait for stdin")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        report = run(args)
    except (LoadError, OSError, struct.error, UnicodeDecodeError) as exc:
        print(f"kafka_load: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
