"""The owner's side of ``Append`` (docs/cluster.md section 7): records other nodes routed to
shards this node owns, stored in the shard's log and answered once durable.

:class:`AppendReceiver` is the ``StreamHandler`` the node plugs into ``NodeService.append``.
Per stream it appends each batch as it arrives (in stream order) and answers its seqs once the
batch's group commit covers them, so the next batch is appended while the last one's fsync
runs; a run of plain OK answers with consecutive seqs goes as one message (``offsets``). A
batch's records for one shard are one group: all appended, then one durability wait. Each
record's ``shard_epoch`` must be the epoch this node owns the shard at, otherwise the answer is
``NOT_OWNER``; after a refusal for a (shard, epoch) every later record of that
pair on the same stream is refused the same way, so a shard that becomes available mid-stream
(opened a moment later) cannot store a later record before an earlier refused one: the origin
resends the refused ones, on a new stream when it is the same owner at the same epoch.

Resends after a broken stream carry the same ``seq``: :class:`_OriginWindow` remembers, per
origin node and incarnation, every stored ``seq`` with its answer for ``window_ms`` (section 7:
``rpc_timeout_ms``; an origin never resends a record later than its ``unavailable_wait_ms``,
which is shorter), so a duplicate answers its first answer again without being stored.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Final, NamedTuple, Protocol

from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.settings import RPC_TIMEOUT_MS
from core.log import record as rec
from core.log.store import Appended

log = logging.getLogger(__name__)

Destination = tuple[str, int]

OK: Final = pb.AppendResult.OK
NOT_OWNER: Final = pb.AppendResult.NOT_OWNER
UNAVAILABLE: Final = pb.AppendResult.UNAVAILABLE
REFUSED: Final = pb.AppendResult.REFUSED
# The flags of a forwarded record that travel in its frame (core/cluster/rpc/forward.py) and
# the owner keeps: what the record is (a Kafka batch, a control batch). Where it sits
# (FLAG_COPY) is Record.copy; the rest the owner's log sets itself.
FORWARDED_FLAGS: Final = rec.FLAG_BATCH | rec.FLAG_TXN_CONTROL

# Seqs remembered per origin at most, whatever the window: bounds memory under a flood (about
# 100 bytes each: ~25 MiB per origin). At more than MAX_REMEMBERED / window records a second from
# one origin, the oldest are forgotten before the window ends (a resend that old is stored twice).
MAX_REMEMBERED: Final = 262_144
# A frame's flags, deliver_at_ms and destinations' length (core/log/record.py HEADER, from
# FLAGS_OFFSET).
_FRAME_FIELDS: Final = struct.Struct("<H2x16xq26xH")


class ShardLog(Protocol):
    """What the receiver needs of a shard's ``LogStore`` (core/log/store.py)."""

    def append(
        self,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        key: bytes | None,
        headers: rec.Headers,
        tags: Sequence[str],
        subject: str,
        client: str,
        address: str,
        destinations: Sequence[Destination] | None,
        protocol: int,
        born_ms: int,
        deliver_at_ms: int,
        flags: int,
        record_count: int,
    ) -> Appended: ...

    def append_encoded(self, frame: bytes) -> Appended: ...

    def add_durable_waiter(self, end: int, future: asyncio.Future[None]) -> None: ...


class LocalShards(Protocol):
    """The shards this node owns, as the receiver sees them."""

    def shard(self, number: int) -> tuple[ShardLog, int] | None:
        """Shard ``number``'s log and the epoch this node owns it at; None when not owned."""
        ...

    def refused(self, shard: int, destinations: Sequence[Destination]) -> list[Destination]:
        """Which of ``destinations`` refuse a new record now (an ack queue over its limit with
        ``reject-publish``); the record is indexed in the others only."""
        ...


class _Stored(NamedTuple):
    """A stored record's answer, valid once ``durable`` is done without an error."""

    result: pb.AppendResult
    durable: asyncio.Future[None]
    at: float  # time.monotonic() when stored


class _OriginWindow:
    """The seqs one origin (node and incarnation) had stored here lately, in arrival order."""

    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation
        self.stored: OrderedDict[int, _Stored] = OrderedDict()

    def forget_before(self, oldest: float) -> None:
        stored = self.stored
        while stored:
            seq, entry = next(iter(stored.items()))
            if entry.at >= oldest and len(stored) <= MAX_REMEMBERED:
                return
            del stored[seq]


class _Answer(NamedTuple):
    result: pb.AppendResult
    durable: asyncio.Future[None] | None  # None: answer at once
    window: _OriginWindow | None  # where the seq is remembered (forgotten if durability fails)


class _Block(NamedTuple):
    """A (shard, epoch) this stream refused, and how."""

    epoch: int
    status: pb.AppendResult.Status.ValueType
    owner: int
    owner_epoch: int


def _runs(results: list[pb.AppendResult]) -> list[pb.AppendResult]:
    """``results`` (a batch's answers, in seq order) as the messages to send: each run of plain
    OK answers (no refused destinations) with consecutive seqs as one message listing their
    offsets (``AppendResult.offsets``), the others as they are. A gRPC message costs far more
    than a record's share of a larger one, and most answers are plain OKs."""
    messages: list[pb.AppendResult] = []
    first = 0
    offsets: list[int] = []

    def close_run() -> None:
        if len(offsets) == 1:
            messages.append(pb.AppendResult(seq=first, status=OK, offset=offsets[0]))
        elif offsets:
            messages.append(pb.AppendResult(seq=first, status=OK, offsets=offsets))

    for result in results:
        if result.status == OK and not result.refused:
            if offsets and result.seq == first + len(offsets):
                offsets.append(result.offset)
                continue
            close_run()
            first, offsets = result.seq, [result.offset]
            continue
        close_run()
        offsets = []
        messages.append(result)
    close_run()
    return messages


class AppendReceiver:
    """``Append`` streams into ``local``'s shards. ``node_id``: this node, named in a
    ``NOT_OWNER`` answer when it owns the shard at another epoch. ``window_ms``: how long a
    stored seq is remembered to drop resends (section 7: ``rpc_timeout_ms``)."""

    def __init__(
        self, local: LocalShards, *, node_id: int, window_ms: int = RPC_TIMEOUT_MS
    ) -> None:
        self._local = local
        self._node_id = node_id
        self._window_s = window_ms / 1000
        self._origins: dict[int, _OriginWindow] = {}
        # Records stored, and duplicates answered without storing (counters for stats/tests).
        self.stored = 0
        self.duplicates = 0

    async def __call__(
        self, requests: AsyncIterator[pb.AppendBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.AppendResult]:
        answers: asyncio.Queue[list[_Answer] | None] = asyncio.Queue()
        blocks: dict[int, _Block] = {}  # this stream's refused shards
        reader = asyncio.create_task(self._read(requests, answers, blocks))
        try:
            while (batch := await answers.get()) is not None:
                settled = [await self._settled(answer) for answer in batch]
                for message in _runs(settled):
                    yield message
            await reader  # its error, if reading ended with one
        finally:
            reader.cancel()

    async def _read(
        self,
        requests: AsyncIterator[pb.AppendBatch],
        answers: asyncio.Queue[list[_Answer] | None],
        blocks: dict[int, _Block],
    ) -> None:
        try:
            async for batch in requests:
                answers.put_nowait(self._apply(batch, blocks))
        finally:
            answers.put_nowait(None)

    async def _settled(self, answer: _Answer) -> pb.AppendResult:
        if answer.durable is None:
            return answer.result
        try:
            if not answer.durable.done():
                # Shielded: a stream cancelled while it waits must not cancel the group's
                # future, which a resend of the same seqs on another stream waits for too.
                await asyncio.shield(answer.durable)
            answer.durable.result()
        except Exception as error:  # StoreFenced (a newer owner), an fsync's OSError
            if answer.window is not None:
                answer.window.stored.pop(answer.result.seq, None)  # a resend may store it
            log.warning("forwarded record %d not durable: %s", answer.result.seq, error)
            return pb.AppendResult(seq=answer.result.seq, status=UNAVAILABLE)
        return answer.result

    def _window(self, origin: pb.Origin) -> _OriginWindow:
        window = self._origins.get(origin.node)
        if window is None or window.incarnation != origin.incarnation:
            # A restarted origin never resends its former incarnation's records.
            window = self._origins[origin.node] = _OriginWindow(origin.incarnation)
        window.forget_before(time.monotonic() - self._window_s)
        return window

    def _apply(self, batch: pb.AppendBatch, blocks: dict[int, _Block]) -> list[_Answer]:
        """Append ``batch``'s records (one durability wait per shard) and return their answers,
        in seq order."""
        window = self._window(batch.origin)
        now = time.monotonic()
        answers: list[_Answer] = []
        # Per shard of this batch: its log and the end of the last record appended to it.
        groups: dict[int, tuple[ShardLog, int, asyncio.Future[None]]] = {}
        loop = asyncio.get_running_loop()
        for record in batch.records:
            seen = window.stored.get(record.seq)
            if seen is not None:
                self.duplicates += 1
                answers.append(_Answer(seen.result, seen.durable, window))
                continue
            owned = self._owned(record, blocks)
            if isinstance(owned, pb.AppendResult):
                answers.append(_Answer(owned, None, None))
                continue
            store = owned[0]
            try:
                result, end = self._store(store, record)
            except Exception:
                # A full disk, a fenced store, a frame that does not decode: this record and
                # the shard's later ones on this stream are refused, retriable.
                log.exception("forwarded record for shard %d not stored", record.shard)
                blocks[record.shard] = _Block(record.shard_epoch, UNAVAILABLE, 0, 0)
                answers.append(
                    _Answer(pb.AppendResult(seq=record.seq, status=UNAVAILABLE), None, None)
                )
                continue
            if end < 0:  # every destination refused: nothing stored
                answers.append(_Answer(result, None, None))
                continue
            group = groups.get(record.shard)
            durable = group[2] if group is not None else loop.create_future()
            groups[record.shard] = (store, max(end, group[1]) if group else end, durable)
            window.stored[record.seq] = _Stored(result, durable, now)
            answers.append(_Answer(result, durable, window))
            self.stored += 1
        for store, end, durable in groups.values():
            store.add_durable_waiter(end, durable)
        return answers

    def _owned(
        self, record: pb.Record, blocks: dict[int, _Block]
    ) -> tuple[ShardLog, int] | pb.AppendResult:
        """The log and epoch of ``record``'s shard, or the answer refusing the record."""
        block = blocks.get(record.shard)
        if block is not None and block.epoch == record.shard_epoch:
            return pb.AppendResult(
                seq=record.seq, status=block.status, owner=block.owner, epoch=block.owner_epoch
            )
        owned = self._local.shard(record.shard)
        if record.txn:
            # Half messages across nodes come with section 10; refused (retriable) until then.
            block = _Block(record.shard_epoch, UNAVAILABLE, 0, 0)
        elif owned is None:
            block = _Block(record.shard_epoch, NOT_OWNER, 0, 0)
        elif owned[1] != record.shard_epoch:
            block = _Block(record.shard_epoch, NOT_OWNER, self._node_id, owned[1])
        else:
            return owned
        blocks[record.shard] = block
        return pb.AppendResult(
            seq=record.seq, status=block.status, owner=block.owner, epoch=block.owner_epoch
        )

    def _store_encoded(
        self, store: ShardLog, record: pb.Record, frame: bytes, dests: int
    ) -> tuple[pb.AppendResult, int] | None:
        """Append ``record``'s frame as it came; None when the frame is not encoded as stored
        (its copy flag, delivery time or destinations differ from the record's: an origin
        that encoded the fields alone). ``frame``: its ``fields``; ``dests``: how many
        destinations it names."""
        if len(frame) < rec.HEADER_SIZE:
            return None
        flags, deliver_at_ms, dests_len = _FRAME_FIELDS.unpack_from(frame, rec.FLAGS_OFFSET)
        if (
            bool(flags & rec.FLAG_COPY) != record.copy
            or deliver_at_ms != record.deliver_at_ms
            or (dests > 1 and not dests_len)
        ):
            return None
        appended = store.append_encoded(frame)
        offset = -1
        if not record.copy:
            own = rec.frame_queue(frame)
            for topic, queue, first in appended.offsets:
                if (topic, queue) == own:
                    offset = first
                    break
        return pb.AppendResult(seq=record.seq, status=OK, offset=offset), appended.end

    def _store(self, store: ShardLog, record: pb.Record) -> tuple[pb.AppendResult, int]:
        """Append ``record`` to ``store``: its answer and the end to wait for (-1: refused by
        every destination, not stored)."""
        # The origin sent the record's fields as one frame of core/log/record.py (see
        # core/cluster/rpc/forward.py), encoded as stored here: appended as it came unless a
        # destination refuses it (then decoded and stored without those).
        frame = record.fields
        # No destinations: the record is indexed in its own (topic, queue) only.
        dests = [(dest.topic, dest.queue) for dest in record.dests] or [rec.frame_queue(frame)]
        if not self._local.refused(record.shard, dests):
            stored = self._store_encoded(store, record, frame, len(dests))
            if stored is not None:
                return stored
        rec.verify_frame(memoryview(frame), 0, len(frame))
        fields = rec.decode_record(frame, 0)
        refused = self._local.refused(record.shard, dests)
        if refused:
            dests = [dest for dest in dests if dest not in refused]
            if not dests:
                refused_pb = [pb.Dest(topic=t, queue=q) for t, q in refused]
                return pb.AppendResult(
                    seq=record.seq, status=REFUSED, offset=-1, refused=refused_pb
                ), -1
        appended = store.append(
            fields.topic,
            fields.queue,
            fields.body,
            key=fields.key,
            headers=fields.headers,
            tags=fields.tags,
            subject=fields.subject,
            client=fields.client,
            address=fields.address,
            # Its own queue alone: None, so the store's plain fast path may take it.
            destinations=None if dests == [(fields.topic, fields.queue)] else dests,
            protocol=fields.protocol,
            born_ms=fields.born_ms,
            deliver_at_ms=record.deliver_at_ms,
            # A Kafka batch keeps FLAG_BATCH and its count (core/cluster/rpc/forward.py).
            flags=(fields.flags & FORWARDED_FLAGS) | (rec.FLAG_COPY if record.copy else 0),
            record_count=fields.record_count,
        )
        offset = -1
        if not record.copy:
            for topic, queue, first in appended.offsets:
                if topic == fields.topic and queue == fields.queue:
                    offset = first
                    break
        result = pb.AppendResult(
            seq=record.seq,
            status=OK,
            offset=offset,
            refused=[pb.Dest(topic=t, queue=q) for t, q in refused],
        )
        return result, appended.end
