"""Hand-written encoders for the two hot responses: Produce (v3-v10) and Fetch (v4-v12).

Everything else is encoded by kio (``entities`` + ``codec.encode_response``). These two answer
most requests of a busy broker and carry the records, so they are written directly into a list
of parts joined once: the record sets of a Fetch are copied exactly once, from the log's
memory map into the response frame (kio would copy them three times), and a Produce response
costs a few microseconds instead of ~150. The output is byte for byte kio's (the tests compare
every supported version).

Layouts (https://kafka.apache.org/protocol, ``ProduceResponse.json``, ``FetchResponse.json``);
a version is *flexible* from Produce v9 / Fetch v12: arrays and strings are compact (uvarint
length + 1, 0 = null) and every structure ends with its tagged fields: none, but for KIP-951's
in Produce v10 (``current_leader``, tag 0 of a partition, and ``node_endpoints``, tag 0 of the
response), sent, as Kafka sends them, only for partitions answered NOT_LEADER_OR_FOLLOWER whose
leader is known (a tagged field is written only when it differs from its default). Frames
start with the size, then the response header: correlation id, plus an empty tag buffer for
flexible versions.

Produce response::

    responses [name string, partitions [index i32, error_code i16, base_offset i64,
        log_append_time_ms i64, log_start_offset i64 (v5+), record_errors [] (v8+),
        error_message nullable string (v8+),
        tag 0 (v10+): current_leader {leader_id i32, leader_epoch i32}]], throttle_time_ms i32,
    tag 0 (v10+): node_endpoints [node_id i32, host string, port i32, rack nullable string]

Fetch response::

    throttle_time_ms i32, error_code i16 (v7+), session_id i32 (v7+),
    responses [topic string, partitions [partition_index i32, error_code i16,
        high_watermark i64, last_stable_offset i64, log_start_offset i64 (v5+),
        aborted_transactions nullable [producer_id i64, first_offset i64],
        preferred_read_replica i32 (v11+), records nullable bytes]]
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_SIZE_AND_CORRELATION: Final = struct.Struct(">ii")
_PRODUCE_PARTITION: Final = struct.Struct(">ihqq")  # index, error, base offset, append time
_I64: Final = struct.Struct(">q")
_FETCH_PARTITION: Final = struct.Struct(">ihqq")  # index, error, high watermark, LSO
_ABORTED: Final = struct.Struct(">qq")
_NO_TAGS: Final = b"\x00"
PRODUCE_FIRST_FLEXIBLE: Final = 9
# KIP-951's tagged fields: ProduceResponse v10+.
PRODUCE_FIRST_CURRENT_LEADER: Final = 10
_CURRENT_LEADER_TAG: Final = 0
_NODE_ENDPOINTS_TAG: Final = 0
_LEADER_ID_AND_EPOCH: Final = struct.Struct(">ii")
FETCH_FIRST_FLEXIBLE: Final = 12


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str, flexible: bool) -> bytes:
    raw = text.encode()
    if flexible:
        return uvarint(len(raw) + 1) + raw
    return _I16.pack(len(raw)) + raw


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else _I16.pack(-1)
    return _string(text, flexible)


def _array_length(count: int | None, flexible: bool) -> bytes:
    if count is None:
        return b"\x00" if flexible else _I32.pack(-1)
    return uvarint(count + 1) if flexible else _I32.pack(count)


def _frame(parts: list[Any], correlation_id: int, flexible: bool) -> bytes:
    """Join the body parts behind the size prefix and the response header: one copy."""
    tags = _NO_TAGS if flexible else b""
    size = 4 + len(tags) + sum(len(part) for part in parts)
    parts[0:0] = [_SIZE_AND_CORRELATION.pack(size, correlation_id), tags]
    return b"".join(parts)


class ProducePartition(NamedTuple):
    partition: int
    error_code: int
    base_offset: int
    log_start_offset: int
    error_message: str | None = None
    # KIP-951 (v10+): the partition's leader and its epoch, for NOT_LEADER_OR_FOLLOWER.
    current_leader: tuple[int, int] | None = None


class NodeEndpoint(NamedTuple):
    """A broker named by a ``current_leader`` (KIP-951's ``node_endpoints``)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def _tagged(tag: int, data: bytes) -> bytes:
    """One tagged field: tag, size, data (all flexible: uvarints)."""
    return uvarint(tag) + uvarint(len(data)) + data


def _node_endpoints(endpoints: Sequence[NodeEndpoint]) -> bytes:
    parts = [_array_length(len(endpoints), True)]
    for endpoint in endpoints:
        parts.append(_I32.pack(endpoint.node_id))
        parts.append(_string(endpoint.host, True))
        parts.append(_I32.pack(endpoint.port))
        parts.append(_nullable_string(endpoint.rack, True))
        parts.append(_NO_TAGS)
    return b"".join(parts)


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[ProducePartition]]],
    throttle_time_ms: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> bytes:
    flexible = version >= PRODUCE_FIRST_FLEXIBLE
    leaders = version >= PRODUCE_FIRST_CURRENT_LEADER
    parts: list[Any] = [_array_length(len(topics), flexible)]
    for name, partitions in topics:
        parts.append(_string(name, flexible))
        parts.append(_array_length(len(partitions), flexible))
        for partition in partitions:
            parts.append(
                _PRODUCE_PARTITION.pack(
                    partition.partition, partition.error_code, partition.base_offset, -1
                )
            )
            if version >= 5:
                parts.append(_I64.pack(partition.log_start_offset))
            if version >= 8:
                parts.append(_array_length(0, flexible))  # record_errors
                parts.append(_nullable_string(partition.error_message, flexible))
            current_leader = partition.current_leader
            if leaders and current_leader is not None and current_leader != (-1, -1):
                leader = _LEADER_ID_AND_EPOCH.pack(*current_leader) + _NO_TAGS
                parts.append(b"\x01" + _tagged(_CURRENT_LEADER_TAG, leader))
            elif flexible:
                parts.append(_NO_TAGS)
        if flexible:
            parts.append(_NO_TAGS)
    parts.append(_I32.pack(throttle_time_ms))
    if leaders and node_endpoints:
        parts.append(b"\x01" + _tagged(_NODE_ENDPOINTS_TAG, _node_endpoints(node_endpoints)))
    elif flexible:
        parts.append(_NO_TAGS)
    return _frame(parts, correlation_id, flexible)


class FetchPartition(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    # None: null (read_uncommitted); () an empty list (read_committed)
    aborted_transactions: Sequence[tuple[int, int]] | None
    records: Sequence[Any]  # parts of the record set (bytes, memoryviews), joined once
    records_size: int


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartition]]],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> bytes:
    flexible = version >= FETCH_FIRST_FLEXIBLE
    parts: list[Any] = [_I32.pack(throttle_time_ms)]
    if version >= 7:
        parts.append(_I16.pack(error_code))
        parts.append(_I32.pack(session_id))
    parts.append(_array_length(len(topics), flexible))
    for name, partitions in topics:
        parts.append(_string(name, flexible))
        parts.append(_array_length(len(partitions), flexible))
        for partition in partitions:
            parts.append(
                _FETCH_PARTITION.pack(
                    partition.partition_index,
                    partition.error_code,
                    partition.high_watermark,
                    partition.last_stable_offset,
                )
            )
            if version >= 5:
                parts.append(_I64.pack(partition.log_start_offset))
            aborted = partition.aborted_transactions
            parts.append(_array_length(None if aborted is None else len(aborted), flexible))
            for producer_id, first_offset in aborted or ():
                parts.append(_ABORTED.pack(producer_id, first_offset))
                if flexible:
                    parts.append(_NO_TAGS)
            if version >= 11:
                parts.append(_I32.pack(-1))  # preferred_read_replica
            size = partition.records_size
            parts.append(uvarint(size + 1) if flexible else _I32.pack(size))
            parts.extend(partition.records)
            if flexible:
                parts.append(_NO_TAGS)
        if flexible:
            parts.append(_NO_TAGS)
    if flexible:
        parts.append(_NO_TAGS)
    return _frame(parts, correlation_id, flexible)
