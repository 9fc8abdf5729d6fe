"""``braid tail TOPIC``: print a topic's records as they arrive, whatever protocol sent them.

Reads the data directory through the read-only LogReader, so it runs beside a live broker (or
on a stopped one's directory) without a client connection and without changing anything: no
consumer group, no ack. Every queue of the topic is followed, including queues created after
the tail started. A Kafka batch is shown as its records, one a line, each with its own offset.
Committed half messages and fired delayed records show up when they become visible, as they do
for consumers; pending or rolled-back ones never do.

On a cluster's data root (docs/cluster.md section 2), the topic's queues in every shard (or the
one ``--shard N`` names), each line naming its shard; a shard first written while tailing is
followed from its beginning.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

from braid.logtool import bytes_json, iso_ms, open_reader, preview, targets
from core.cluster.layout import shard_dir_name
from core.delivery.message import BATCH_SELECT_HEADER, selection_key
from core.log import LogReader, Record
from core.log import record as rec
from core.log.batches import unpack_batch
from core.log.txnindex import ABORTED, COMMITTED, OPEN, TxnOutcomes, batch_txn

DEFAULT_INTERVAL_MS = 100
DEFAULT_MAX_BODY = 200
READ_CHUNK = 1000


@dataclass(slots=True)
class Line:
    """One record as tail shows it (a Kafka batch's inner record gets one of its own)."""

    topic: str
    queue: int
    offset: int
    store_ms: int
    protocol: str
    client: str
    address: str
    subject: str
    key: bytes | None
    headers: list[tuple[str, bytes]]
    tags: list[str]
    body: bytes | None
    flags: int
    shard: int | None = None  # the shard of a cluster root it was read in

    def as_json(self, max_body: int) -> str:
        body, truncated = preview(self.body, max_body)
        where: dict[str, object] = {} if self.shard is None else {"shard": self.shard}
        return json.dumps(
            {
                **where,
                "topic": self.topic,
                "queue": self.queue,
                "offset": self.offset,
                "time": iso_ms(self.store_ms),
                "protocol": self.protocol,
                "client": self.client,
                "address": self.address,
                "subject": self.subject,
                "key": bytes_json(self.key),
                "headers": [[name, bytes_json(value)] for name, value in self.headers],
                "tags": self.tags,
                "body_size": None if self.body is None else len(self.body),
                "body": bytes_json(body, truncated=truncated),
                "body_truncated": truncated,
            },
            ensure_ascii=False,
        )

    def as_text(self, max_body: int) -> str:
        parts = [iso_ms(self.store_ms), f"{self.topic}/{self.queue}@{self.offset}"]
        if self.shard is not None:
            parts.append(f"shard={self.shard}")
        parts.append(f"[{self.protocol}]")
        origin = " ".join(part for part in (self.client, self.address) if part)
        if origin:
            parts.append(f"from={origin!r}")
        if self.subject:
            parts.append(f"subject={self.subject!r}")
        if self.key:
            parts.append(f"key={self.key!r}")
        if self.tags:
            parts.append("tags=" + ",".join(self.tags))
        if self.headers:
            parts.append("headers={" + ", ".join(f"{n}: {v!r}" for n, v in self.headers) + "}")
        if self.body is None:
            parts.append("body=null")
        else:
            body, truncated = preview(self.body, max_body)
            parts.append(f"body[{len(self.body)}]={body!r}{'...' if truncated else ''}")
        return " ".join(parts)


def lines_of(
    record: Record, topic: str, queue: int, offset: int, shard: int | None = None
) -> Iterator[Line]:
    """The lines of one stored record read at ``offset`` of queue ``topic/queue``: itself, or
    each record of a Kafka batch that this queue took (a batch routed record by record, e.g.
    into an AMQP queue bound with ``truck.*``, is indexed there whole with an
    ``x-braid-batch-select`` header naming the records the queue took; the others are skipped,
    as its consumers never get them). Offsets and names are the queue's, not the record's home:
    a record fanned out to a queue has that queue's offset there."""
    common = (record.protocol_name, record.client, record.address)
    if record.flags & rec.FLAG_BATCH and record.body is not None:
        if record.flags & rec.FLAG_TXN_CONTROL:
            return  # a commit/abort marker, not a record anyone published
        selected = batch_selection(record.headers, topic, queue)
        for inner in unpack_batch(record.body):
            if selected is not None and inner.offset_delta not in selected:
                continue
            yield Line(
                topic,
                queue,
                offset + inner.offset_delta,
                inner.timestamp_ms or record.store_ms,
                *common,
                record.subject,
                inner.key,
                inner.headers,
                record.tags,
                inner.value,
                record.flags,
                shard,
            )
        return
    yield Line(
        topic,
        queue,
        offset,
        record.store_ms,
        *common,
        record.subject,
        record.key,
        [(name, bytes(value)) for name, value in record.headers],
        record.tags,
        None if record.body is None else bytes(record.body),
        record.flags,
        shard,
    )


def batch_selection(headers: list[tuple[str, bytes]], topic: str, queue: int) -> set[int] | None:
    """The offset deltas of a batch record's records that ``topic/queue`` took; None: all."""
    for name, value in headers:
        if name == BATCH_SELECT_HEADER:
            chosen = json.loads(value).get(selection_key(topic, queue))
            return None if chosen is None else set(chosen)
    return None


class Follower:
    """Where tail is in each queue of one topic; ``poll`` returns what arrived since."""

    def __init__(
        self,
        reader: LogReader,
        topic: str,
        *,
        last: int | None,
        include_aborted: bool = False,
        all_new: bool = False,
    ) -> None:
        """``all_new``: everything in the log is new to this tail (a shard first written after
        the tail started), so ``last`` does not apply: every queue is read from its start."""
        self.reader = reader
        self.topic = topic
        # Kafka transactions: a transactional batch is shown once committed (aborted ones
        # too with ``include_aborted``); a queue is not followed past an open one (the last
        # stable offset), and control batches are never shown.
        self.include_aborted = include_aborted
        self.outcomes = TxnOutcomes()
        # None: start at the end of queues that exist now; an int: that many records back.
        self.last = last
        self.positions: dict[int, int] = {}
        self._first_poll = not all_new

    def _start_offset(self, first: int, next_offset: int) -> int:
        if not self._first_poll:
            return first  # a queue that appeared while tailing: all of it is new
        if self.last is None:
            return next_offset
        return max(first, next_offset - self.last)

    def queues(self) -> list[int]:
        """The queues of the followed topic that exist now (system topics included: tailing
        ``__offsets`` is asked for by name)."""
        return [q for t, q in self.reader.queues(include_system=True) if t == self.topic]

    def poll(self) -> list[tuple[Record, int, int]]:
        """``(record, queue, offset)`` of each entry appended since the last poll."""
        self.reader.refresh()
        self.outcomes.refresh(self.reader)
        found: list[tuple[Record, int, int]] = []
        topic = self.topic
        for queue in self.queues():
            first, next_offset = self.reader.queue_bounds(topic, queue)
            offset = self.positions.get(queue)
            if offset is None:
                offset = self.positions[queue] = self._start_offset(first, next_offset)
            offset = max(offset, first)  # retention may have removed what we had not read
            entries = self.reader.read(topic, queue, offset, max_records=READ_CHUNK)
            for entry in entries:
                record = entry.record()
                shown = self._shown(record, queue)
                if shown is None:
                    break  # an open transaction: go on from here at the next poll
                if shown:
                    found.append((record, queue, entry.offset))
                self.positions[queue] = entry.next_offset
        self._first_poll = False
        found.sort(key=lambda item: item[0].store_ms)
        return found

    def _shown(self, record: Record, queue: int) -> bool | None:
        """Whether to show ``record`` (read in ``queue``); None: it belongs to a Kafka
        transaction still open."""
        if not record.flags & rec.FLAG_BATCH:
            return True
        info = batch_txn(record.body)
        if info is None:
            return True
        if info.control:
            return False
        state = self.outcomes.outcome(record.topic, queue, info.producer_id, record.position)
        if state == OPEN:
            return None
        return state == COMMITTED or (self.include_aborted and state == ABORTED)


class Followers:
    """A :class:`Follower` of the topic in each shard of a cluster root holding a log (one for
    a single-node directory); a shard written later is followed from then on, from its start."""

    def __init__(
        self,
        data_dir: str,
        topic: str,
        *,
        last: int | None,
        include_aborted: bool = False,
        shard: int | None = None,
    ) -> None:
        found = targets(data_dir, shard)
        self.is_root = found.layout is not None
        self.targets = found.targets
        self.topic = topic
        self.last = last
        self.include_aborted = include_aborted
        self.followers: dict[int | None, Follower] = {}
        try:
            self._open(all_new=False)
        except BaseException:
            self.close()
            raise

    def _open(self, *, all_new: bool) -> None:
        for target in self.targets:
            if target.shard in self.followers:
                continue
            if self.is_root and not target.has_log():
                continue  # nothing written to it yet: looked for again at each poll
            self.followers[target.shard] = Follower(
                open_reader(str(target.data_dir)),
                self.topic,
                last=self.last,
                include_aborted=self.include_aborted,
                all_new=all_new,
            )

    def poll(self) -> list[tuple[int | None, Record, int, int]]:
        """``(shard, record, queue, offset)`` of each entry appended since the last poll, in
        store-time order over the shards."""
        self._open(all_new=True)
        found = [
            (shard, record, queue, offset)
            for shard, follower in self.followers.items()
            for record, queue, offset in follower.poll()
        ]
        found.sort(key=lambda item: item[1].store_ms)
        return found

    def starts(self) -> str:
        """Where each queue is followed from: ``0@5, 1@3``; per shard on a root."""
        parts = []
        for shard, follower in sorted(self.followers.items(), key=lambda item: item[0] or 0):
            at = ", ".join(f"{q}@{o}" for q, o in sorted(follower.positions.items()))
            if at:
                parts.append(at if shard is None else f"shard {shard_dir_name(shard)}: {at}")
        return "; ".join(parts)

    def close(self) -> None:
        for follower in self.followers.values():
            follower.reader.close()


def tail(
    data_dir: str,
    topic: str,
    *,
    last: int | None,
    limit: int | None,
    as_json: bool,
    max_body: int,
    interval_ms: int,
    out: TextIO,
    err: TextIO | None = None,
    include_aborted: bool = False,
    shard: int | None = None,
) -> int:
    """Follow ``topic`` until SIGINT/SIGTERM, or until ``limit`` records were printed. Once it
    knows where it starts in each queue, one line saying so goes to ``err``. Records of Kafka
    transactions are shown once committed (aborted ones too with ``include_aborted``). On a
    cluster root: in every shard, or in ``shard``."""
    followers = Followers(data_dir, topic, last=last, include_aborted=include_aborted, shard=shard)
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    printed = 0
    try:
        announced = False
        while not stopping:
            batch = followers.poll()
            if not announced and err is not None:
                announced = True
                starts = followers.starts()
                if starts:
                    err.write(f"braid tail: following {topic} ({starts})\n")
                else:
                    err.write(
                        f"braid tail: topic {topic!r} does not exist yet (no queue in"
                        f" {data_dir}); waiting for its first record\n"
                    )
                err.flush()
            for shard_read, record, queue, offset in batch:
                for line in lines_of(record, topic, queue, offset, shard_read):
                    out.write(
                        (line.as_json(max_body) if as_json else line.as_text(max_body)) + "\n"
                    )
                    printed += 1
                    if limit is not None and printed >= limit:
                        out.flush()
                        return 0
            out.flush()
            if len(batch) < READ_CHUNK:
                time.sleep(interval_ms / 1000)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        followers.close()
