"""The frame writer: how a record becomes a frame in the commit log (the append half of Kafka's
``LogSegment``, RocketMQ's ``DefaultAppendMessageCallback``).

One encoder writes every field of the layout (:mod:`core.log.record`):
:func:`core.log.record.encode_record_parts`, its frame appended by :meth:`FrameWriter.write`
(``CommitLog.append_parts``). It is the reference. Beside it, the measured fast paths for the frames
the broker writes most, each writing the reference's bytes exactly (the parity tests in
``tests/log/test_frame_parity.py`` feed a fast path and its reference the same inputs and compare
the commit logs and indexes byte for byte, also after a crash in the middle):

- :meth:`FrameWriter.write_plain`, a record with no headers, tags or routing fields: encoded
  straight into the mapping from a head shared per queue and millisecond (:class:`FrameHead`);
- :meth:`FrameWriter.write_half`, a transaction's half message with encoded headers, the same way;
- :meth:`FrameWriter.write_many`, a batch of plain records to one queue (reference:
  :meth:`FrameWriter.write_many_reference`), staged and written with one pwrite when large;
- :meth:`FrameWriter.write_packed`, a frame packed whole by one Struct (a transaction's commit
  decision, whose fast path is ``core/transactions/decisions.py``).

``LogStore(fast_paths=False)`` takes the reference for everything.

Who writes: the one :class:`~core.log.store.LogStore` of a data directory, from the event-loop
thread (not thread-safe). Every frame is checksummed: CRC32C over bytes ``[12, total_size)``.
The index entries of a frame are written after it, by :mod:`core.log.index_writer`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from itertools import accumulate

from crc32c import crc32c

from core.log import record as rec
from core.log.commitlog import WRITEBACK_BYTES, CommitLog
from core.log.consumequeue import ConsumeQueue
from core.log.segment import pwrite_all, start_writeback

# The clock of every write path: a frame's store_ms is ``clock_ns() // 1_000_000`` (the parity
# tests pin it to compare two stores byte for byte; read through this module's attribute).
clock_ns = time.time_ns
# Topics whose encoded names (and, in the store, frame heads) are kept at most: the ones being
# written to, not every topic ever written (topic churn grew them by ~100 B a topic, issue 21).
CACHED_TOPICS = 4096
# append_many batches of at least this many bytes are written with pwrite, not the mapping.
STAGE_BYTES = 32 * 1024
_PREFIX_SIZE = rec.PREFIX.size
_RECORD_MAGIC = rec.RECORD_MAGIC
# Header bytes [12, 72) of a frame: everything after the prefix (total_size, magic, crc32c).
HEAD_TAIL = struct.Struct("<" + rec.HEADER.format[4:])

_frame_structs: dict[tuple[int, int, int, int], struct.Struct] = {}


def store_ms_now() -> int:
    """The store time (ms since the epoch) of a frame appended now."""
    return clock_ns() // 1_000_000


def frame_struct(
    head_len: int, key_len: int, body_len: int, headers_len: int = -1
) -> struct.Struct:
    """A whole frame as one Struct: prefix, head, key, then headers when ``headers_len`` is not
    negative, and body (all but the prefix as bytes)."""
    layout = (head_len, key_len, body_len, headers_len)
    found = _frame_structs.get(layout)
    if found is None:
        if len(_frame_structs) >= 4096:
            _frame_structs.clear()  # body lengths vary without bound; keep the cache small
        headers = f"{headers_len}s" if headers_len >= 0 else ""
        found = _frame_structs[layout] = struct.Struct(
            f"{rec.PREFIX.format}{head_len}s{key_len}s{headers}{body_len}s"
        )
    return found


class FrameHead:
    """The encoded head of one (topic, queue)'s frames (header bytes after the prefix, then the
    topic) for the last (store_ms, born_ms, protocol, key length, body length, headers length)
    seen, with the head's CRC32C. Appends within one millisecond share it, so a frame costs one
    crc32c over the key and body continued from the head's CRC and one pack_into of the whole
    frame (``frame``: prefix, head, key, body), not a 19-field pack, three copies and a CRC over
    the frame as mapped (measured: 6.1-7.6 against 3.95 µs of CPU per 100-byte append).

    ``index`` is the queue's index, kept here so an append finds head and index with one lookup.
    """

    __slots__ = (
        "body_len",
        "born_ms",
        "crc",
        "flags",
        "frame",
        "frame_head",
        "head",
        "head_end",
        "headers_len",
        "index",
        "key_len",
        "protocol",
        "queue",
        "store_ms",
        "topic_bytes",
    )

    def __init__(self, queue: int, topic_bytes: bytes, index: ConsumeQueue, flags: int = 0) -> None:
        self.queue = queue
        self.topic_bytes = topic_bytes
        self.index = index
        # A head of half messages (FLAG_HALF, encoded headers; ``index`` is __half/0) sets
        # both; a plain one keeps 0 and -1 (its frames have no headers field to pack).
        self.flags = flags
        self.headers_len = -1
        self.head = b""
        self.crc = 0
        self.store_ms = self.born_ms = self.protocol = self.key_len = self.body_len = -1
        # Where the key starts in a frame.
        self.head_end = rec.CRC_START + HEAD_TAIL.size + len(topic_bytes)
        # Prefix (total_size, magic, crc32c) and head in one pack_into, once the CRC is known.
        self.frame_head = struct.Struct(f"{rec.PREFIX.format}{self.head_end - rec.CRC_START}s")
        self.frame = self.frame_head

    def refresh(
        self,
        store_ms: int,
        born_ms: int,
        protocol: int,
        key_len: int,
        body_len: int,
        headers_len: int = -1,
    ) -> None:
        """Make the head fit a frame of this millisecond and these fields (write_plain inlines
        this test, its hottest caller)."""
        if (
            store_ms != self.store_ms
            or body_len != self.body_len
            or key_len != self.key_len
            or headers_len != self.headers_len
            or born_ms != self.born_ms
            or protocol != self.protocol
        ):
            self.set_head(store_ms, born_ms, protocol, key_len, body_len, headers_len)

    def set_head(
        self,
        store_ms: int,
        born_ms: int,
        protocol: int,
        key_len: int,
        body_len: int,
        headers_len: int = -1,
    ) -> None:
        head = (
            HEAD_TAIL.pack(
                self.flags,
                protocol,
                store_ms,
                born_ms or store_ms,
                0,  # deliver_at_ms
                self.queue,
                1,  # record_count
                len(self.topic_bytes),
                0,  # subject
                key_len,
                max(headers_len, 0),
                0,  # tags
                0,  # client
                0,  # address
                0,  # destinations
                body_len,
            )
            + self.topic_bytes
        )
        self.head = head
        self.crc = crc32c(head)
        self.frame = frame_struct(len(head), key_len, body_len, headers_len)
        self.headers_len = headers_len
        self.store_ms = store_ms
        self.born_ms = born_ms
        self.protocol = protocol
        self.key_len = key_len
        self.body_len = body_len


class FrameWriter:
    """Writes frames at the commit log's write position. ``appends`` and ``appended_bytes``
    count what it wrote (plain attributes, not a dict: a dict's three increments per append
    measured 4-5% of a plain append's CPU)."""

    def __init__(self, commitlog: CommitLog) -> None:
        self.commitlog = commitlog
        self.appends = 0
        self.appended_bytes = 0
        self._encoded_topics: dict[str, bytes] = {}
        self._staging = memoryview(bytearray())  # see write_many

    def topic_bytes(self, topic: str) -> bytes:
        encoded = self._encoded_topics.get(topic)
        if encoded is None:
            encoded = topic.encode()
            if len(encoded) > rec.MAX_TOPIC_BYTES:
                raise ValueError("topic name too long")
            if len(self._encoded_topics) >= CACHED_TOPICS:
                self._encoded_topics.clear()  # topics come and go: no entry per topic ever seen
            self._encoded_topics[topic] = encoded
        return encoded

    # -- the reference -----------------------------------------------------------------------

    def write(self, head: bytes, body: bytes | memoryview) -> tuple[int, int]:
        """Append the frame :func:`core.log.record.encode_record_parts` encoded as ``head`` and
        ``body`` (every field; ``topic_bytes`` gives the topic as it takes it), rolling the
        segment when it does not fit; returns (position, size)."""
        position = self.commitlog.append_parts(head, body)
        size = len(head) + len(body)
        self.appends += 1
        self.appended_bytes += size
        return position, size

    def write_many_reference(
        self,
        topic: str,
        queue: int,
        bodies: Sequence[bytes | memoryview],
        store_ms: int,
        key: bytes | None,
        protocol: int,
        client: str,
    ) -> tuple[list[int], list[int]]:
        """Plain records to one queue, each encoded by the reference encoder, written with as
        few copies as segment ends allow; returns their positions and sizes."""
        topic_bytes = self.topic_bytes(topic)
        client_bytes = client.encode()
        frames = [
            rec.encode_record(
                topic_bytes,
                queue,
                body,
                store_ms=store_ms,
                key=key,
                client=client_bytes,
                protocol=protocol,
            )
            for body in bodies
        ]
        positions = self.commitlog.append_frames(frames)
        sizes = [len(frame) for frame in frames]
        self.appends += len(frames)
        self.appended_bytes += sum(sizes)
        return positions, sizes

    # -- fast paths ----------------------------------------------------------------------------

    def write_plain(
        self,
        head: FrameHead,
        key: bytes,
        body: bytes | memoryview,
        born_ms: int,
        protocol: int,
    ) -> int:
        """:meth:`write` of a plain record (no headers, tags, routing fields, flags or delay)
        into ``head``'s queue, encoded straight into the mapping; returns its position (store
        time ``head.store_ms``, end ``commitlog.write_position``), or -1 when it would roll the
        segment: then :meth:`write` does it. Most of the broker's publish CPU is here, so it
        avoids calls and repeated lookups."""
        store_ms = clock_ns() // 1_000_000
        key_len = len(key)
        body_len = len(body)
        # FrameHead.refresh, inlined.
        if (
            store_ms != head.store_ms
            or body_len != head.body_len
            or key_len != head.key_len
            or born_ms != head.born_ms
            or protocol != head.protocol
        ):
            head.set_head(store_ms, born_ms, protocol, key_len, body_len)
        head_end = head.head_end
        total = head_end + key_len + body_len
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - total
        # It fits the active stretch if it ends exactly at its end or leaves room for a BLANK
        # prefix; otherwise activate() checks the segment, preallocates or says roll.
        if not (room >= _PREFIX_SIZE or room == 0 or commitlog.activate(total)):
            return -1
        start = position - commitlog.active_base
        buf = commitlog.active_buf
        assert buf is not None
        crc = crc32c(key, head.crc) if key_len else head.crc
        crc = crc32c(body, crc)
        if type(body) is bytes and type(key) is bytes:
            head.frame.pack_into(buf, start, total, _RECORD_MAGIC, crc, head.head, key, body)
        else:  # struct packs bytes only: a memoryview body is copied on its own
            head_at = start + head_end
            buf[head_at : head_at + key_len] = key
            buf[head_at + key_len : start + total] = body
            head.frame_head.pack_into(buf, start, total, _RECORD_MAGIC, crc, head.head)
        commitlog.write_position = position + total
        self.appends += 1
        self.appended_bytes += total
        return position

    def write_half(
        self,
        head: FrameHead,
        key: bytes,
        headers: bytes,
        body: bytes,
        born_ms: int,
        protocol: int,
    ) -> int:
        """:meth:`write` of a half message (``FLAG_HALF``, encoded ``headers``, no other field)
        with a head of ``FLAG_HALF``, into the mapping like :meth:`write_plain`; its position,
        or -1 when it would roll the segment."""
        store_ms = clock_ns() // 1_000_000
        key_len = len(key)
        headers_len = len(headers)
        body_len = len(body)
        head.refresh(store_ms, born_ms, protocol, key_len, body_len, headers_len)
        total = head.head_end + key_len + headers_len + body_len
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - total
        if not (room >= _PREFIX_SIZE or room == 0 or commitlog.activate(total)):
            return -1
        buf = commitlog.active_buf
        assert buf is not None
        crc = crc32c(key, head.crc) if key_len else head.crc
        crc = crc32c(body, crc32c(headers, crc))
        head.frame.pack_into(
            buf,
            position - commitlog.active_base,
            total,
            rec.RECORD_MAGIC,
            crc,
            head.head,
            key,
            headers,
            body,
        )
        commitlog.write_position = position + total
        self.appends += 1
        self.appended_bytes += total
        return position

    def write_many(
        self,
        head: FrameHead,
        bodies: Sequence[bytes | memoryview],
        key: bytes,
        protocol: int,
    ) -> tuple[Sequence[int], list[int]] | None:
        """:meth:`write_many_reference` of a batch (no client) encoded frame after frame (heads
        shared while body lengths repeat); returns positions and sizes (store time
        ``head.store_ms``), or None when the batch would roll the segment: the reference
        handles segment ends.

        A large batch is encoded into a staging buffer and written with one pwrite rather than
        through the mapping: the kernel then fills page-cache pages it does not have to zero
        first, and no page fault is taken per page (measured: 0.3 against 0.45 ns of CPU per
        byte). The pages are the mapping's (one page cache), so readers and a crash see the
        same bytes either way."""
        store_ms = clock_ns() // 1_000_000
        key_len = len(key)
        head_end = head.head_end
        fixed = head_end + key_len
        whole_key = type(key) is bytes
        lengths = list(map(len, bodies))
        count = len(lengths)
        # Every frame the same size (a producer's batch usually is): one head for all, frame
        # positions as a range, and a loop of one CRC and one pack per frame.
        uniform = whole_key and lengths.count(lengths[0]) == count
        sizes: list[int]
        if uniform:
            sizes = [fixed + lengths[0]] * count
            need = sizes[0] * count
        else:
            sizes = [fixed + length for length in lengths]
            need = sum(sizes)
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - need
        if not (room >= _PREFIX_SIZE or room == 0) and not commitlog.activate(need):
            return None
        offset = position - commitlog.active_base
        buf: memoryview | None
        if need >= STAGE_BYTES:
            if len(self._staging) < need:
                self._staging = memoryview(bytearray(max(need, 2 * len(self._staging))))
            buf = self._staging
            cursor = 0
        else:
            buf = commitlog.active_buf
            cursor = offset
        assert buf is not None
        pack_frame_head = head.frame_head.pack_into
        magic = rec.RECORD_MAGIC
        if uniform:
            total = sizes[0]
            body_len = total - fixed
            head.refresh(store_ms, 0, protocol, key_len, body_len)
            head_bytes = head.head
            crc = crc32c(key, head.crc) if key_len else head.crc
            pack_frame = head.frame.pack_into
            for body in bodies:
                if type(body) is bytes:
                    pack_frame(buf, cursor, total, magic, crc32c(body, crc), head_bytes, key, body)
                else:  # struct packs bytes only: a memoryview body is copied on its own
                    end = cursor + total
                    if key_len:
                        at = cursor + head_end
                        buf[at : at + key_len] = key
                    buf[end - body_len : end] = body
                    pack_frame_head(buf, cursor, total, magic, crc32c(body, crc), head_bytes)
                cursor += total
        else:
            head_total = -1  # frame size the current head and crc were made for
            for body, total in zip(bodies, sizes, strict=True):
                if total != head_total:
                    head_total = total
                    body_len = total - fixed
                    head.refresh(store_ms, 0, protocol, key_len, body_len)
                    head_bytes = head.head
                    crc = head.crc
                    pack_frame = head.frame.pack_into
                    if key_len:
                        crc = crc32c(key, crc)
                end = cursor + total
                if whole_key and type(body) is bytes:
                    pack_frame(buf, cursor, total, magic, crc32c(body, crc), head_bytes, key, body)
                else:  # struct packs bytes only: a memoryview body is copied on its own
                    if key_len:
                        at = cursor + head_end
                        buf[at : at + key_len] = key
                    buf[end - body_len : end] = body
                    pack_frame_head(buf, cursor, total, magic, crc32c(body, crc), head_bytes)
                cursor = end
        if buf is self._staging:
            pwrite_all(commitlog.active_fd, buf[:need], offset)
        end = position + need
        commitlog.write_position = end
        if end - commitlog.writeback_position >= WRITEBACK_BYTES:
            found = commitlog.writeback_range()
            if found is not None:
                start_writeback(*found)
        positions: Sequence[int]
        if uniform:
            positions = range(position, end, sizes[0])
        else:
            positions = list(accumulate(sizes, initial=position))
            positions.pop()
        self.appends += count
        self.appended_bytes += need
        return positions, sizes

    def write_packed(self, frame: struct.Struct, crc: int, head: bytes, rest: bytes) -> int:
        """A frame that ``frame`` packs whole: prefix (its size, the magic, ``crc``), then
        ``head`` and ``rest`` as two strings. Packed into the mapping when it fits, else packed
        to bytes and appended (which rolls the segment); returns its position."""
        size = frame.size
        commitlog = self.commitlog
        position = commitlog.write_position
        room = commitlog.active_end - (position - commitlog.active_base) - size
        if room >= _PREFIX_SIZE or room == 0 or commitlog.activate(size):
            buf = commitlog.active_buf
            assert buf is not None
            frame.pack_into(
                buf, position - commitlog.active_base, size, _RECORD_MAGIC, crc, head, rest
            )
            commitlog.write_position = position + size
        else:
            position = commitlog.append(frame.pack(size, _RECORD_MAGIC, crc, head, rest))
        self.appends += 1
        self.appended_bytes += size
        return position


class ReferenceFrameWriter(FrameWriter):
    """A FrameWriter whose fast paths all decline (``LogStore(fast_paths=False)``): every
    frame then takes the reference encoder, which the parity tests compare them with."""

    def write_plain(
        self,
        head: FrameHead,
        key: bytes,
        body: bytes | memoryview,
        born_ms: int,
        protocol: int,
    ) -> int:
        return -1

    def write_half(
        self,
        head: FrameHead,
        key: bytes,
        headers: bytes,
        body: bytes,
        born_ms: int,
        protocol: int,
    ) -> int:
        return -1

    def write_many(
        self,
        head: FrameHead,
        bodies: Sequence[bytes | memoryview],
        key: bytes,
        protocol: int,
    ) -> tuple[Sequence[int], list[int]] | None:
        return None

    def write_packed(self, frame: struct.Struct, crc: int, head: bytes, rest: bytes) -> int:
        position = self.commitlog.append(frame.pack(frame.size, _RECORD_MAGIC, crc, head, rest))
        self.appends += 1
        self.appended_bytes += frame.size
        return position
