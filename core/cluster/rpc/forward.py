"""The origin's side of ``Append`` (docs/cluster.md section 7): records a node routed to shards
other nodes own, sent to those owners and settled once durable there.

:class:`Forwarder` implements :class:`core.broker.remote.RemoteAppend`. Per target node there is
one ``Append`` stream (:class:`_Target`); what one loop turn forwarded to a target goes out as one
``AppendBatch`` (split at ``forward_batch_bytes``), the gateways' one write per turn. Each record
takes the origin's next ``seq`` towards its target; the target answers in seq order once the
record is durable, which resolves its future.

Order per (origin, shard) is kept by never having a shard's records at two owners at once: a
shard's unanswered records (:class:`_Shard`) all go to one owner, and on ``NOT_OWNER`` or
``UNAVAILABLE`` the shard is held (later records wait), the owner read again
(``ShardOwners.refresh``) and every unanswered record resent, in publish order, to the owner
found. The target refuses a refused (shard, epoch)'s later records on the same stream too, so
a resend to the same owner at the same epoch (it was opening the shard) goes on a new stream.
A broken stream is reopened and its unanswered records resent with their seqs (the target drops
those it stored already). A record unanswered ``unavailable_wait_ms`` after it was forwarded,
or whose shard has no live owner that long, fails with :class:`core.errors.ShardUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from grpc import aio

from core.broker.remote import (
    Destination,
    ForwardResult,
    ForwardSettled,
    OwnerAddress,
    ShardOwners,
)
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.append import FORWARDED_FLAGS
from core.cluster.rpc.client import PeerUnavailable, RpcClient, peer_errors
from core.cluster.settings import ClusterSettings
from core.errors import ShardUnavailable
from core.log import record as rec
from core.log.store import encoded_headers, now_ms
from core.transactions.service import RecordFields

log = logging.getLogger(__name__)

# The first pause before reconnecting to a peer, or asking for a shard's owner again; doubled
# each time up to heartbeat_ms (the client's reconnect backoff is capped there too).
RETRY_MIN_S: Final = 0.05
# How often records are checked against their deadline at most (unavailable_wait_ms / 4 when
# that is shorter), so a deadline is kept within that much without a timer per record.
SWEEP_MAX_S: Final = 0.5
# Bytes a record adds to a batch besides its fields and destinations (seq, shard, epoch, tags).
RECORD_OVERHEAD: Final = 32


@dataclass(eq=False, slots=True)
class _Pending:
    """One forwarded record until its answer: the record, and where it was last sent."""

    shard: int
    dests: list[Destination]
    fields: bytes
    copy: bool
    deliver_at_ms: int
    size: int
    deadline: float  # loop time after which it fails with ShardUnavailable
    # What its outcome resolves: a future (forward) or a function (send), called once.
    future: asyncio.Future[ForwardResult] | None
    settled: ForwardSettled | None
    done: bool = False
    target: _Target | None = None  # None: held, not sent to anyone now
    seq: int = 0
    epoch: int = 0


@dataclass(eq=False, slots=True)
class _Shard:
    """A shard's unanswered records in publish order, all sent to ``owner`` unless ``held``."""

    number: int
    queue: deque[_Pending] = field(default_factory=deque)
    owner: OwnerAddress | None = None
    held: bool = False
    retries: int = 0  # refusals in a row, for the pause before the next attempt


@dataclass(eq=False, slots=True)
class _Target:
    """One owner node's ``Append`` stream and the records sent on it, not yet answered."""

    address: str
    next_seq: int = 1
    unanswered: dict[int, _Pending] = field(default_factory=dict)  # by seq, in seq order
    outbox: list[_Pending] = field(default_factory=list)  # forwarded this turn
    requests: asyncio.Queue[pb.AppendBatch | None] | None = None  # the open stream's, if any
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def encode_fields(
    topic: str,
    queue: int,
    body: bytes | memoryview | None,
    fields: RecordFields,
    *,
    record_count: int = 1,
    flags: int = 0,
    destinations: Sequence[Destination] = (),
    copy: bool = False,
    deliver_at_ms: int = 0,
) -> bytes:
    """A record's fields as ``Record.fields`` carries them: one frame of core/log/record.py,
    encoded as the owner stores it (``destinations`` unless only its own queue, ``FLAG_COPY``,
    ``deliver_at_ms``): the owner sets its store time and appends it as it came
    (``LogStore.append_encoded``).
    The log's own encoder and decoder, so there is no second format to keep in step with the
    frame; the receiver checks the frame's CRC32C and decodes it with ``decode_record``; the
    72-byte header is smaller than a protobuf message of the same nine fields would be, and
    one ``bytes`` field is copied once by protobuf instead of field by field."""
    tags = fields.get("tags")
    subject = fields.get("subject")
    client = fields.get("client")
    address = fields.get("address")
    return rec.encode_record(
        topic.encode(),
        queue,
        body,
        store_ms=now_ms(),
        key=fields.get("key", b""),
        headers=encoded_headers(fields.get("headers", ())),
        tags=rec.encode_tags(tags) if tags else b"",
        subject=subject.encode() if subject else b"",
        client=client.encode() if client else b"",
        address=address.encode() if address else b"",
        protocol=fields.get("protocol", rec.PROTOCOL_INTERNAL),
        born_ms=fields.get("born_ms", 0),
        destinations=(
            rec.encode_destinations(destinations)
            if destinations and list(destinations) != [(topic, queue)]
            else b""
        ),
        # A Kafka batch: FLAG_BATCH and its records' count travel in the frame.
        flags=(flags & FORWARDED_FLAGS) | (rec.FLAG_COPY if copy else 0),
        deliver_at_ms=deliver_at_ms,
        record_count=record_count,
    )


def _resolve(
    pending: _Pending, result: ForwardResult | None, error: ShardUnavailable | None
) -> None:
    """``pending``'s outcome to its future or settle function, once."""
    if pending.done:
        return
    pending.done = True
    if pending.settled is not None:
        pending.settled(result, error)
        return
    future = pending.future
    if future is None or future.done():
        return
    if error is not None:
        future.set_exception(error)
    elif result is not None:
        future.set_result(result)


async def _stream(requests: asyncio.Queue[pb.AppendBatch | None]) -> AsyncIterator[pb.AppendBatch]:
    """An ``Append`` call's requests: the batches put in ``requests`` until None (half-close)."""
    while (batch := await requests.get()) is not None:
        yield batch


class Forwarder:
    """:class:`core.broker.remote.RemoteAppend` over ``Append`` streams of ``client`` to the
    owners ``owners`` names. ``node`` and ``incarnation`` identify this node to the targets
    (their duplicate check is per incarnation); ``meta_version`` gives the metadata version
    the records were routed with. :meth:`aclose` stops it (``client`` stays the caller's)."""

    def __init__(
        self,
        client: RpcClient,
        owners: ShardOwners,
        settings: ClusterSettings,
        *,
        node: int,
        incarnation: int,
        meta_version: Callable[[], int] = lambda: 0,
    ) -> None:
        self._client = client
        self._owners = owners
        self._wait_s = settings.unavailable_wait_ms / 1000
        self._wait_ms = settings.unavailable_wait_ms
        self._batch_bytes = settings.forward_batch_bytes
        self._retry_max_s = max(RETRY_MIN_S, settings.heartbeat_ms / 1000)
        self._sweep_s = min(SWEEP_MAX_S, self._wait_s / 4)
        self._node = node
        self._incarnation = incarnation
        self._meta_version = meta_version
        self._shards: dict[int, _Shard] = {}
        self._targets: dict[str, _Target] = {}
        self._dirty: set[_Target] = set()
        self._flush_handle: asyncio.Handle | None = None
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._recoveries: set[asyncio.Task[None]] = set()
        self._closed = False
        # AppendBatch messages sent, AppendResult messages received, streams opened (counters
        # for stats and tests).
        self.batches_sent = 0
        self.answers_received = 0
        self.streams_opened = 0

    # -- forwarding ------------------------------------------------------------------------

    def forward(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        txn: str = "",
        record_count: int = 1,
        flags: int = 0,
    ) -> asyncio.Future[ForwardResult]:
        """See :meth:`core.broker.remote.RemoteAppend.forward`."""
        future: asyncio.Future[ForwardResult] = asyncio.get_running_loop().create_future()
        if txn:
            future.set_exception(
                ShardUnavailable(
                    shard, reason="half messages across nodes come with docs/cluster.md section 10"
                )
            )
            return future
        self._enqueue(
            shard, topic, queue, body, destinations, copy, deliver_at_ms, fields,
            record_count, flags, future, None,
        )  # fmt: skip
        return future

    def send(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        settled: ForwardSettled,
        record_count: int = 1,
        flags: int = 0,
    ) -> None:
        """See :meth:`core.broker.remote.RemoteAppend.send`."""
        self._enqueue(
            shard, topic, queue, body, destinations, copy, deliver_at_ms, fields,
            record_count, flags, None, settled,
        )  # fmt: skip

    def _enqueue(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        record_count: int,
        flags: int,
        future: asyncio.Future[ForwardResult] | None,
        settled: ForwardSettled | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        frame = encode_fields(
            topic, queue, body, fields, record_count=record_count, flags=flags,
            destinations=destinations, copy=copy, deliver_at_ms=deliver_at_ms,
        )  # fmt: skip
        dests = list(destinations)
        size = len(frame) + RECORD_OVERHEAD + sum(len(t) + 8 for t, _ in destinations)
        pending = _Pending(
            shard, dests, frame, copy, deliver_at_ms, size, loop.time() + self._wait_s, future,
            settled,
        )  # fmt: skip
        if self._closed:
            _resolve(pending, None, ShardUnavailable(shard, reason="this node is stopping"))
            return
        state = self._shards.get(shard)
        if state is None:
            state = self._shards[shard] = _Shard(shard)
        state.queue.append(pending)
        if not state.held:
            # While records are out to an owner, later ones follow them there (one owner at
            # a time per shard); else the table's owner now.
            owner = state.owner if len(state.queue) > 1 else None
            owner = owner or self._owners.owner_of(shard)
            if owner is None:
                self._hold(state, None)
            else:
                state.owner = owner
                self._assign(pending, owner)
        if self._sweep_handle is None:
            self._sweep_handle = loop.call_later(self._sweep_s, self._sweep)

    def _target(self, address: str) -> _Target:
        target = self._targets.get(address)
        if target is None:
            target = self._targets[address] = _Target(address)
        if target.task is None or target.task.done():
            target.task = asyncio.get_running_loop().create_task(self._run(target))
        return target

    def _assign(self, pending: _Pending, owner: OwnerAddress) -> None:
        """Send ``pending`` to ``owner`` with the turn's batch for it."""
        target = self._target(owner.rpc_address)
        pending.target = target
        pending.seq = target.next_seq
        pending.epoch = owner.epoch
        target.next_seq += 1
        target.unanswered[pending.seq] = pending
        target.outbox.append(pending)
        self._dirty.add(target)
        if self._flush_handle is None:
            # At the end of this turn: everything the turn forwarded to a target, one batch.
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        dirty, self._dirty = self._dirty, set()
        for target in dirty:
            if target.requests is not None:
                for batch in self._batches(target.outbox):
                    target.requests.put_nowait(batch)
            # A target without an open stream gets these with the unanswered ones it resends.
            target.outbox.clear()
            target.wake.set()

    def _batches(self, records: Sequence[_Pending]) -> list[pb.AppendBatch]:
        """``records`` as ``AppendBatch`` messages of up to ``forward_batch_bytes`` each (a
        larger record alone). Each ``Record`` is made in its batch (``records.add``): one
        made apart is copied whole into the batch, which cost the origin ~3 us a record."""
        origin = pb.Origin(
            node=self._node, incarnation=self._incarnation, meta_version=self._meta_version()
        )
        batches: list[pb.AppendBatch] = []
        batch: pb.AppendBatch | None = None
        size = 0
        for pending in records:
            if batch is None or (size and size + pending.size > self._batch_bytes):
                batch = pb.AppendBatch(origin=origin)
                batches.append(batch)
                size = 0
            record = batch.records.add(
                seq=pending.seq,
                shard=pending.shard,
                shard_epoch=pending.epoch,
                fields=pending.fields,
                copy=pending.copy,
                deliver_at_ms=pending.deliver_at_ms,
            )
            add_dest = record.dests.add
            for topic, queue in pending.dests:
                add_dest(topic=topic, queue=queue)
            size += pending.size
        self.batches_sent += len(batches)
        return batches

    # -- the stream to one target ----------------------------------------------------------

    async def _run(self, target: _Target) -> None:
        """Keep ``target``'s stream open while it has records unanswered: (re)open it, resend
        every unanswered record in seq order, settle the answers."""
        pause = RETRY_MIN_S
        while not self._closed:
            if not target.unanswered:
                target.wake.clear()
                await target.wake.wait()
                continue
            requests: asyncio.Queue[pb.AppendBatch | None] = asyncio.Queue()
            target.outbox.clear()  # sent below with the rest
            for batch in self._batches(list(target.unanswered.values())):
                requests.put_nowait(batch)
            target.requests = requests
            answered = False
            call: aio.StreamStreamCall | None = None
            try:
                async with peer_errors(target.address):
                    call = self._client.stub(target.address).Append(_stream(requests))
                    self.streams_opened += 1
                    async for result in call:
                        answered = True
                        self._answer(target, result)
            except PeerUnavailable as error:
                log.info("forwarding to %s: %s; resending", target.address, error)
                self._rehome(target)
            except aio.AioRpcError as error:
                log.warning(
                    "forwarding to %s: %s %s; resending",
                    target.address,
                    error.code().name,
                    error.details(),
                )
            except RuntimeError:  # the client is closed: this node is stopping
                return
            finally:
                if target.requests is requests:
                    target.requests = None
                requests.put_nowait(None)
                if call is not None and not call.done():
                    call.cancel()
            if answered:
                pause = RETRY_MIN_S
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._retry_max_s)

    def _rehome(self, target: _Target) -> None:
        """``target`` cannot be reached: the owners of the shards it has records of are read
        again (an owner killed and restarted listens on a new address; nothing else tells the
        cached owner apart), and the records of a shard owned elsewhere now go there. Those of
        a shard the table still gives to ``target`` stay on it with their seqs, so that an
        owner back at the same address drops the ones it stored already."""
        shards = {pending.shard for pending in target.unanswered.values()}
        if not shards:
            return
        task = asyncio.get_running_loop().create_task(self._rehome_shards(target.address, shards))
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def _rehome_shards(self, address: str, shards: set[int]) -> None:
        for number in sorted(shards):
            state = self._shards[number]
            if state.held or state.owner is None or state.owner.rpc_address != address:
                continue  # moved or held since
            was = state.owner
            owner = await self._refresh(number)
            if self._closed:
                return
            if owner is None or state.held or state.owner is not was:
                continue  # no owner known now (tried again at the next failure), or moved
            if (owner.rpc_address, owner.epoch) != (was.rpc_address, was.epoch):
                self._hold(state, None)

    def _restart(self, target: _Target) -> None:
        """End ``target``'s stream gracefully (its answers still come); the next one resends
        what stays unanswered."""
        requests, target.requests = target.requests, None
        if requests is not None:
            requests.put_nowait(None)

    def _answer(self, target: _Target, result: pb.AppendResult) -> None:
        self.answers_received += 1
        if result.offsets:
            # A run of plain OKs: seq, seq + 1, ... with these offsets (append.py's _runs).
            for seq, offset in enumerate(result.offsets, result.seq):
                pending = target.unanswered.pop(seq, None)
                if pending is not None:
                    self._settle(pending, offset, [])
            return
        pending = target.unanswered.pop(result.seq, None)
        if pending is None:
            return  # failed at its deadline, or moved to another owner since
        if result.status == pb.AppendResult.OK or result.status == pb.AppendResult.REFUSED:
            refused = [(dest.topic, dest.queue) for dest in result.refused]
            self._settle(pending, result.offset, refused)
            return
        pending.target = None
        state = self._shards[pending.shard]
        log.info(
            "shard %d refused by %s at epoch %d (%s): resending its records to its owner",
            pending.shard,
            target.address,
            pending.epoch,
            pb.AppendResult.Status.Name(result.status),
        )
        self._hold(state, (target.address, pending.epoch))

    def _settle(self, pending: _Pending, offset: int, refused: list[Destination]) -> None:
        """``pending`` answered (stored, or refused by every destination): off its shard's
        queue, its future resolved."""
        pending.target = None
        state = self._shards[pending.shard]
        queue = state.queue
        if queue and queue[0] is pending:
            queue.popleft()
        else:
            queue.remove(pending)
        state.retries = 0
        _resolve(pending, ForwardResult(offset, refused), None)

    # -- a shard without a (willing) owner -------------------------------------------------

    def _hold(self, state: _Shard, refused_by: tuple[str, int] | None) -> None:
        """Stop sending ``state``'s records and find its owner again; ``refused_by``: the
        owner (address, epoch) that refused them."""
        if state.held:
            return
        state.held = True
        state.owner = None
        for pending in state.queue:
            if pending.target is not None:
                # The target refuses it too (same shard and epoch on that stream): resent
                # once an owner is found, with a new seq.
                pending.target.unanswered.pop(pending.seq, None)
                pending.target = None
        task = asyncio.get_running_loop().create_task(self._recover(state, refused_by))
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def _recover(self, state: _Shard, refused_by: tuple[str, int] | None) -> None:
        owner: OwnerAddress | None = None
        while state.queue and not self._closed:
            owner = await self._refresh(state.number)
            pause = min(RETRY_MIN_S * 2**state.retries, self._retry_max_s)
            if owner is None:
                state.retries += 1
                await asyncio.sleep(pause)
                continue
            if (owner.rpc_address, owner.epoch) == refused_by:
                # The owner the table names refused at the epoch it names: it may not have
                # opened the shard yet. Again after a pause, on a new stream (the refusal
                # holds for that shard and epoch on the old one).
                state.retries += 1
                await asyncio.sleep(pause)
                self._restart(self._target(owner.rpc_address))
            break
        state.held = False
        if self._closed or not state.queue or owner is None:
            return
        state.owner = owner
        for pending in state.queue:
            self._assign(pending, owner)

    async def _refresh(self, shard: int) -> OwnerAddress | None:
        try:
            return await self._owners.refresh(shard)
        except Exception:  # the metadata store unreachable: no owner known now
            log.exception("the owner of shard %d could not be read", shard)
            return None

    # -- deadlines and stopping ------------------------------------------------------------

    def _sweep(self) -> None:
        """Fail every record whose deadline passed (a shard's queue is in deadline order)."""
        self._sweep_handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = False
        for state in self._shards.values():
            queue = state.queue
            while queue and queue[0].deadline <= now:
                self._fail(queue.popleft(), state)
            waiting = waiting or bool(queue)
        if waiting and not self._closed:
            self._sweep_handle = loop.call_later(self._sweep_s, self._sweep)

    def _fail(self, pending: _Pending, state: _Shard) -> None:
        if pending.target is not None:
            pending.target.unanswered.pop(pending.seq, None)
            pending.target = None
        if pending.done:
            return
        if self._closed:
            reason = "this node is stopping"
        elif state.held and state.owner is None:
            reason = f"no live owner within unavailable_wait_ms ({self._wait_ms})"
        else:
            reason = f"no answer within unavailable_wait_ms ({self._wait_ms})"
        owner = state.owner.node if state.owner is not None else None
        _resolve(pending, None, ShardUnavailable(state.number, owner, reason))

    async def aclose(self) -> None:
        """Stop the streams and fail every unanswered record with ShardUnavailable."""
        self._closed = True
        for handle in (self._flush_handle, self._sweep_handle):
            if handle is not None:
                handle.cancel()
        tasks = [t.task for t in self._targets.values() if t.task is not None]
        tasks.extend(self._recoveries)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for state in self._shards.values():
            while state.queue:
                self._fail(state.queue.popleft(), state)
