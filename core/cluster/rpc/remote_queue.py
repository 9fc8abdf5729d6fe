"""A queue consumed from another node: the consumer's side of ``Consume`` and ``Get``
(docs/cluster.md sections 7 and 8; the owner's side and the wire rules are
:mod:`core.cluster.rpc.consume`).

:class:`RemoteConsumer` is one consumer of a queue whose owner is the node at ``address``: its
deliveries come to a callback (``deliver``, as ``BrokerAPI.consume`` calls a gateway back) or,
without one, out of ``async for``; :meth:`~RemoteConsumer.ack`, :meth:`~RemoteConsumer.nack`
and :meth:`~RemoteConsumer.reject` settle them by tag (``multiple`` and ``requeue`` as AMQP's),
and credit goes back to the owner as they are settled (a consumer with a prefetch) or handed out
(``no_ack`` or prefetch 0), so the owner never sends more than that. Its other names mirror
``core.api``'s :class:`~core.delivery.handles.Subscription` (``tag``, ``inflight``,
``prefetch``, ``pause``, ``resume``, ``detach``), so the node can put it behind that handle;
``on_cancel`` is section 6's ``Subscription.on_cancel`` (the owner cancelled it, or went away).

:func:`remote_get` is basic.get on such a queue (:func:`remote_get_counted` with the owner's
count left), :func:`settle_gets` settles what it took.

The settling calls are synchronous, as a gateway makes them from its read: they queue the
request, and one writer task sends the stream's requests in order. Not thread-safe: one loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Final

import grpc
from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.client import PEER_GONE, RpcClient, peer_errors
from core.cluster.rpc.consume import decode_message
from core.delivery.message import Message

log = logging.getLogger(__name__)

# The credit a consumer without a limit (no_ack, or prefetch 0) keeps at the owner: deliveries
# on their way or waiting in this node's buffer, at most. Returned in quarters, so the owner is
# never left without credit while deliveries are handed out.
STREAM_WINDOW: Final = 256
# How long close() waits for the owner to end the stream after this side half-closed.
CLOSE_WAIT_S: Final = 5.0


@dataclass(slots=True)
class RemoteDelivery:
    """A delivery from a remote queue, named as :class:`~core.delivery.ackqueue.Delivery`'s
    fields (``message``, ``offset``, ``redelivered``, ``delivery_count``) plus the owner's
    ``tag`` it is settled by, and the queue it came from (``topic``, ``queue``)."""

    tag: int
    message: Message
    redelivered: bool
    delivery_count: int
    topic: str
    queue: int
    offset: int


def _delivery(raw: pb.Delivery) -> RemoteDelivery:
    return RemoteDelivery(
        raw.tag,
        decode_message(raw),
        raw.redelivered,
        raw.count,
        raw.topic,
        raw.queue,
        raw.offset,
    )


class RemoteConsumer:
    """One consumer of a remote queue over a ``Consume`` stream: made by :meth:`attach`, ended
    by :meth:`detach` (or :meth:`close`)."""

    def __init__(
        self,
        call: aio.StreamStreamCall,
        address: str,
        queue: str,
        tag: str,
        prefetch: int,
        *,
        no_ack: bool,
        deliver: Callable[[RemoteDelivery], None] | None,
        on_cancel: Callable[[str], None] | None,
    ) -> None:
        self._call = call
        self.address = address
        self.queue = queue
        self._tag = tag
        self._prefetch = prefetch
        self.no_ack = no_ack
        # With a prefetch, credit comes back as deliveries are settled; without, as they are
        # handed to the client (_target says how much the owner should hold).
        self._limited = prefetch > 0 and not no_ack
        # Credit the owner holds as this side counts it: granted, less the deliveries received
        # (those in transit make it high, by as many as they will add to _unsettled or
        # _buffered, so _target - _outstanding stays right).
        self._outstanding = prefetch if self._limited else STREAM_WINDOW
        self._buffered = 0  # received, not yet handed out of async for
        self._paused = False
        self._top_up_due = False
        self._deliver = deliver
        self.on_cancel = on_cancel
        self._unsettled: dict[int, RemoteDelivery] = {}  # tag -> delivery, in tag order
        self._outgoing: asyncio.Queue[pb.ConsumeControl | None] = asyncio.Queue()
        self._inbox: asyncio.Queue[RemoteDelivery | None] = asyncio.Queue()
        self.cancelled = False
        self.cancel_reason = ""
        self.requests_sent = 0  # ConsumeControl messages written (a counter for tests)
        self._closing = False
        self._writer = asyncio.create_task(self._write())
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def attach(
        cls,
        client: RpcClient,
        address: str,
        queue: str,
        tag: str,
        prefetch: int,
        *,
        no_ack: bool = False,
        exclusive: bool = False,
        client_id: str = "",
        deliver: Callable[[RemoteDelivery], None] | None = None,
        on_cancel: Callable[[str], None] | None = None,
    ) -> RemoteConsumer:
        """Consume ``queue`` (its topic as the core names it) on the node at ``address``, at
        most ``prefetch`` unsettled (0: no limit). Returns once the owner confirmed the attach;
        ``grpc.aio.AioRpcError`` NOT_FOUND when it has no such queue, FAILED_PRECONDITION when
        ``exclusive`` cannot be had, :class:`PeerUnavailable` when the owner cannot be reached.
        ``deliver``: called with each delivery; without it, read them with ``async for``."""
        call = client.stub(address).Consume()
        consumer = cls(
            call,
            address,
            queue,
            tag,
            prefetch,
            no_ack=no_ack,
            deliver=deliver,
            on_cancel=on_cancel,
        )
        attach = pb.Attach(
            queue=queue,
            consumer_tag=tag,
            client_id=client_id,
            prefetch=consumer._outstanding,
            no_ack=no_ack,
            exclusive=exclusive,
        )
        consumer._send(pb.ConsumeControl(attach=attach))
        try:
            async with peer_errors(address):
                confirmation = await call.read()
        except BaseException:
            await consumer._stop_writer()
            call.cancel()
            raise
        if confirmation is aio.EOF or confirmation.deliveries or confirmation.cancelled:
            await consumer._stop_writer()
            call.cancel()
            raise RuntimeError(f"the owner at {address} did not confirm the attach to {queue!r}")
        consumer._reader = asyncio.create_task(consumer._read())
        return consumer

    # -- Subscription's names ----------------------------------------------------------------

    @property
    def tag(self) -> str:
        return self._tag

    @property
    def inflight(self) -> int:
        """Deliveries received and not settled yet."""
        return len(self._unsettled)

    @property
    def prefetch(self) -> int:
        """Its limit: 0 none."""
        return self._prefetch

    @property
    def paused(self) -> bool:
        return self._paused

    def set_prefetch(self, limit: int) -> None:
        """A new limit (AMQP's basic.qos after the consume; 0: none): more credit goes to the
        owner at once when it grows, and less comes back as deliveries are settled when it
        shrinks (credit cannot be taken back, so the owner may still send what it held). A
        ``no_ack`` consumer keeps no limit, as AMQP ignores its prefetch."""
        if limit < 0:
            raise ValueError(f"a prefetch is 0 or more, not {limit}")
        self._prefetch = limit
        self._limited = limit > 0 and not self.no_ack
        self._top_up()

    def pause(self) -> None:
        """The owner delivers nothing more until :meth:`resume`; what is in flight stays
        settleable."""
        if not self._paused:
            self._paused = True
            self._send(pb.ConsumeControl(pause=True))

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._send(pb.ConsumeControl(pause=False))

    async def detach(self) -> int:
        """Stop it: the stream ends, and the owner puts its unsettled deliveries back in the
        queue, redelivered. Returns how many were unsettled here."""
        unsettled = len(self._unsettled)
        self._unsettled.clear()
        if not self._closing:
            self._closing = True
            self._send(None)  # half-close: the owner ends the call
            reader = self._reader
            if reader is not None:
                with suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reader), CLOSE_WAIT_S)
            self._call.cancel()
            if reader is not None:
                reader.cancel()
                with suppress(asyncio.CancelledError):
                    await reader
            await self._stop_writer()
            self._inbox.put_nowait(None)
        return unsettled

    async def close(self) -> None:
        await self.detach()

    # -- settling ----------------------------------------------------------------------------

    def ack(self, tag: int, *, multiple: bool = False) -> None:
        self._settle(pb.Settle.ACK, tag, multiple, requeue=False)

    def nack(self, tag: int, *, multiple: bool = False, requeue: bool = True) -> None:
        """Back to the queue (``requeue``, redelivered), else dead-lettered or dropped."""
        self._settle(pb.Settle.NACK, tag, multiple, requeue=requeue)

    def reject(self, tag: int, *, requeue: bool = True) -> None:
        self._settle(pb.Settle.REJECT, tag, False, requeue=requeue)

    def _settle(self, op: pb.Settle.Op.ValueType, tag: int, multiple: bool, requeue: bool) -> None:
        """Checked here (AMQP's 406 "unknown delivery tag" is the gateway's to send), then sent;
        a settle also returns the credit of what it settled."""
        if self.no_ack:
            raise ValueError("a no_ack consumer settles nothing")
        if multiple:
            settled = [t for t in self._unsettled if tag == 0 or t <= tag]
        elif tag in self._unsettled:
            settled = [tag]
        else:
            raise ValueError(f"unknown delivery tag {tag}")
        if not settled:
            return
        for settled_tag in settled:
            del self._unsettled[settled_tag]
        self._send(
            pb.ConsumeControl(
                settle=pb.Settle(op=op, tags=[tag], multiple=multiple, requeue=requeue)
            )
        )
        self._top_up()

    # -- credit ------------------------------------------------------------------------------

    def _target(self) -> int:
        """The credit the owner should hold now: with a limit, what the unsettled deliveries
        leave of it; without, the window less what waits in this node's buffer."""
        if self._limited:
            return self._prefetch - len(self._unsettled)
        return STREAM_WINDOW - self._buffered

    def _top_up(self) -> None:
        """Send the credit the owner lacks, once what runs now is done: a gateway settles
        deliveries, then changes the limit (AMQP's channel-wide prefetch) in one read, and
        credit sent in between could not be taken back."""
        if not self._top_up_due:
            self._top_up_due = True
            asyncio.get_running_loop().call_soon(self._send_credit)

    def _send_credit(self) -> None:
        """With a limit, as soon as one is missing; without, in quarters of the window (fewer,
        larger messages; the owner never runs dry)."""
        self._top_up_due = False
        missing = self._target() - self._outstanding
        if missing >= (1 if self._limited else STREAM_WINDOW // 4):
            self._outstanding += missing
            self._send(pb.ConsumeControl(credit=missing))

    # -- deliveries out ----------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[RemoteDelivery]:
        return self

    async def __anext__(self) -> RemoteDelivery:
        if self._deliver is not None:
            raise TypeError("this consumer's deliveries go to its callback")
        delivery = await self._inbox.get()
        if delivery is None:
            self._inbox.put_nowait(None)  # every later read ends too
            raise StopAsyncIteration
        self._buffered -= 1
        self._top_up()
        return delivery

    def _receive(self, batch: pb.DeliveryBatch) -> None:
        for raw in batch.deliveries:
            delivery = _delivery(raw)
            self._outstanding -= 1
            if not self.no_ack:
                self._unsettled[delivery.tag] = delivery
            if self._deliver is None:
                self._buffered += 1
                self._inbox.put_nowait(delivery)
            else:
                self._deliver(delivery)
        self._top_up()

    def _ended(self, reason: str) -> None:
        """The owner ended the consumer (``reason``), or the stream broke."""
        self.cancelled = True
        self.cancel_reason = reason
        self._inbox.put_nowait(None)
        if self.on_cancel is not None and not self._closing:
            self.on_cancel(reason)

    # -- the stream --------------------------------------------------------------------------

    def _send(self, request: pb.ConsumeControl | None) -> None:
        if not self._closing or request is None:
            self._outgoing.put_nowait(request)

    async def _write(self) -> None:
        """The stream's requests, in the order they were made; None half-closes it. What
        queued up while the last write ran goes out coalesced (:func:`_coalesce`)."""
        outgoing = self._outgoing
        try:
            while True:
                requests = [await outgoing.get()]
                while not outgoing.empty():
                    requests.append(outgoing.get_nowait())
                for request in _coalesce(requests):
                    if request is None:
                        await self._call.done_writing()
                        return
                    await self._call.write(request)
                    self.requests_sent += 1
        except (aio.AioRpcError, aio.UsageError, RuntimeError) as error:
            # The call ended (the reader reports why); nothing more can be sent.
            log.debug("remote consumer %r of %s: writes stop: %s", self._tag, self.queue, error)

    async def _stop_writer(self) -> None:
        self._writer.cancel()
        with suppress(asyncio.CancelledError):
            await self._writer

    async def _read(self) -> None:
        reason = ""
        try:
            while True:
                batch = await self._call.read()
                if batch is aio.EOF:
                    reason = "the owner ended the stream"
                    break
                self._receive(batch)
                if batch.cancelled:
                    reason = batch.reason
                    break
        except aio.AioRpcError as error:
            gone = error.code() in PEER_GONE or error.code() == grpc.StatusCode.CANCELLED
            what = "unavailable" if gone else "failed"
            reason = f"owner {self.address} {what}: {error.code().name} {error.details() or ''}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # detach() stops the reader
            # grpc raises CancelledError from a read of a call cancelled on this side (its
            # channel closed): the stream broke.
            reason = "the stream was cancelled on this node"
        self._ended(reason)


def _coalesce(
    requests: list[pb.ConsumeControl | None],
) -> list[pb.ConsumeControl | None]:
    """``requests`` as fewer messages with the same effect: settles of single tags with the same
    op and requeue in a row as one settle listing them, and every credit as one, sent last (the
    owner counts credit on top of what is in flight, so credit that comes after the settles it
    was returned for grants nothing more). Stops at None (the half-close), which ends the
    list. One ack is one message otherwise, and a gRPC message costs far more than a tag."""
    messages: list[pb.ConsumeControl | None] = []
    credit = 0
    last: pb.Settle | None = None  # the settle the next one may join
    for request in requests:
        if request is None:
            break
        kind = request.WhichOneof("op")
        if kind == "credit":
            credit += request.credit
            continue
        if kind == "settle":
            settle = request.settle
            if (
                last is not None
                and not settle.multiple
                and last.op == settle.op
                and last.requeue == settle.requeue
            ):
                last.tags.extend(settle.tags)
                continue
            last = None if settle.multiple else settle
        else:
            last = None
        messages.append(request)
    if credit:
        messages.append(pb.ConsumeControl(credit=credit))
    if any(request is None for request in requests):
        messages.append(None)
    return messages


async def remote_get(
    client: RpcClient, address: str, queue: str, *, no_ack: bool, client_id: str = ""
) -> RemoteDelivery | None:
    """AMQP's basic.get on ``queue`` of the node at ``address``: the next ready record, or None
    when none is. Unless ``no_ack``, the owner holds it (for ``client_id``) until
    :func:`settle_gets` settles it by its tag. NOT_FOUND as ``grpc.aio.AioRpcError`` when the
    owner has no such queue."""
    delivery, _ready = await remote_get_counted(
        client, address, queue, no_ack=no_ack, client_id=client_id
    )
    return delivery


async def remote_get_counted(
    client: RpcClient, address: str, queue: str, *, no_ack: bool, client_id: str = ""
) -> tuple[RemoteDelivery | None, int]:
    """:func:`remote_get`, with the ready records the owner has left after it (get-ok's
    message count)."""
    request = pb.ConsumeControl(attach=pb.Attach(queue=queue, no_ack=no_ack, client_id=client_id))
    batch = await client.unary(address, lambda stub: stub.Get(request))
    delivery = _delivery(batch.deliveries[0]) if batch.deliveries else None
    return delivery, batch.message_count


async def settle_gets(
    client: RpcClient,
    address: str,
    tags: Iterable[int],
    *,
    op: pb.Settle.Op.ValueType = pb.Settle.ACK,
    requeue: bool = False,
) -> None:
    """Settle deliveries :func:`remote_get` took from the node at ``address``, by tag
    (FAILED_PRECONDITION as ``grpc.aio.AioRpcError`` for a tag the owner does not hold)."""
    request = pb.ConsumeControl(settle=pb.Settle(op=op, tags=list(tags), requeue=requeue))
    await client.unary(address, lambda stub: stub.Get(request))
