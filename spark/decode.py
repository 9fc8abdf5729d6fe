"""Decode a range of one queue of a BraidMQ log into Arrow record batches.

This is the engine behind the ``braid`` data source, usable without Spark: :func:`read_range`
takes a :class:`core.log.LogReader` and yields ``pyarrow.RecordBatch`` es whose schema is
:func:`spark.schema.arrow_schema`.

How, for up to ``DEFAULT_BATCH_ROWS`` entries at a time: index entries
(:mod:`core.log.consumequeue`, 40-byte fixed-width) are viewed as one numpy structured array
straight over the index file's read-only mapping. To check CRCs, the frames they point at are
copied end to end into one buffer (a numpy copy per stretch of adjacent frames, or one Arrow cast
of binary views over the segment mapping when they are scattered) and checked with a single
``crc32c`` call (:func:`_chain_matches`); everything after reads that copy, hot in the cache, or
the mapping itself when checks are off. The 72-byte frame headers (:mod:`core.log.record`) are
gathered by one numpy fancy index over a byte-strided view; variable fields are located by
adding up the header's length fields; each binary/string column is described as an Arrow
binary-view array and copied into one contiguous Arrow buffer by one cast. Python loops per
record only for the rare fields that need parsing (headers, tags; only in batches that have
them), and for Kafka batches and moved (LINKed) records, which are decoded with
:mod:`core.log.record` and :mod:`core.log.batches` (aiokafka's codec: gzip/snappy/lz4/zstd
through cramjam), as is everything when a test asks (:func:`_record_by_record`).

Visibility: only entries of the queue's index are read, so a half message (indexed in
``__half`` only) or a pending delayed record (``__timers`` only) shows up in a user topic once a
LINK record has indexed it there. A Kafka batch indexed into a queue that took only some of its
records (an AMQP queue bound to the topic with ``truck.*``: the batch is stored once, and its
``x-braid-batch-select`` header lists what each such queue took) yields only those records in
that queue's rows, at their offsets there, as the queue's consumers received them. Consistency
with a running writer: the writer appends a frame before its index entry, a frame is CRC-checked
before it is decoded, and entries are accepted only while their offsets are contiguous, so a
torn tail is never returned, only read later.

Thread-safety: readers are cached per data directory and per process; each Spark task runs in
its own Python worker process, so nothing here is shared between threads.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Iterator, Sequence
from functools import cache, cached_property
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from crc32c import crc32c

from core.log import LogReader, consumequeue, names
from core.log import record as rec
from core.log.reader import MAX_LINK_DEPTH
from core.log.txnindex import ABORTED, COMMITTED, OPEN, batch_txn
from spark.readers import known_transactions, refresh, retry_while_files_grow, transactions
from spark.schema import COLUMN_NAMES, arrow_schema

# Rows per Arrow batch yielded: large enough that per-batch costs (IPC framing to the JVM,
# numpy call overhead) vanish, small enough that a batch's frames (copied once to check their
# CRCs, then read column by column) stay in the CPU's caches: 32 Ki rows decode faster than
# 64 Ki or 256 Ki (measured; docs/spark.md, Performance).
DEFAULT_BATCH_ROWS = 32_768
# ... and at most this many bytes of frames (large messages), for the same reason, and far below
# what Arrow's int32 offsets allow in one column; a single larger frame (up to a segment) still
# makes one batch.
DEFAULT_BATCH_BYTES = 8 << 20
# Arrow binary/string columns use int32 offsets: a batch's gathered column must stay below this.
MAX_COLUMN_BYTES = (1 << 31) - 1
# Arrow's binary-view layout: a value of up to 12 bytes is stored inside its 16-byte view; a
# longer one is (4-byte prefix, buffer index, int32 offset) so a segment must stay below 2 GiB.
VIEW_INLINE_BYTES = 12
MAX_SEGMENT_BYTES = (1 << 31) - 1

Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ByteArray = npt.NDArray[np.uint8]

# Names of the fields of core.log.record.HEADER in order (the "x" pad byte has none).
HEADER_FIELDS = (
    "total_size",
    "magic",
    "crc32c",
    "flags",
    "protocol",
    "store_ms",
    "born_ms",
    "deliver_at_ms",
    "queue",
    "record_count",
    "topic_len",
    "subject_len",
    "key_len",
    "headers_len",
    "tags_len",
    "client_len",
    "address_len",
    "dests_len",
    "body_len",
)
NULL_LENGTH = 0xFFFFFFFF  # a key or body length meaning "null" (core.log.record)
# On a Kafka batch record indexed into queues that take only some of its records: JSON
# ``{"<topic>\x00<queue>": [offset deltas]}``, the records each listed queue took (a queue not
# listed took them all). Written by the broker (core.delivery.message.BATCH_SELECT_HEADER, which
# spark/ may not import; a test checks the two names agree); readers of a queue skip the rest.
BATCH_SELECT_HEADER = "x-braid-batch-select"
_NUMPY_CODES = {"B": "u1", "H": "u2", "I": "u4", "Q": "u8", "b": "i1", "h": "i2", "i": "i4"}
_NUMPY_CODES |= {"q": "i8"}


def struct_dtype(layout: struct.Struct, field_names: Sequence[str]) -> np.dtype[Any]:
    """A numpy structured dtype with exactly the byte layout of a little-endian ``struct`` format,
    each field's offset derived with ``calcsize`` of the format before it."""
    fmt = layout.format
    if not fmt.startswith("<"):
        raise ValueError(f"layout {fmt!r} must be little-endian without padding ('<')")
    names: list[str] = []
    formats: list[str] = []
    offsets: list[int] = []
    for index, code in enumerate(fmt[1:], start=1):
        if code == "x":
            continue
        formats.append("<" + _NUMPY_CODES[code])
        offsets.append(struct.calcsize(fmt[:index]))
    if len(field_names) != len(formats):
        raise ValueError(f"{len(field_names)} names for the {len(formats)} fields of {fmt!r}")
    names.extend(field_names)
    return np.dtype(
        {"names": names, "formats": formats, "offsets": offsets, "itemsize": layout.size}
    )


@cache
def entry_dtype() -> np.dtype[Any]:
    return struct_dtype(consumequeue.ENTRY, consumequeue.IndexEntry._fields)


@cache
def header_dtype() -> np.dtype[Any]:
    return struct_dtype(rec.HEADER, HEADER_FIELDS)


@cache
def _protocol_names() -> pa.Array:
    """Protocol byte -> name, for every byte value (``unknown`` outside PROTOCOL_NAMES)."""
    return pa.array([rec.PROTOCOL_NAMES.get(code, "unknown") for code in range(256)], pa.string())


# -- reading a range -------------------------------------------------------------------------


def read_range(
    reader: LogReader,
    topic: str,
    queue: int,
    start: int,
    end: int,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    verify_checksums: bool = True,
    dedupe: bool = False,
    include_aborted: bool = False,
    columns: Sequence[str] = COLUMN_NAMES,
    shard: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of queue ``topic/queue`` with offsets in ``[start, end)`` (clamped to what exists),
    in offset order. A Kafka batch straddling ``start`` or ``end`` contributes only its records
    inside the range, so adjacent ranges never repeat or drop a record. ``reader`` reads shard
    ``shard`` of a cluster's data root (the ``shard`` column), or a single-node directory
    (None).

    With ``dedupe``, a record stored once and indexed into several queues yields a row only in
    its home queue: the first queue it was indexed into when appended (its own topic and queue,
    or the first of its destinations); rows reached through other queues are dropped, and so
    are copies of a record whose home is another shard (``FLAG_COPY``).

    Kafka transactions (user topics; system topics are read as stored): a transactional
    batch's records are rows once its transaction committed, never while it is open, and
    aborted ones only with ``include_aborted``; control batches (COMMIT/ABORT markers) never.
    The range itself is not cut at an open transaction: the source plans ranges that end at
    each queue's Last Stable Offset (:meth:`spark.options.ReadOptions.bounds`).

    ``columns`` (a subset of :data:`spark.schema.COLUMN_NAMES`, in any order) are the columns
    built, so a query that needs only ``value`` does not pay for the others."""
    plan = _Plan(
        topic,
        queue,
        # System queues (``__timers`` holds delayed LINKs) are read as stored, as LogReader does.
        not names.is_system_topic(topic),
        start,
        end,
        batch_rows,
        verify_checksums,
        dedupe,
        include_aborted,
        tuple(columns),
        shard,
    )
    index = reader.queue_index(topic, queue)
    if index is None:
        return
    if end > index.next_offset:
        retry_while_files_grow(index.refresh)
    first, after = reader.queue_bounds(topic, queue)
    start = max(start, first)
    end = min(end, after)
    if start >= end:
        return
    entry_number = index.entry_for_offset(start)
    stop_entry = index.next_entry
    expected_offset: int | None = None
    while entry_number < stop_entry:
        entries = _entries(index, entry_number, min(batch_rows, stop_entry - entry_number))
        too_big = np.cumsum(entries["size"], dtype=np.int64) > DEFAULT_BATCH_BYTES
        if too_big[-1]:
            entries = entries[: max(1, int(np.argmax(too_big)))]
        first_offsets = entries["first_offset"].astype(np.int64)
        counts = entries["record_count"].astype(np.int64)
        # Entries are accepted only while contiguous: a torn tail entry written concurrently
        # breaks the chain and is left for a later read.
        chain = np.empty(len(entries), dtype=np.int64)
        chain[0] = first_offsets[0] if expected_offset is None else expected_offset
        chain[1:] = first_offsets[:-1] + counts[:-1]
        good = (first_offsets == chain) & (entries["size"] >= rec.HEADER_SIZE) & (counts > 0)
        keep = int(np.argmin(good)) if not good.all() else len(entries)
        in_range = int(np.searchsorted(first_offsets[:keep], end, side="left"))
        if in_range == 0:
            return
        entries = entries[:in_range]
        for batch in _decode_entries(reader, plan, entries):
            if batch.num_rows:
                yield batch
        entry_number += in_range
        expected_offset = int(first_offsets[in_range - 1] + counts[in_range - 1])
        if in_range < len(first_offsets):
            return


def _entries(index: consumequeue.ConsumeQueue, first: int, count: int) -> npt.NDArray[Any]:
    """Up to ``count`` entries from ``first``, as a structured view over the index mapping
    (fewer at the end of an index file)."""
    file_number, slot = divmod(first, index.entries_per_file)
    count = min(count, index.entries_per_file - slot)
    buf = index.files[file_number].buf
    offset = slot * consumequeue.ENTRY_SIZE
    return np.frombuffer(buf, dtype=entry_dtype(), count=count, offset=offset)


class _Bytes:
    """Bytes (a commit-log segment's mapping, or a copy of frames) seen several ways, none of
    them a copy: a memoryview, a numpy byte array, an Arrow buffer for binary views, and two
    unaligned numpy views with a stride of one byte (element ``k`` starts at byte ``k``), so one
    fancy index gathers the frame headers (``frames``) or little-endian words (``words``) at any
    list of offsets."""

    __slots__ = ("array", "buffer", "frames", "view", "words")

    def __init__(self, data: memoryview | ByteArray) -> None:
        view = data if isinstance(data, memoryview) else data.data
        if len(view) > MAX_SEGMENT_BYTES:
            raise ValueError(f"segments above {MAX_SEGMENT_BYTES} bytes are not supported")
        self.view = view
        self.array: ByteArray = (
            data if isinstance(data, np.ndarray) else np.frombuffer(view, dtype=np.uint8)
        )
        self.buffer = pa.py_buffer(view)
        self.frames = _byte_strided(data, np.dtype(f"V{rec.HEADER_SIZE}"))
        self.words: npt.NDArray[np.uint32] = _byte_strided(data, np.dtype("<u4"))


def _byte_strided(data: memoryview | ByteArray, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """Every ``dtype``-sized window of ``data``, one per byte offset (no copy; writable when
    ``data`` is)."""
    count = max(0, len(data) - dtype.itemsize + 1)
    return np.ndarray(shape=(count,), dtype=dtype, buffer=data, strides=(1,))


class _Plan(NamedTuple):
    topic: str
    queue: int
    follow_links: bool
    start: int
    end: int
    batch_rows: int
    verify_checksums: bool
    dedupe: bool
    include_aborted: bool
    columns: tuple[str, ...]
    shard: int | None


def _within_seals(
    entries: npt.NDArray[Any], seals: dict[int, int], segment_size: int
) -> npt.NDArray[Any]:
    """``entries`` without those pointing past their segment's seal (a cluster shard's fenced
    owner wrote them after a newer owner took over: core/log/fence.py), as LogReader skips
    them."""
    positions = entries["position"].astype(np.int64)
    keep = np.ones(len(entries), dtype=bool)
    for base, end in seals.items():
        keep &= (positions < end) | (positions >= base + segment_size)
    return entries if keep.all() else entries[keep]


def _runs(keys: npt.NDArray[Any]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of equal consecutive values."""
    cuts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)]
    return list(itertools.pairwise(cuts))


def _decode_entries(
    reader: LogReader, plan: _Plan, entries: npt.NDArray[Any]
) -> Iterator[pa.RecordBatch]:
    commitlog = reader.commitlog
    if commitlog.seals:
        entries = _within_seals(entries, commitlog.seals, commitlog.segment_size)
        if not len(entries):
            return
    positions = entries["position"].astype(np.int64)
    numbers = positions // commitlog.segment_size
    # Positions grow along a queue, so each segment's entries are one contiguous run.
    for low, high in _runs(numbers):
        number = int(numbers[low])
        mapped = commitlog.segments.get(number)
        if mapped is None:
            refresh(reader)
            mapped = commitlog.segments.get(number)
        if mapped is None:
            continue  # deleted by retention while we read: what it held is gone
        segment = _Bytes(mapped.buf)
        run_positions = positions[low:high]
        relative = run_positions - mapped.base
        sizes = entries["size"][low:high].astype(np.int64)
        ends = relative + sizes
        if int(ends.max()) > len(segment.array):
            where = int(np.argmax(ends > len(segment.array)))
            raise rec.CorruptRecordError(
                int(run_positions[where]), "index entry points past the segment"
            )
        # Checking CRCs needs every byte of every frame: they are copied end to end once, and
        # everything after reads that compact copy (in cache) rather than the mapping.
        if plan.verify_checksums:
            source, starts = _copy_frames(segment, relative, sizes)
        else:
            source, starts = segment, relative
        headers = _gather_headers(source, starts)
        _check_frames(headers, sizes, run_positions)
        if plan.verify_checksums and not _chain_matches(source, starts, headers):
            _verify_each(segment, relative, headers, run_positions)
            raise rec.CorruptRecordError(int(run_positions[0]), "crc32c mismatch in a run")
        run_entries = entries[low:high]
        # Kafka batches and LINK entries (a moved record, seen through the LINK with its
        # headers laid over the record's) are decoded record by record; the rest in bulk.
        special = rec.FLAG_BATCH | (rec.FLAG_LINK if plan.follow_links else 0)
        one_by_one = _record_by_record(headers, special)
        for first, stop in _runs(one_by_one) if one_by_one.any() else [(0, high - low)]:
            part = slice(first, stop)
            if one_by_one[first]:
                yield from _record_batches(
                    plan, reader, segment.view, run_entries[part], run_positions[part], mapped.base
                )
            else:
                yield _plain_batch(
                    plan,
                    source,
                    run_entries[part],
                    starts[part],
                    headers[part],
                    run_positions[part],
                )


def _record_by_record(headers: npt.NDArray[Any], special: int) -> BoolArray:
    """Which frames go through the record-by-record decoder (flags in ``special``); the others
    are decoded in bulk, column by column. (Tests force every frame through the former.)"""
    one_by_one: BoolArray = (headers["flags"] & special) != 0
    return one_by_one


def _gather_headers(source: _Bytes, starts: Int64Array) -> npt.NDArray[Any]:
    """The fixed headers of the frames at ``starts``, one structured row each (one numpy gather
    of 72-byte items; the caller has checked every frame lies inside ``source``)."""
    return source.frames[starts].view(header_dtype())


def _check_frames(headers: npt.NDArray[Any], sizes: Int64Array, positions: Int64Array) -> None:
    bad = (headers["magic"] != rec.RECORD_MAGIC) | (headers["total_size"] != sizes)
    if bad.any():
        where = int(np.argmax(bad))
        raise rec.CorruptRecordError(int(positions[where]), "frame does not match its index entry")


# A stretch of adjacent frames is copied with one numpy call (~1 µs); scattered frames are
# gathered by one Arrow cast instead (~25 ns each), unless stretches average this many frames.
ADJACENT_FRAMES_PER_COPY = 64


def _copy_frames(
    segment: _Bytes, relative: Int64Array, sizes: Int64Array
) -> tuple[_Bytes, Int64Array]:
    """The frames at ``relative`` (each inside the segment) copied end to end into a new
    writable buffer, and where each starts in it."""
    ends = relative + sizes
    starts = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    breaks = np.flatnonzero(relative[1:] != ends[:-1]) + 1
    if len(breaks) * ADJACENT_FRAMES_PER_COPY > len(relative) and total <= MAX_COLUMN_BYTES:
        views = np.empty((len(relative), 4), dtype="<i4")
        views[:, 0] = sizes  # >= 72 bytes: data in the segment buffer
        views[:, 1] = sizes  # a frame's first 4 bytes are its size (checked later)
        views[:, 2] = 0
        views[:, 3] = relative
        gathered = pa.Array.from_buffers(
            pa.binary_view(), len(relative), [None, pa.py_buffer(views), segment.buffer]
        ).cast(pa.binary())
        copy = np.frombuffer(gathered.buffers()[2], dtype=np.uint8, count=total)
        if not copy.flags.writeable:  # the cast's fresh buffer is ours to patch, normally
            copy = copy.copy()
        return _Bytes(copy), starts
    copy = np.empty(total, dtype=np.uint8)
    firsts = [0, *breaks.tolist()]
    lasts = [*(breaks - 1).tolist(), len(relative) - 1]
    filled = 0
    for low, high in zip(relative[firsts].tolist(), ends[lasts].tolist(), strict=True):
        copy[filled : filled + high - low] = segment.array[low:high]
        filled += high - low
    return _Bytes(copy), starts


@cache
def chain_mask() -> int:
    """``J`` such that, whatever ``m``, the CRC32C register after ``m + le32(crc32c(m) ^ J)``
    is back at its initial value (and ``crc32c`` of it is 0), so checked messages chain (see
    :func:`_chain_matches`).

    With the register ``r`` after ``m`` (``r == ~crc32c(m)``), feeding the four bytes of ``v``
    leaves ``f(r ^ v)``, where ``f(x)`` is the register after the four bytes of ``x`` from
    zero: a linear bijection of 32-bit values. ``J`` is ``~f⁻¹(0xFFFFFFFF)``, solved here by
    Gaussian elimination over GF(2) from the images of the 32 unit vectors."""
    ones = 0xFFFFFFFF

    def f(x: int) -> int:
        return int(crc32c(x.to_bytes(4, "little"), ones)) ^ ones

    basis: dict[int, tuple[int, int]] = {}  # leading bit -> (image, preimage)
    for bit in range(32):
        image, preimage = f(1 << bit), 1 << bit
        for lead in range(31, -1, -1):
            if not image >> lead & 1:
                continue
            if lead not in basis:
                basis[lead] = (image, preimage)
                break
            image ^= basis[lead][0]
            preimage ^= basis[lead][1]
    target, solution = ones, 0
    for lead in range(31, -1, -1):
        if target >> lead & 1:
            target ^= basis[lead][0]
            solution ^= basis[lead][1]
    return solution ^ ones


def _chain_matches(copy: _Bytes, starts: Int64Array, headers: npt.NDArray[Any]) -> bool:
    """Whether every frame of ``copy`` (frames end to end, from :func:`_copy_frames`) matches
    its stored CRC32C, with one ``crc32c`` call over the whole copy. Overwrites the first 12
    bytes of every frame (size, magic, CRC: already in ``headers``).

    Each frame's checked bytes ``m`` (``[12, total_size)``) are preceded by 12 bytes chosen so
    that, if the frame before matched its stored CRC, the CRC register is back at its initial
    value when ``m`` starts: ``le32(previous stored crc ^ J)``, then ``le32(J)`` twice (which
    keep it there; :func:`chain_mask`). So when every frame matches, the CRC32C of the copy is
    the last frame's stored CRC. A frame that does not match leaves its own non-zero syndrome
    in the register, which every later byte only multiplies by a power of ``x`` modulo the CRC
    polynomial (invertible): corruption confined to one frame of the run is caught exactly
    when that frame's own CRC would catch it; corruptions in several frames could only cancel
    out in one combination of their syndromes in 2^32, and three or fewer flipped bits anywhere
    are always caught (CRC-32C's Hamming distance is 4 up to 2^31 bits; a run is at most
    ``DEFAULT_BATCH_BYTES`` plus one frame)."""
    crcs = headers["crc32c"]
    mask = chain_mask()
    patch = np.full((len(starts), 3), mask, dtype="<u4")
    patch[1:, 0] ^= crcs[:-1]
    _byte_strided(copy.array, np.dtype("V12"))[starts] = patch.view("V12").ravel()
    return int(crc32c(copy.view)) == int(crcs[-1])


def _verify_each(
    segment: _Bytes, relative: Int64Array, headers: npt.NDArray[Any], positions: Int64Array
) -> None:
    """CRC32C of every frame, one C call each (a list comprehension is the cheapest Python loop
    around it), compared in one vector operation; raises on the first mismatch."""
    starts = (relative + rec.CRC_START).tolist()
    ends = (relative + headers["total_size"].astype(np.int64)).tolist()
    view = segment.view
    computed = [crc32c(view[begin:finish]) for begin, finish in zip(starts, ends, strict=True)]
    bad = np.array(computed, dtype=np.uint32) != headers["crc32c"]
    if bad.any():
        raise rec.CorruptRecordError(int(positions[int(np.argmax(bad))]), "crc32c mismatch")


# -- plain records: vectorized ---------------------------------------------------------------


class _Fields:
    """Start and length of each variable field of a run of frames (segment-relative), each
    computed when first asked for: a query reading only ``value`` needs only the body, which
    is the frame's last field (it starts ``body_len`` bytes before the frame's end)."""

    def __init__(self, relative: Int64Array, headers: npt.NDArray[Any]) -> None:
        self.relative = relative
        self.headers = headers

    def _length(self, name: str) -> Int64Array:
        return self.headers[name].astype(np.int64)

    @cached_property
    def key_null(self) -> BoolArray:
        null: BoolArray = self.headers["key_len"] == NULL_LENGTH
        return null

    @cached_property
    def body_null(self) -> BoolArray:
        null: BoolArray = self.headers["body_len"] == NULL_LENGTH
        return null

    @cached_property
    def topic_start(self) -> Int64Array:
        return self.relative + rec.HEADER_SIZE

    @cached_property
    def subject_len(self) -> Int64Array:
        return self._length("subject_len")

    @cached_property
    def subject_start(self) -> Int64Array:
        return self.topic_start + self._length("topic_len")

    @cached_property
    def key_len(self) -> Int64Array:
        return np.where(self.key_null, 0, self._length("key_len"))

    @cached_property
    def key_start(self) -> Int64Array:
        return self.subject_start + self.subject_len

    @cached_property
    def headers_len(self) -> Int64Array:
        return self._length("headers_len")

    @cached_property
    def headers_start(self) -> Int64Array:
        return self.key_start + self.key_len

    @cached_property
    def tags_len(self) -> Int64Array:
        return self._length("tags_len")

    @cached_property
    def tags_start(self) -> Int64Array:
        return self.headers_start + self.headers_len

    @cached_property
    def client_len(self) -> Int64Array:
        return self._length("client_len")

    @cached_property
    def client_start(self) -> Int64Array:
        return self.tags_start + self.tags_len

    @cached_property
    def address_len(self) -> Int64Array:
        return self._length("address_len")

    @cached_property
    def address_start(self) -> Int64Array:
        return self.client_start + self.client_len

    @cached_property
    def dests_len(self) -> Int64Array:
        return self._length("dests_len")

    @cached_property
    def dests_start(self) -> Int64Array:
        return self.address_start + self.address_len

    @cached_property
    def body_len(self) -> Int64Array:
        return np.where(self.body_null, 0, self._length("body_len"))

    @cached_property
    def body_start(self) -> Int64Array:
        return self.relative + self._length("total_size") - self.body_len


def _plain_batch(
    plan: _Plan,
    source: _Bytes,
    entries: npt.NDArray[Any],
    starts: Int64Array,
    headers: npt.NDArray[Any],
    positions: Int64Array,
) -> pa.RecordBatch:
    """Frames starting at ``starts`` in ``source`` (plain ones: no batch, no LINK to follow),
    decoded column by column."""
    fields = _Fields(starts, headers)
    if plan.dedupe:
        home = _home_rows(source, headers, fields, plan.topic, plan.queue)
        home &= (headers["flags"] & rec.FLAG_COPY) == 0  # its home is another shard
        if not home.all():
            keep = np.flatnonzero(home)
            entries, starts, headers = entries[keep], starts[keep], headers[keep]
            positions = positions[keep]
            fields = _Fields(starts, headers)
    rows = len(starts)
    schema = arrow_schema(plan.columns)

    def text(field: str) -> pa.Array:
        lengths = getattr(fields, f"{field}_len")
        if not lengths.any():  # no need to locate the field
            return _empty_binary(rows, pa.string())
        return _gather(source, getattr(fields, f"{field}_start"), lengths, text=True)

    builders: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: _constant_string(plan.topic, rows),
        "queue": lambda: pa.array(np.full(rows, plan.queue, dtype=np.int32)),
        "offset": lambda: pa.array(entries["first_offset"].astype(np.int64)),
        "timestamp": lambda: _timestamps(headers["born_ms"]),
        "key": lambda: _gather(source, fields.key_start, fields.key_len, fields.key_null),
        "value": lambda: _gather(source, fields.body_start, fields.body_len, fields.body_null),
        "headers": lambda: _headers_column(source.array, fields),
        "tags": lambda: _tags_column(source.array, fields),
        "protocol": lambda: _protocols(headers["protocol"]),
        "store_timestamp": lambda: _timestamps(entries["store_ms"]),
        "subject": lambda: text("subject"),
        "origin_address": lambda: text("address"),
        "client_id": lambda: text("client"),
        "flags": lambda: pa.array(headers["flags"].astype(np.int32)),
        "position": lambda: pa.array(positions),
        "shard": lambda: _shard_column(plan.shard, rows),
    }
    return pa.RecordBatch.from_arrays([builders[name]() for name in plan.columns], schema=schema)


def _home_rows(
    segment: _Bytes, headers: npt.NDArray[Any], fields: _Fields, topic: str, queue: int
) -> BoolArray:
    """Which frames have ``topic/queue`` as their home (first index target)."""
    wanted = topic.encode()
    home = np.zeros(len(headers), dtype=np.bool_)
    own = headers["dests_len"] == 0
    candidates = np.flatnonzero(
        own & (headers["queue"] == queue) & (headers["topic_len"] == len(wanted))
    )
    if len(candidates):
        spots = fields.topic_start[candidates, None] + np.arange(len(wanted), dtype=np.int64)
        same = (np.take(segment.array, spots) == np.frombuffer(wanted, np.uint8)).all(axis=1)
        home[candidates[same]] = True
    for row in np.flatnonzero(~own).tolist():
        begin = int(fields.dests_start[row])
        first = rec.decode_destinations(segment.view[begin : begin + int(fields.dests_len[row])])
        home[row] = first[0] == (topic, queue)
    return home


def _shard_column(shard: int | None, rows: int) -> pa.Array:
    if shard is None:
        return pa.nulls(rows, pa.int32())
    return pa.array(np.full(rows, shard, dtype=np.int32))


def _constant_string(value: str, rows: int) -> pa.Array:
    raw = value.encode()
    offsets = np.arange(rows + 1, dtype=np.int64) * len(raw)
    if offsets[-1] > MAX_COLUMN_BYTES:
        raise ValueError("more than 2 GiB in one Arrow column: lower the batch size")
    return pa.Array.from_buffers(
        pa.string(), rows, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(raw * rows)]
    )


def _protocols(codes: npt.NDArray[Any]) -> pa.Array:
    """Protocol names of protocol bytes (usually one protocol per queue)."""
    if len(codes) and (codes == codes[0]).all():
        return _constant_string(rec.PROTOCOL_NAMES.get(int(codes[0]), "unknown"), len(codes))
    return _protocol_names().take(pa.array(codes))


def _empty_binary(
    rows: int, kind: pa.DataType, validity: pa.Buffer | None = None, null_count: int = 0
) -> pa.Array:
    offsets = pa.py_buffer(np.zeros(rows + 1, dtype=np.int32))
    return pa.Array.from_buffers(
        kind, rows, [validity, offsets, pa.py_buffer(b"")], null_count=null_count
    )


def _timestamps(milliseconds: npt.NDArray[Any]) -> pa.Array:
    micros = milliseconds.astype(np.int64) * 1000
    return pa.Array.from_buffers(
        pa.timestamp("us", tz="UTC"), len(micros), [None, pa.py_buffer(micros)]
    )


def _gather(
    segment: _Bytes,
    starts: Int64Array,
    lengths: Int64Array,
    nulls: BoolArray | None = None,
    *,
    text: bool = False,
) -> pa.Array:
    """One binary/string column: the byte ranges ``[start, start + length)`` of a segment.

    The ranges are described as an Arrow binary-view array over the segment mapping (16 bytes
    per row, no copy of the data) and cast to ``kind``: Arrow's C++ cast then copies each value
    into one contiguous buffer."""
    rows = len(starts)
    kind = pa.string() if text else pa.binary()
    validity = None
    null_count = 0
    if nulls is not None:
        null_count = int(np.count_nonzero(nulls))
        if null_count:
            validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    if not lengths.any():
        return _empty_binary(rows, kind, validity, null_count)
    if int(lengths.sum()) > MAX_COLUMN_BYTES:
        raise ValueError("more than 2 GiB in one Arrow column: lower the batch size")
    views = np.zeros((rows, 4), dtype="<i4")
    views[:, 0] = lengths
    inline = lengths <= VIEW_INLINE_BYTES
    if inline.all():
        _inline(views, segment, starts, lengths)
    elif not inline.any():
        _outline(views, segment, starts)
    else:
        chosen = np.flatnonzero(inline)
        views[chosen] = _inline(views[chosen], segment, starts[chosen], lengths[chosen])
        chosen = np.flatnonzero(~inline)
        views[chosen] = _outline(views[chosen], segment, starts[chosen])
    view_kind = pa.string_view() if text else pa.binary_view()
    described = pa.Array.from_buffers(
        view_kind,
        rows,
        [validity, pa.py_buffer(views), segment.buffer],
        null_count=null_count,
    )
    return described.cast(kind)


def _outline(
    views: npt.NDArray[np.int32], segment: _Bytes, starts: Int64Array
) -> npt.NDArray[np.int32]:
    """Values above 12 bytes: (length, first 4 bytes, buffer 0 = the segment, offset)."""
    views[:, 1] = segment.words[starts].view("<i4")
    views[:, 3] = starts
    return views


def _inline(
    views: npt.NDArray[np.int32], segment: _Bytes, starts: Int64Array, lengths: Int64Array
) -> npt.NDArray[np.int32]:
    """Values of at most 12 bytes live inside their view, zero-padded (Arrow's view layout):
    three word gathers, then the bytes past each value's length cleared."""
    words = segment.words
    size = len(segment.array)
    data = np.empty((len(starts), 3), dtype="<u4")
    for word in range(3):
        data[:, word] = words[np.minimum(starts + 4 * word, len(words) - 1)]
    raw = data.view(np.uint8)
    past = np.arange(VIEW_INLINE_BYTES)[None, :] >= lengths[:, None]
    near_end = np.flatnonzero(starts + VIEW_INLINE_BYTES > size)
    if len(near_end):  # the last word was clamped there: those rows byte by byte
        spots = np.minimum(starts[near_end, None] + np.arange(VIEW_INLINE_BYTES), size - 1)
        raw[near_end] = segment.array[spots]
    raw[past] = 0
    views.view(np.uint8).reshape(len(starts), 16)[:, 4:] = raw
    return views


def _headers_column(seg: ByteArray, fields: _Fields) -> pa.Array:
    kind = arrow_schema().field("headers").type
    lengths = fields.headers_len
    if not lengths.any():
        return _empty_lists(len(lengths), kind)
    values = [
        [
            {"key": name, "value": value}
            for name, value in rec.decode_headers(seg[a : a + n].tobytes())
        ]
        if n
        else []
        for a, n in zip(fields.headers_start.tolist(), lengths.tolist(), strict=True)
    ]
    return pa.array(values, kind)


def _tags_column(seg: ByteArray, fields: _Fields) -> pa.Array:
    kind = arrow_schema().field("tags").type
    lengths = fields.tags_len
    if not lengths.any():
        return _empty_lists(len(lengths), kind)
    values = [
        rec.decode_tags(seg[a : a + n].tobytes()) if n else []
        for a, n in zip(fields.tags_start.tolist(), lengths.tolist(), strict=True)
    ]
    return pa.array(values, kind)


def _empty_lists(rows: int, kind: pa.ListType) -> pa.Array:
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(rows + 1, dtype=np.int32)),
        pa.array([], kind.value_type),
        type=kind,
    )


# -- record by record: Kafka batches, moved records -----------------------------------------


def _record_batches(
    plan: _Plan,
    reader: LogReader,
    segment: memoryview,
    entries: npt.NDArray[Any],
    positions: Int64Array,
    base: int,
) -> Iterator[pa.RecordBatch]:
    rows: list[tuple[Any, ...]] = []
    size = 0
    for row in _record_rows(plan, reader, segment, entries, positions, base):
        rows.append(row)
        size += len(row[4] or b"") + len(row[5] or b"")  # key and value
        if len(rows) >= plan.batch_rows or size >= DEFAULT_BATCH_BYTES:
            yield _python_batch(rows, plan.columns)
            rows, size = [], 0
    if rows:
        yield _python_batch(rows, plan.columns)


def _record_rows(
    plan: _Plan,
    reader: LogReader,
    segment: memoryview,
    entries: npt.NDArray[Any],
    positions: Int64Array,
    base: int,
) -> Iterator[tuple[Any, ...]]:
    """Rows in :data:`COLUMN_NAMES` order, decoding each entry's frame with core.log.record and
    each Kafka RecordBatch with core.log.batches (aiokafka's codec)."""
    from core.log.batches import unpack_batch

    for first_offset, store_ms, position, size in zip(
        entries["first_offset"].tolist(),
        entries["store_ms"].tolist(),
        positions.tolist(),
        entries["size"].tolist(),
        strict=True,
    ):
        at = position - base
        frame = segment[at : at + size]
        overlay: dict[str, bytes] = {}
        if plan.follow_links and rec.FLAGS.unpack_from(frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            frame, position = _follow_link(reader, frame, position, overlay)
        record = rec.decode_record(frame, 0, position)
        if plan.dedupe and (
            record.flags & rec.FLAG_COPY or record.index_targets()[0] != (plan.topic, plan.queue)
        ):
            continue
        tail = (
            record.tags,
            record.protocol_name,
            store_ms * 1000,
            record.subject,
            record.address,
            record.client,
            record.flags,
            position,
            plan.shard,
        )
        if not record.flags & rec.FLAG_BATCH:
            if plan.start <= first_offset < plan.end:
                headers = _overlay(record.headers, overlay)
                yield (
                    plan.topic,
                    plan.queue,
                    first_offset,
                    record.born_ms * 1000,
                    record.key,
                    record.body,
                    headers,
                    *tail,
                )
            continue
        if record.flags & rec.FLAG_TXN_CONTROL or record.body is None:
            continue  # a Kafka transaction marker is no record
        if plan.follow_links and not _transaction_shows(plan, reader, record):
            continue
        selected = batch_selection(record.headers, plan.topic, plan.queue)
        for item in unpack_batch(record.body):  # [] for a control batch
            offset = first_offset + item.offset_delta
            if selected is not None and item.offset_delta not in selected:
                continue  # routed elsewhere: this queue never received it
            if plan.start <= offset < plan.end:
                yield (
                    plan.topic,
                    plan.queue,
                    offset,
                    item.timestamp_ms * 1000,
                    item.key,
                    item.value,
                    _overlay(item.headers, overlay),
                    *tail,
                )


def _transaction_shows(plan: _Plan, reader: LogReader, record: rec.Record) -> bool:
    """Whether a Kafka batch's records are rows: not a control batch; a transactional one once
    committed (aborted too with ``include_aborted``), never while open. The outcomes are the
    process's (cached per reader), read again once when a batch's transaction looks open: the
    planner saw the log later than this worker may have."""
    info = batch_txn(record.body)
    if info is None:
        return True
    if info.control:
        return False
    outcomes = known_transactions(reader)
    state = outcomes.outcome(record.topic, record.queue, info.producer_id, record.position)
    if state == OPEN:
        outcomes = transactions(reader)
        state = outcomes.outcome(record.topic, record.queue, info.producer_id, record.position)
    return state == COMMITTED or (plan.include_aborted and state == ABORTED)


def batch_selection(
    headers: Sequence[tuple[str, bytes]], topic: str, queue: int
) -> set[int] | None:
    """The offset deltas of a batch record's records that queue ``topic/queue`` took, from its
    ``x-braid-batch-select`` header; None when it took them all."""
    for name, value in headers:
        if name == BATCH_SELECT_HEADER:
            chosen = json.loads(value).get(f"{topic}\x00{queue}")
            return None if chosen is None else {int(delta) for delta in chosen}
    return None


def _follow_link(
    reader: LogReader, frame: memoryview, position: int, overlay: dict[str, bytes]
) -> tuple[memoryview, int]:
    """The data frame behind a LINK entry and its position; the LINK headers to lay over the
    record's own are collected in ``overlay`` (a record dead-lettered twice is a LINK to a LINK:
    the outer headers win), as :meth:`core.log.LogReader.read` does."""
    for _ in range(MAX_LINK_DEPTH):
        link = rec.decode_record(frame, 0, position)
        for name, value in link.headers:
            overlay.setdefault(name, value)
        ((position, _size),) = rec.decode_link_body(link.body or b"")
        buf, start, size = reader.commitlog.read_frame(position)  # CRC-checked
        frame = buf[start : start + size]
        if not rec.FLAGS.unpack_from(frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            return frame, position
    raise rec.CorruptRecordError(position, "LINK chain too deep")


def _overlay(
    headers: list[tuple[str, bytes]], overlay: dict[str, bytes]
) -> list[dict[str, bytes | str]]:
    if overlay:
        headers = [h for h in headers if h[0] not in overlay] + list(overlay.items())
    return [{"key": name, "value": value} for name, value in headers]


def _python_batch(rows: list[tuple[Any, ...]], columns: tuple[str, ...]) -> pa.RecordBatch:
    """Rows in :data:`COLUMN_NAMES` order -> a batch of ``columns``."""
    schema = arrow_schema(columns)
    arrays = []
    for field in schema:
        at = COLUMN_NAMES.index(field.name)
        arrays.append(pa.array([row[at] for row in rows], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def empty_batch(columns: Sequence[str] = COLUMN_NAMES) -> pa.RecordBatch:
    schema = arrow_schema(tuple(columns))
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


__all__ = [
    "BATCH_SELECT_HEADER",
    "DEFAULT_BATCH_ROWS",
    "batch_selection",
    "empty_batch",
    "read_range",
]
