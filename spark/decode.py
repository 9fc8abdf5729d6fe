"""Decode a range of one queue of a BraidMQ log into Arrow record batches.

This is the engine behind the ``braid`` data source, usable without Spark: :func:`read_range`
takes a :class:`core.log.LogReader` and yields ``pyarrow.RecordBatch`` es whose schema is
:func:`spark.schema.arrow_schema`.

How: index entries (:mod:`core.log.consumequeue`, 40-byte fixed-width) are viewed as one numpy
structured array straight over the index file's read-only mapping; the 72-byte frame headers
(:mod:`core.log.record`) they point at are described as an Arrow binary-view array over the
commit-log segment mapping and copied out by one Arrow cast; variable fields are located by
adding up the header's length fields; each binary/string column is gathered the same way into
one contiguous Arrow buffer. Python loops per record only to verify each frame's CRC32C (one C
call each), for the rare fields that need parsing (headers, tags), and for Kafka batches and
moved (LINKed) records, which are decoded with :mod:`core.log.record` and
:mod:`core.log.batches` (aiokafka's codec: gzip/snappy/lz4/zstd through cramjam).

Visibility: only entries of the queue's index are read, so a half message (indexed in
``__half`` only) or a pending delayed record (``__timers`` only) shows up in a user topic once a
LINK record has indexed it there. Consistency with a running writer: the writer appends a frame
before its index entry, a frame is CRC-checked before it is decoded, and entries are accepted
only while their offsets are contiguous, so a torn tail is never returned, only read later.

Thread-safety: readers are cached per data directory and per process; each Spark task runs in
its own Python worker process, so nothing here is shared between threads.
"""

from __future__ import annotations

import itertools
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
from spark.readers import refresh, retry_while_files_grow
from spark.schema import COLUMN_NAMES, arrow_schema

# Rows per Arrow batch yielded: large enough that per-batch costs (IPC framing to the JVM,
# numpy call overhead) vanish, small enough that a gathered value buffer (rows x value size)
# stays in the tens of MiB and int32 Arrow offsets cannot overflow for values up to 32 KiB each.
DEFAULT_BATCH_ROWS = 65_536
# ... and at most this many bytes of frames (large messages), far below what Arrow's int32
# offsets allow in one column; a single larger frame (up to a segment) still makes one batch.
DEFAULT_BATCH_BYTES = 64 << 20
# Arrow binary/string columns use int32 offsets: a batch's gathered column must stay below this.
MAX_COLUMN_BYTES = (1 << 31) - 1
# Arrow's binary-view layout: a value of up to 12 bytes is stored inside its 16-byte view; a
# longer one is (4-byte prefix, buffer index, int32 offset) so a segment must stay below 2 GiB.
VIEW_INLINE_BYTES = 12
VIEW_PREFIX_BYTES = 4
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
    columns: Sequence[str] = COLUMN_NAMES,
) -> Iterator[pa.RecordBatch]:
    """Rows of queue ``topic/queue`` with offsets in ``[start, end)`` (clamped to what exists),
    in offset order. A Kafka batch straddling ``start`` or ``end`` contributes only its records
    inside the range, so adjacent ranges never repeat or drop a record.

    With ``dedupe``, a record stored once and indexed into several queues yields a row only in
    its home queue: the first queue it was indexed into when appended (its own topic and queue,
    or the first of its destinations); rows reached through other queues are dropped.

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
        tuple(columns),
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


class _Segment:
    """One commit-log segment mapping seen three ways: bytes for CRC checks and Kafka batches, a
    numpy array for gathers, an Arrow buffer for binary views (none of them copies)."""

    __slots__ = ("array", "base", "buffer", "view")

    def __init__(self, view: memoryview, base: int) -> None:
        if len(view) > MAX_SEGMENT_BYTES:
            raise ValueError(f"segments above {MAX_SEGMENT_BYTES} bytes are not supported")
        self.view = view
        self.base = base
        self.array: ByteArray = np.frombuffer(view, dtype=np.uint8)
        self.buffer = pa.py_buffer(view)


class _Plan(NamedTuple):
    topic: str
    queue: int
    follow_links: bool
    start: int
    end: int
    batch_rows: int
    verify_checksums: bool
    dedupe: bool
    columns: tuple[str, ...]


def _runs(keys: npt.NDArray[Any]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of equal consecutive values."""
    cuts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)]
    return list(itertools.pairwise(cuts))


def _decode_entries(
    reader: LogReader, plan: _Plan, entries: npt.NDArray[Any]
) -> Iterator[pa.RecordBatch]:
    commitlog = reader.commitlog
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
        segment = _Segment(mapped.buf, mapped.base)
        relative = positions[low:high] - segment.base
        sizes = entries["size"][low:high].astype(np.int64)
        headers = _gather_headers(segment, relative, sizes)
        _check_frames(segment, relative, headers, sizes)
        if plan.verify_checksums:
            _verify_checksums(segment, relative, headers)
        run_entries = entries[low:high]
        # Kafka batches and LINK entries (a moved record, seen through the LINK with its
        # headers laid over the record's) are decoded record by record; the rest in bulk.
        special = rec.FLAG_BATCH | (rec.FLAG_LINK if plan.follow_links else 0)
        one_by_one = (headers["flags"] & special) != 0
        for first, stop in _runs(one_by_one) if one_by_one.any() else [(0, high - low)]:
            part = slice(first, stop)
            if one_by_one[first]:
                yield from _record_batches(plan, reader, segment, run_entries[part], relative[part])
            else:
                yield _plain_batch(plan, segment, run_entries[part], relative[part], headers[part])


def _gather_headers(segment: _Segment, relative: Int64Array, sizes: Int64Array) -> npt.NDArray[Any]:
    """The fixed headers of the frames at ``relative`` positions, one structured row each."""
    size = rec.HEADER_SIZE
    if len(relative) and int(relative.max()) + size > len(segment.array):
        raise rec.CorruptRecordError(int(relative.max()), "index entry points past the segment")
    lengths = np.full(len(relative), size, dtype=np.int64)
    gathered = _gather(segment, relative, lengths, prefixes=sizes)
    data = gathered.buffers()[2]
    return np.frombuffer(data, dtype=header_dtype(), count=len(relative))


def _check_frames(
    segment: _Segment, relative: Int64Array, headers: npt.NDArray[Any], sizes: Int64Array
) -> None:
    totals = headers["total_size"].astype(np.int64)
    bad = (headers["magic"] != rec.RECORD_MAGIC) | (totals != sizes)
    bad |= relative + totals > len(segment.array)
    if bad.any():
        where = int(np.argmax(bad))
        raise rec.CorruptRecordError(
            segment.base + int(relative[where]), "frame does not match its index entry"
        )


def _verify_checksums(segment: _Segment, relative: Int64Array, headers: npt.NDArray[Any]) -> None:
    """CRC32C of every frame (one C call each; a list comprehension is the cheapest Python loop
    around it), compared in one vector operation."""
    starts = (relative + rec.CRC_START).tolist()
    ends = (relative + headers["total_size"].astype(np.int64)).tolist()
    view = segment.view
    computed = [crc32c(view[begin:finish]) for begin, finish in zip(starts, ends, strict=True)]
    bad = np.array(computed, dtype=np.uint32) != headers["crc32c"]
    if bad.any():
        where = int(np.argmax(bad))
        raise rec.CorruptRecordError(segment.base + int(relative[where]), "crc32c mismatch")


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
    segment: _Segment,
    entries: npt.NDArray[Any],
    relative: Int64Array,
    headers: npt.NDArray[Any],
) -> pa.RecordBatch:
    fields = _Fields(relative, headers)
    if plan.dedupe:
        home = _home_rows(segment, headers, fields, plan.topic, plan.queue)
        if not home.all():
            keep = np.flatnonzero(home)
            entries, relative, headers = entries[keep], relative[keep], headers[keep]
            fields = _Fields(relative, headers)
    rows = len(relative)
    schema = arrow_schema(plan.columns)
    array = segment.array
    builders: dict[str, Callable[[], pa.Array]] = {
        "topic": lambda: _constant_string(plan.topic, rows),
        "queue": lambda: pa.array(np.full(rows, plan.queue, dtype=np.int32)),
        "offset": lambda: pa.array(entries["first_offset"].astype(np.int64)),
        "timestamp": lambda: _timestamps(headers["born_ms"]),
        "key": lambda: _gather(segment, fields.key_start, fields.key_len, fields.key_null),
        "value": lambda: _gather(segment, fields.body_start, fields.body_len, fields.body_null),
        "headers": lambda: _headers_column(array, fields.headers_start, fields.headers_len),
        "tags": lambda: _tags_column(array, fields.tags_start, fields.tags_len),
        "protocol": lambda: _protocol_names().take(pa.array(headers["protocol"])),
        "store_timestamp": lambda: _timestamps(entries["store_ms"]),
        "subject": lambda: _gather(segment, fields.subject_start, fields.subject_len, text=True),
        "origin_address": lambda: _gather(
            segment, fields.address_start, fields.address_len, text=True
        ),
        "client_id": lambda: _gather(segment, fields.client_start, fields.client_len, text=True),
        "flags": lambda: pa.array(headers["flags"].astype(np.int32)),
        "position": lambda: pa.array(relative + segment.base),
    }
    return pa.RecordBatch.from_arrays([builders[name]() for name in plan.columns], schema=schema)


def _home_rows(
    segment: _Segment, headers: npt.NDArray[Any], fields: _Fields, topic: str, queue: int
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


def _constant_string(value: str, rows: int) -> pa.Array:
    return pa.array([value], pa.string()).take(pa.array(np.zeros(rows, dtype=np.int32)))


def _timestamps(milliseconds: npt.NDArray[Any]) -> pa.Array:
    micros = milliseconds.astype(np.int64) * 1000
    return pa.Array.from_buffers(
        pa.timestamp("us", tz="UTC"), len(micros), [None, pa.py_buffer(micros)]
    )


def _gather(
    segment: _Segment,
    starts: Int64Array,
    lengths: Int64Array,
    nulls: BoolArray | None = None,
    *,
    text: bool = False,
    prefixes: Int64Array | None = None,
) -> pa.Array:
    """One binary/string column: the byte ranges ``[start, start + length)`` of a segment.

    The ranges are described as an Arrow binary-view array over the segment mapping (16 bytes
    per row, no copy of the data) and cast to ``kind``: Arrow's C++ cast then copies each value
    into one contiguous buffer. ``prefixes`` may give each value's first 4 bytes when the caller
    already knows them (frame headers start with their size)."""
    rows = len(starts)
    kind = pa.string() if text else pa.binary()
    validity = None
    null_count = 0
    if nulls is not None:
        null_count = int(np.count_nonzero(nulls))
        if null_count:
            validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    if not lengths.any():
        offsets = pa.py_buffer(np.zeros(rows + 1, dtype=np.int32))
        return pa.Array.from_buffers(
            kind, rows, [validity, offsets, pa.py_buffer(b"")], null_count=null_count
        )
    if int(lengths.sum()) > MAX_COLUMN_BYTES:
        raise ValueError("more than 2 GiB in one Arrow column: lower the batch size")
    views = np.zeros((rows, 4), dtype="<i4")
    views[:, 0] = lengths
    inline = lengths <= VIEW_INLINE_BYTES
    if inline.all():
        _inline(views, segment.array, starts, lengths)
    else:
        outline = ~inline
        if inline.any():
            chosen = np.flatnonzero(inline)
            views[chosen] = _inline(views[chosen], segment.array, starts[chosen], lengths[chosen])
        chosen = np.flatnonzero(outline)
        if prefixes is None:
            first = starts[chosen, None] + np.arange(VIEW_PREFIX_BYTES, dtype=np.int64)
            views[chosen, 1] = np.take(segment.array, first).view("<i4").reshape(len(chosen))
        else:
            views[chosen, 1] = prefixes[chosen]
        views[chosen, 2] = 0  # the one data buffer: the segment
        views[chosen, 3] = starts[chosen]
    view_kind = pa.string_view() if text else pa.binary_view()
    described = pa.Array.from_buffers(
        view_kind,
        rows,
        [validity, pa.py_buffer(views), segment.buffer],
        null_count=null_count,
    )
    return described.cast(kind)


def _inline(
    views: npt.NDArray[np.int32], seg: ByteArray, starts: Int64Array, lengths: Int64Array
) -> npt.NDArray[np.int32]:
    """Values of at most 12 bytes live inside their view, zero-padded (Arrow's view layout)."""
    spots = starts[:, None] + np.arange(VIEW_INLINE_BYTES, dtype=np.int64)
    np.minimum(spots, len(seg) - 1, out=spots)
    data = np.take(seg, spots)
    data[np.arange(VIEW_INLINE_BYTES)[None, :] >= lengths[:, None]] = 0
    views.view(np.uint8).reshape(len(starts), 16)[:, 4:] = data
    return views


def _headers_column(seg: ByteArray, starts: Int64Array, lengths: Int64Array) -> pa.Array:
    kind = arrow_schema().field("headers").type
    if not lengths.any():
        return _empty_lists(len(starts), kind)
    values = [
        [
            {"key": name, "value": value}
            for name, value in rec.decode_headers(seg[a : a + n].tobytes())
        ]
        if n
        else []
        for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)
    ]
    return pa.array(values, kind)


def _tags_column(seg: ByteArray, starts: Int64Array, lengths: Int64Array) -> pa.Array:
    kind = arrow_schema().field("tags").type
    if not lengths.any():
        return _empty_lists(len(starts), kind)
    values = [
        rec.decode_tags(seg[a : a + n].tobytes()) if n else []
        for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)
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
    segment: _Segment,
    entries: npt.NDArray[Any],
    relative: Int64Array,
) -> Iterator[pa.RecordBatch]:
    rows: list[tuple[Any, ...]] = []
    size = 0
    for row in _record_rows(plan, reader, segment, entries, relative):
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
    segment: _Segment,
    entries: npt.NDArray[Any],
    relative: Int64Array,
) -> Iterator[tuple[Any, ...]]:
    """Rows in :data:`COLUMN_NAMES` order, decoding each entry's frame with core.log.record and
    each Kafka RecordBatch with core.log.batches (aiokafka's codec)."""
    from core.log.batches import unpack_batch

    for first_offset, store_ms, at, size in zip(
        entries["first_offset"].tolist(),
        entries["store_ms"].tolist(),
        relative.tolist(),
        entries["size"].tolist(),
        strict=True,
    ):
        position = segment.base + at
        frame = segment.view[at : at + size]
        overlay: dict[str, bytes] = {}
        if plan.follow_links and rec.FLAGS.unpack_from(frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_LINK:
            frame, position = _follow_link(reader, frame, position, overlay)
        record = rec.decode_record(frame, 0, position)
        if plan.dedupe and record.index_targets()[0] != (plan.topic, plan.queue):
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
        for item in unpack_batch(record.body):  # [] for a control batch
            offset = first_offset + item.offset_delta
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


__all__ = ["DEFAULT_BATCH_ROWS", "empty_batch", "read_range"]
