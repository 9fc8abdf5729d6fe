"""``Consume`` and ``Get`` on the queue's owner: a queue consumed from another node (docs/cluster.md
sections 7 and 8, step 6 of section 15).

:class:`ConsumeService` answers both calls over the node's own ack queues; the node plugs
``service.consume`` and ``service.get`` into :class:`~core.cluster.rpc.server.NodeService`. The
consumer's side is :mod:`core.cluster.rpc.remote_queue`.

**Consume**, one stream per remote consumer:

- The first request is an ``Attach``: ``queue`` is the queue's topic as the core names it
  (vhost-qualified by the gateway, e.g. ``amq.queue.jobs``), an ack queue's queue 0. No such
  queue: NOT_FOUND. Otherwise a consumer is added to the ack queue and the owner answers with an
  empty batch, the attach's confirmation (AMQP sends ``basic.consume-ok`` only once the queue is
  known to exist), before any delivery.
- Credit: ``prefetch`` is the initial credit; each delivery spends one, ``credit`` adds more.
  The owner delivers while credit lasts, so nothing waits in buffers beyond it (gRPC's flow
  control bounds bytes, credit bounds messages). The consumer's side decides what credit means:
  for a consumer with a prefetch it returns one per settled delivery (so at most ``prefetch``
  are unsettled), for one without (``no_ack``, prefetch 0) one per delivery handed to its client
  (so only the buffers are bounded). ``pause`` stops deliveries until a ``pause: false``.
- Tags: the owner numbers the stream's deliveries 1, 2, ...; ``settle`` acks, nacks or rejects
  by those tags, ``multiple`` and ``requeue`` as AMQP's (``multiple`` with tag 0: all). A tag
  that is not unsettled on the stream fails it with FAILED_PRECONDITION (AMQP's 406 "unknown
  delivery tag" closes the channel too). ``no_ack`` deliveries are settled as they go.
- The end: when the stream ends (the consumer half-closes), breaks or fails, the consumer is
  detached and its unsettled deliveries go back to the queue, redelivered first and flagged, as
  a closed channel's do. When the queue is deleted (or :meth:`ConsumeService.cancel` is called:
  the shard moves), the owner sends ``cancelled`` with a reason and ends the stream.

**Get** (AMQP ``basic.get``): ``Get(ConsumeControl{attach})`` takes the next ready record
(``attach.queue``, ``no_ack``): a batch of one delivery, or an empty batch when none is ready;
``message_count`` is the queue's ready records left (AMQP get-ok's count).
A delivery taken without ``no_ack`` is held by the owner, under a tag unique on this node, until
``Get(ConsumeControl{settle})`` settles it by its tags (listed: ``multiple`` is refused, since
tags of one node's gets are not one holder's), or :meth:`ConsumeService.release_gets` returns
the ones of a holder (``attach.client_id``) that went away.

**The record** travels in ``Delivery.fields`` as a commit-log frame (:mod:`core.log.record`):
the frame the owner's log stores, rebuilt for the one message delivered (a Kafka batch's inner
record, a dead letter's headers laid over its target's). Why that encoding: it already carries
every field a gateway builds its frames from (topic, subject, key, headers, tags, client,
address, protocol, times, flags, body), with a CRC32C over all of it; the ``Append`` call ships
records in it too (``Record.fields``), so the cluster has one record codec both ways; and
:func:`~core.log.record.decode_record` is the log's own pure, measured decoder. ``Delivery``
carries the queue's ``topic``, ``queue`` and ``offset`` beside it.

Not thread-safe: the event loop's thread, as the ack queues.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import suppress
from typing import Final, NoReturn, Protocol

import grpc
from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.delivery.ackqueue import AckQueue, Consumer, Delivery
from core.delivery.message import Message
from core.log import record as rec

log = logging.getLogger(__name__)

# A consumer's prefetch that admits nothing now (core.delivery.handles.NO_CREDIT: 0 is "no limit").
_NO_CREDIT: Final = -1
# How often a waiting stream looks whether its queue was deleted: the ack queue tells its
# consumers nothing when it closes (the gateway that deletes it cancels its own consumers), so
# a remote consumer learns it within this.
QUEUE_CHECK_INTERVAL_S: Final = 0.2
# A batch is cut past this many bytes of records (one record larger than it goes alone): a batch
# must stay under gRPC's message limit, max_message_size + 1 MiB (core/cluster/rpc/options.py).
BATCH_BYTES: Final = 256 * 1024
# The reasons a consumer is cancelled with (DeliveryBatch.reason).
REASON_QUEUE_DELETED: Final = "queue deleted"
# Flags the frame encoder sets itself from the key and body it is given (and a batch's inner
# record is not a batch).
_FRAME_SETS: Final = rec.FLAG_NULL_KEY | rec.FLAG_NULL_BODY | rec.FLAG_BATCH


class LocalQueues(Protocol):
    """What the service needs of its node: the node's ack queue over ``(topic, queue)``, or None
    (``core.broker.Node.ack_queue`` is one)."""

    def ack_queue(self, topic: str, queue: int = 0) -> AckQueue | None: ...


# -- the record on the wire -----------------------------------------------------------------


def encode_message(message: Message) -> bytes:
    """``message`` as a commit-log frame (the module docstring says why this encoding)."""
    return rec.encode_record(
        message.topic.encode(),
        message.queue,
        message.body,
        store_ms=message.store_ms,
        born_ms=message.born_ms,
        key=message.key,
        headers=rec.encode_headers(message.headers) if message.headers else b"",
        tags=rec.encode_tags(message.tags) if message.tags else b"",
        subject=message.subject.encode(),
        client=message.client.encode(),
        address=message.address.encode(),
        flags=message.flags & ~_FRAME_SETS,
        protocol=message.protocol,
    )


def encode_delivery(delivery: Delivery, tag: int) -> pb.Delivery:
    message = delivery.message
    return pb.Delivery(
        tag=tag,
        fields=encode_message(message),
        redelivered=delivery.redelivered,
        count=delivery.delivery_count,
        topic=delivery.queue.topic,
        queue=delivery.queue.queue,
        offset=delivery.offset,
    )


def decode_message(delivery: pb.Delivery) -> Message:
    """The :class:`Message` a :func:`encode_delivery` carries, as the consumer's gateway reads it.
    ``position`` is -1 (the record is in the owner's log, not this node's) and ``enqueued_ms``
    the record's store time (TTL is the owner's to apply). :class:`CorruptRecordError` when the
    frame fails its checks."""
    frame = memoryview(delivery.fields)
    rec.verify_frame(frame, 0, len(frame))
    record = rec.decode_record(frame, 0, position=-1)
    return Message(
        record.topic,
        delivery.queue,
        delivery.offset,
        record.subject,
        record.key,
        record.headers,
        record.tags,
        record.body,
        record.protocol,
        record.client,
        record.address,
        record.born_ms,
        record.store_ms,
        record.flags,
        -1,
        record.store_ms,
    )


# -- the service ------------------------------------------------------------------------------


class _Failed(Exception):
    """A request the stream cannot take: the call ends with ``code``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


async def _abort(context: aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("ServicerContext.abort raises")  # pragma: no cover


def _settle_one(queue: AckQueue, delivery: Delivery, settle: pb.Settle) -> None:
    # Only while the queue still holds it as this delivery (a deleted queue took it back).
    if queue.inflight.get(delivery.offset) is not delivery:
        return
    if settle.op == pb.Settle.ACK:
        queue.ack(delivery.offset)
    else:  # NACK and REJECT: requeue, or dead-letter / drop (REJECT is a NACK of one)
        queue.nack(delivery.offset, requeue=settle.requeue)


class _ConsumerStream:
    """One ``Consume`` stream's consumer on the owner's ack queue."""

    def __init__(self, queue: AckQueue, attach: pb.Attach) -> None:
        self.queue = queue
        self.no_ack = attach.no_ack
        self.exclusive = attach.exclusive
        self.credit = attach.prefetch
        self.paused = False
        self._tags = itertools.count(1)
        self.unsettled: dict[int, Delivery] = {}  # tag -> delivery, tags in increasing order
        self.pending: list[pb.Delivery] = []
        self.wake = asyncio.Event()
        self.ended = False  # the consumer half-closed its side
        self.failure: _Failed | None = None
        self.cancel_reason: str | None = None
        # Added with no credit: the pump the add schedules runs after _apply_credit.
        self.consumer: Consumer = queue.add_consumer(
            attach.consumer_tag, _NO_CREDIT, self._deliver, no_ack=attach.no_ack
        )
        self._apply_credit()

    def _deliver(self, delivery: Delivery) -> None:
        """The ack queue's callback (from its pump): one credit spent."""
        tag = next(self._tags)
        if not self.no_ack:
            self.unsettled[tag] = delivery
        self.pending.append(encode_delivery(delivery, tag))
        self.credit -= 1
        if self.credit <= 0:
            self.consumer.prefetch = _NO_CREDIT  # the pump checks before each delivery
        self.wake.set()

    def _apply_credit(self) -> None:
        """Turn the credit left into the consumer's in-flight limit: ``inflight + credit``
        (settles lower ``inflight`` without giving credit back), unlimited for ``no_ack`` (its
        deliveries leave nothing in flight; :meth:`_deliver` stops it at zero credit)."""
        consumer = self.consumer
        if self.paused or self.credit <= 0:
            consumer.prefetch = _NO_CREDIT
            return
        consumer.prefetch = 0 if self.no_ack else consumer.inflight + self.credit
        self.queue.notify()

    def control(self, request: pb.ConsumeControl) -> None:
        """Apply one request after the attach; :class:`_Failed` for one it cannot take."""
        kind = request.WhichOneof("op")
        if kind == "credit":
            self.credit += request.credit
        elif kind == "settle":
            self._settle(request.settle)
        elif kind == "pause":
            self.paused = request.pause
        else:
            raise _Failed(grpc.StatusCode.INVALID_ARGUMENT, f"{kind} after the attach")
        self._apply_credit()

    def _settle(self, settle: pb.Settle) -> None:
        chosen: list[int] = []
        for tag in settle.tags:
            if settle.multiple:
                chosen.extend(t for t in self.unsettled if tag == 0 or t <= tag)
            elif tag in self.unsettled:
                chosen.append(tag)
            else:
                raise _Failed(grpc.StatusCode.FAILED_PRECONDITION, f"unknown delivery tag {tag}")
        for tag in chosen:
            delivery = self.unsettled.pop(tag, None)
            if delivery is not None:
                _settle_one(self.queue, delivery, settle)

    @property
    def queue_gone(self) -> bool:
        return self.queue.deleted or self.consumer not in self.queue.consumers

    def take_batch(self) -> pb.DeliveryBatch:
        """The pending deliveries, up to :data:`BATCH_BYTES` (at least one)."""
        pending = self.pending
        size = 0
        cut = 0
        while cut < len(pending) and (cut == 0 or size < BATCH_BYTES):
            size += len(pending[cut].fields)
            cut += 1
        batch = pb.DeliveryBatch(deliveries=pending[:cut])
        del pending[:cut]
        return batch

    def detach(self) -> int:
        """Stop the consumer; its unsettled deliveries go back to the queue, redelivered."""
        self.unsettled.clear()
        return self.queue.remove_consumer(self.consumer)

    async def read_controls(self, requests: AsyncIterator[pb.ConsumeControl]) -> None:
        """The consumer's requests after the attach, applied as they come."""
        try:
            async for request in requests:
                self.control(request)
        except _Failed as failure:
            self.failure = failure
        finally:
            self.ended = True
            self.wake.set()


class ConsumeService:
    """``Consume`` and ``Get`` over the ack queues of ``local`` (see the module docstring)."""

    def __init__(self, local: LocalQueues) -> None:
        self._local = local
        self._streams: set[_ConsumerStream] = set()
        self._get_tags = itertools.count(1)
        # Get deliveries taken with acks, until settled: tag -> (holder, delivery).
        self._held: dict[int, tuple[str, Delivery]] = {}

    def _queue(self, name: str) -> AckQueue:
        queue = self._local.ack_queue(name)
        if queue is None:
            raise _Failed(grpc.StatusCode.NOT_FOUND, f"no queue {name!r} on this node")
        return queue

    def cancel(self, topic: str | None, reason: str) -> int:
        """End the remote consumers of the queue ``topic`` (None: of every queue) with
        ``cancelled`` and ``reason`` (the shard is moving away, the node stops); how many."""
        chosen = [s for s in self._streams if topic is None or s.queue.topic == topic]
        for stream in chosen:
            stream.cancel_reason = reason
            stream.wake.set()
        return len(chosen)

    @property
    def consumers(self) -> int:
        """Remote consumers attached now."""
        return len(self._streams)

    def _attach(self, attach: pb.Attach) -> _ConsumerStream:
        queue = self._queue(attach.queue)
        if attach.exclusive and queue.consumers:
            raise _Failed(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"cannot obtain exclusive access to queue {attach.queue!r}: it has consumers",
            )
        if any(s.exclusive and s.queue is queue for s in self._streams):
            raise _Failed(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"queue {attach.queue!r} has an exclusive consumer",
            )
        return _ConsumerStream(queue, attach)

    async def consume(
        self, requests: AsyncIterator[pb.ConsumeControl], context: aio.ServicerContext
    ) -> AsyncIterator[pb.DeliveryBatch]:
        """``NodeService.consume``: one remote consumer, for as long as its stream lasts."""
        first = await anext(aiter(requests), None)
        if first is None:
            return  # the consumer went away before attaching
        if first.WhichOneof("op") != "attach":
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "the first request attaches")
        try:
            stream = self._attach(first.attach)
        except _Failed as failure:
            await _abort(context, failure.code, failure.details)
        self._streams.add(stream)
        reader = asyncio.create_task(stream.read_controls(requests))
        try:
            yield pb.DeliveryBatch()  # attached
            while True:
                stream.wake.clear()
                if stream.failure is not None:
                    await _abort(context, stream.failure.code, stream.failure.details)
                reason = stream.cancel_reason or (
                    REASON_QUEUE_DELETED if stream.queue_gone else None
                )
                if reason is not None:
                    yield pb.DeliveryBatch(cancelled=True, reason=reason)
                    return
                if stream.pending:
                    yield stream.take_batch()
                    continue
                if stream.ended:
                    return  # the consumer closed its side: the call ends, the consumer goes
                with suppress(TimeoutError):
                    async with asyncio.timeout(QUEUE_CHECK_INTERVAL_S):
                        await stream.wake.wait()
        finally:
            self._streams.discard(stream)
            reader.cancel()
            with suppress(asyncio.CancelledError):
                await reader
            returned = stream.detach()
            log.debug(
                "remote consumer %r of %s detached, %d back to the queue",
                first.attach.consumer_tag,
                first.attach.queue,
                returned,
            )

    async def get(
        self, request: pb.ConsumeControl, context: aio.ServicerContext
    ) -> pb.DeliveryBatch:
        """``NodeService.get``: basic.get (an ``attach``), or the settle of gets (a ``settle``)."""
        kind = request.WhichOneof("op")
        try:
            if kind == "attach":
                return self._take_one(request.attach)
            if kind == "settle":
                self._settle_gets(request.settle)
                return pb.DeliveryBatch()
            raise _Failed(
                grpc.StatusCode.INVALID_ARGUMENT, f"Get takes attach or settle, not {kind}"
            )
        except _Failed as failure:
            await _abort(context, failure.code, failure.details)

    def _take_one(self, attach: pb.Attach) -> pb.DeliveryBatch:
        queue = self._queue(attach.queue)
        delivery = queue.get(no_ack=attach.no_ack)
        if delivery is None:
            return pb.DeliveryBatch(message_count=queue.message_count())
        tag = next(self._get_tags)
        if not attach.no_ack:
            self._held[tag] = (attach.client_id, delivery)
        return pb.DeliveryBatch(
            deliveries=[encode_delivery(delivery, tag)], message_count=queue.message_count()
        )

    def _settle_gets(self, settle: pb.Settle) -> None:
        if settle.multiple:
            raise _Failed(
                grpc.StatusCode.INVALID_ARGUMENT, "a settle of gets lists its tags (no multiple)"
            )
        unknown = [tag for tag in settle.tags if tag not in self._held]
        if unknown:
            raise _Failed(grpc.StatusCode.FAILED_PRECONDITION, f"unknown delivery tags {unknown}")
        for tag in settle.tags:
            _holder, delivery = self._held.pop(tag)
            _settle_one(delivery.queue, delivery, settle)

    def release_gets(self, holder: str) -> int:
        """Return the unsettled gets of ``holder`` (an ``attach.client_id``) to their queues,
        redelivered: its connection or node went away. How many."""
        return self._requeue(tag for tag, (who, _) in list(self._held.items()) if who == holder)

    def release_gets_where(self, gone: Callable[[str], bool]) -> int:
        """:meth:`release_gets` of every holder ``gone(holder)`` is true of. How many."""
        holders = {who for who, _ in self._held.values()}
        return sum(self.release_gets(holder) for holder in holders if gone(holder))

    def _requeue(self, tags: Iterable[int]) -> int:
        settle = pb.Settle(op=pb.Settle.NACK, requeue=True)
        count = 0
        for tag in tags:
            _holder, delivery = self._held.pop(tag)
            _settle_one(delivery.queue, delivery, settle)
            count += 1
        return count
