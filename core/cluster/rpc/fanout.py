"""``Deliver``: MQTT live fan-out between nodes (docs/cluster.md sections 7 and 8).

A publish that matches clean-session subscriptions on other nodes (core/cluster/mqtt_routes.py
names them) goes to each such node once, as a ``Fanout`` (the MQTT topic name, the record's
fields, the publish's QoS); that node dispatches it to its local subscribers, QoS 0/1/2
handled there as for a local publish.

**Sender** (:class:`FanoutSender`, on the publishing node): one ``Deliver`` stream per target
node, opened on first use. :meth:`FanoutSender.send` only adds the message to the target's
open ``FanoutBatch``; the node's writer task wakes once per loop turn and writes what was
batched meanwhile, in order, as one gRPC message (more only past :data:`MAX_BATCH_BYTES`): each
``call.write`` is a trip through gRPC's core and back to the loop, which per publish cost far
more than the publish itself. The first batch of each stream carries the ``Origin`` (who is
sending), the others leave it empty.

**Live means at most once across nodes.** These are clean sessions' subscriptions: nothing is
stored for them, so a message for a node that is gone (no address, the stream cannot be opened
or breaks, or more than :data:`MAX_PENDING` messages wait for it) is dropped and counted
(:attr:`FanoutSender.dropped`), never raised into the publish path; the next send opens a new
stream. What was written into a stream that broke later is lost without a count: gRPC accepted
it.

**Receiver** (:class:`FanoutReceiver`, on each node): the handler of ``NodeService.deliver``
(core/cluster/rpc/server.py). It calls ``dispatch(mqtt_topic, fields, qos)`` for each message
of each batch, in stream order; a dispatch that raises is logged and counted, and the stream goes
on.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import grpc
from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.client import PeerUnavailable, RpcClient

log = logging.getLogger(__name__)

# Messages waiting for one target node; past it, new ones are dropped. A live subscriber that
# cannot keep up loses messages rather than the publisher's memory growing (EMQX drops a
# session's QoS 0 messages past max_mqueue_len, default 1000; this is per node, for all its
# subscribers together).
MAX_PENDING: Final = 10_000
# A batch takes no more messages once its topics and fields reach this size (a message larger
# than it goes alone): the receiver's limit is max_message_size + 1 MiB (rpc/server.py).
MAX_BATCH_BYTES: Final = 1 << 20
# How long aclose() lets the streams deliver what is queued before cancelling them.
CLOSE_GRACE_S: Final = 5.0

# The local dispatch of a received message: (MQTT topic name, record fields, QoS).
Dispatch = Callable[[str, bytes, int], None]
# A node's gRPC address (``host:port``), or None when it has none (not live).
AddressOf = Callable[[int], Awaitable[str | None]]


@dataclass(slots=True)
class _Target:
    """One target node: what waits for it, its writer task and its counts."""

    node: int
    queue: deque[pb.FanoutBatch] = field(default_factory=deque)  # the last one takes more
    queued: int = 0  # messages in ``queue`` and in the batch being written
    last_bytes: int = 0  # topic and fields bytes in the last batch of ``queue``
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    sent: int = 0
    dropped: int = 0
    batches: int = 0  # write bursts: one per loop turn with something queued


class FanoutSender:
    """This node's ``Deliver`` streams to its peers (see the module docstring)."""

    def __init__(
        self,
        client: RpcClient,
        node: int,
        incarnation: int,
        address_of: AddressOf,
        *,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self._client = client
        self._origin = pb.Origin(node=node, incarnation=incarnation)
        self._address_of = address_of
        self._max_pending = max_pending
        self._targets: dict[int, _Target] = {}
        self._closing = False

    def send(self, node: int, mqtt_topic: str, fields: bytes, qos: int) -> None:
        """Queue one message for ``node``; written at the end of this loop turn. Never
        raises for a peer that is gone: it counts the message dropped."""
        if self._closing:
            raise RuntimeError("the fan-out sender is closed")
        target = self._targets.get(node)
        if target is None:
            target = self._targets[node] = _Target(node)
        if target.queued >= self._max_pending:
            target.dropped += 1
            return
        size = len(mqtt_topic) + len(fields)
        queue = target.queue
        if not queue or (target.last_bytes and target.last_bytes + size > MAX_BATCH_BYTES):
            queue.append(pb.FanoutBatch())
            target.last_bytes = 0
        queue[-1].messages.add(mqtt_topic=mqtt_topic, fields=fields, qos=qos)
        target.last_bytes += size
        target.queued += 1
        if target.task is None or target.task.done():
            target.task = asyncio.get_running_loop().create_task(
                self._write(target), name=f"braid-fanout-{node}"
            )
        target.wake.set()

    def sent(self, node: int) -> int:
        """Messages written into ``node``'s streams."""
        target = self._targets.get(node)
        return 0 if target is None else target.sent

    def dropped(self, node: int) -> int:
        """Messages for ``node`` dropped: it was gone or too far behind."""
        target = self._targets.get(node)
        return 0 if target is None else target.dropped

    def batches(self, node: int) -> int:
        """Write bursts to ``node`` (at most one per loop turn)."""
        target = self._targets.get(node)
        return 0 if target is None else target.batches

    async def _write(self, target: _Target) -> None:
        """Open a stream to the target and write what is queued, burst by burst, until the
        queue stays empty at close; a failure drops what is queued and ends the task (the
        next send starts another)."""
        call: aio.StreamStreamCall | None = None
        address = ""
        try:
            while True:
                if not target.queue:
                    if self._closing:
                        break
                    target.wake.clear()
                    await target.wake.wait()
                    continue
                if call is None:
                    resolved = await self._address_of(target.node)
                    if resolved is None:
                        self._drop(target, "it has no address (not live)")
                        return
                    address = resolved
                    call = self._client.stub(address).Deliver()
                    # Connected first: writes into a call that never connects are accepted
                    # into a buffer, and would count as sent.
                    await call.wait_for_connection()
                    target.queue[0].origin.CopyFrom(self._origin)
                target.batches += 1
                while target.queue:  # this turn's batches, and what arrives while one is written
                    # Out of the queue first: what send() adds meanwhile goes to a new batch.
                    batch = target.queue.popleft()
                    if not target.queue:
                        target.last_bytes = 0
                    await call.write(batch)
                    count = len(batch.messages)
                    target.queued -= count
                    target.sent += count
            if call is not None:
                await call.done_writing()
                await call.code()
        except (aio.AioRpcError, asyncio.InvalidStateError, PeerUnavailable, OSError) as error:
            self._drop(target, f"its stream at {address} failed: {_describe(error)}")
        finally:
            if call is not None and not call.done():
                call.cancel()

    def _drop(self, target: _Target, why: str) -> None:
        lost = target.queued  # the batch being written too: gRPC did not take it
        target.queue.clear()
        target.queued = target.last_bytes = 0
        target.dropped += lost
        log.info("fan-out to node %d: %d message(s) dropped, %s", target.node, lost, why)

    async def aclose(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Write what is queued (within ``grace_s``), end the streams, stop the tasks."""
        self._closing = True
        tasks = [t.task for t in self._targets.values() if t.task is not None]
        for target in self._targets.values():
            target.wake.set()
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _describe(error: BaseException) -> str:
    if isinstance(error, aio.AioRpcError):
        code: grpc.StatusCode = error.code()
        return f"{code.name} {error.details() or ''}".strip()
    return str(error) or type(error).__name__


class FanoutReceiver:
    """The ``Deliver`` handler: ``service.deliver = FanoutReceiver(dispatch).deliver``."""

    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch
        self.received = 0
        self.batches = 0  # gRPC messages read: one per sender's burst
        self.failed = 0  # dispatches that raised

    async def deliver(
        self, requests: AsyncIterator[pb.FanoutBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.Empty]:
        origin: pb.Origin | None = None
        dispatch = self._dispatch
        async for batch in requests:
            self.batches += 1
            if origin is None and batch.HasField("origin"):
                origin = batch.origin
            for fanout in batch.messages:
                self.received += 1
                try:
                    dispatch(fanout.mqtt_topic, fanout.fields, fanout.qos)
                except Exception:
                    # The subscriber's side failed, not the stream: the next message goes on.
                    self.failed += 1
                    log.exception(
                        "fan-out from node %s: dispatching %r failed",
                        "?" if origin is None else origin.node,
                        fanout.mqtt_topic,
                    )
        # Nothing to answer: the stream's end (OK) says every message was dispatched.
        nothing: tuple[pb.Empty, ...] = ()
        for reply in nothing:
            yield reply
