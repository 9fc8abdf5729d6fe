"""Queues consumed from another node, both sides (docs/cluster.md section 8, AMQP).

- The owner's side: a :class:`ConsumeService` over the node's ack queues answers ``Consume`` and
  ``Get``, and :class:`QueueAdminCalls` four ``Admin`` calls: :data:`ADMIN_QUEUE_STATS` (a
  queue's counts), :data:`ADMIN_QUEUE_DECLARE` (make sure the queue exists, then its counts),
  :data:`ADMIN_QUEUE_PURGE` (queue.purge through a node that does not own the queue) and
  :data:`ADMIN_QUEUE_DELETE` (queue.delete, if-empty and if-unused checked where it is deleted).
  :func:`serve_remote_queues` plugs both into a :class:`NodeService` at once.
- The owner lets go of the gets of a node that died or restarted:
  :func:`release_gets_of_gone_nodes`, told each refresh of the node's view (a consumer's
  deliveries go back when its stream breaks; a get has no stream).
- The consumer's side, :class:`RemoteQueuesOverRpc`: ``core.broker.remote.RemoteQueues`` over an
  :class:`RpcClient` and the ownership table (:class:`ShardOwners`), which ``BrokerAPI`` is given
  with ``set_remote_queues`` and puts behind its ``QueueHandle`` and ``Subscription``.

A gateway's calls are synchronous (it makes them from its read) while an attach or a settle of
a get is a call to the owner: those run in tasks this object keeps (:meth:`close` ends them),
and what they fail with is logged, or told to the consumer through its ``on_cancel``.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import suppress
from typing import Any, Final

from grpc import aio

from core.broker.ack_queues import ack_queue_config_from_json, ack_queue_config_to_json
from core.broker.node import Node
from core.broker.remote import (
    EXCLUSIVE_TO_KEY,
    OwnerAddress,
    QueueDeleted,
    RemoteQueueDelivery,
    ShardOwners,
)
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.cluster.rpc.consume import ConsumeService
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.remote_queue import RemoteConsumer, remote_get_counted, settle_gets
from core.cluster.rpc.server import NodeService
from core.delivery.ackqueue import AckQueueConfig
from core.delivery.handles import QueueStats
from core.errors import ShardUnavailable

log = logging.getLogger(__name__)

# {"topic": t} -> {"found": bool, "ready": n, "unacked": n, "consumers": n}
ADMIN_QUEUE_STATS: Final = "queue_stats"
# {"topic": t, "config": {...}, "settings": ack queue settings JSON} -> as ADMIN_QUEUE_STATS
ADMIN_QUEUE_DECLARE: Final = "queue_declare"
# {"topic": t} -> {"found": bool, "purged": n}
ADMIN_QUEUE_PURGE: Final = "queue_purge"
# {"topic": t, "if_empty": b, "if_unused": b} -> {"found": bool, "refused": "in use" | "not
# empty"} or {"found": true, "ready": n, "sources": [exchange topics]}: checked and deleted at once
ADMIN_QUEUE_DELETE: Final = "queue_delete"


# -- the owner's side ---------------------------------------------------------------------------


def _stats_json(node: Node, topic: str) -> JsonObject:
    queue = node.ack_queue(topic)
    if queue is None:
        return {"found": False}
    return {
        "found": True,
        "ready": queue.message_count(),
        "unacked": queue.unacked_count(),
        "consumers": len(queue.consumers),
    }


def _tell_deleted(node: Node, topic: str) -> None:
    """The owner deleted the queue ``topic`` for another node: its gateway is told as of a
    deletion the follower brings (the follower skips the changes made here)."""
    for listener in list(node.queue_listeners):
        listener(topic, False)


class QueueAdminCalls:
    """The ``Admin`` calls :data:`ADMIN_QUEUE_STATS`, :data:`ADMIN_QUEUE_DECLARE`,
    :data:`ADMIN_QUEUE_PURGE` and :data:`ADMIN_QUEUE_DELETE` over the
    broker this node serves now: :meth:`register` once on the node's :class:`NodeService` (a
    service takes each name once), :meth:`attach` each broker (a fenced node serves again on a
    new one). Without a broker a queue is not found, and a declare fails."""

    def __init__(self) -> None:
        self._node: Node | None = None

    def attach(self, node: Node | None) -> None:
        self._node = node

    def register(self, service: NodeService) -> None:
        service.register(ADMIN_QUEUE_STATS, self._stats)
        service.register(ADMIN_QUEUE_DECLARE, self._declare)
        service.register(ADMIN_QUEUE_PURGE, self._purge)
        service.register(ADMIN_QUEUE_DELETE, self._delete)

    async def _stats(self, args: JsonObject) -> JsonObject:
        node = self._node
        return {"found": False} if node is None else _stats_json(node, str(args["topic"]))

    async def _purge(self, args: JsonObject) -> JsonObject:
        node = self._node
        queue = None if node is None else node.ack_queue(str(args["topic"]))
        if queue is None:
            return {"found": False}
        return {"found": True, "purged": queue.purge()}

    async def _delete(self, args: JsonObject) -> JsonObject:
        node = self._node
        topic = str(args["topic"])
        queue = None if node is None else node.ack_queue(topic)
        if node is None or queue is None:
            return {"found": False}
        ready = queue.message_count()
        # Its consumers include other nodes' (Consume streams), as RabbitMQ's home node counts.
        if args.get("if_unused") and queue.consumers:
            return {"found": True, "refused": "in use"}
        if args.get("if_empty") and ready:
            return {"found": True, "refused": "not empty"}
        sources = sorted({b.source for b in node.bindings.bindings(destination=(topic, 0))})
        # The ack queue is taken out before delete_topic's first wait: no publish, consumer or
        # get comes between the checks and the delete.
        await node.delete_topic(topic)
        _tell_deleted(node, topic)
        return {"found": True, "ready": ready, "sources": sources}

    async def _declare(self, args: JsonObject) -> JsonObject:
        node = self._node
        if node is None:
            raise RuntimeError("this node serves no broker now")
        topic = str(args["topic"])
        if topic not in node.topics:  # (defined on the asking node; not followed here yet)
            config = args.get("config")
            await node.declare_topic(topic, 1, dict(config) if isinstance(config, dict) else {})
        if node.ack_queue(topic) is None:
            settings = args.get("settings")
            await node.declare_ack_queue(
                topic, 0, ack_queue_config_from_json(settings if isinstance(settings, dict) else {})
            )
        return _stats_json(node, topic)


def serve_remote_queues(service: NodeService, node: Node) -> ConsumeService:
    """Answer other nodes' consumers of ``node``'s queues on ``service``, for a node that
    serves one broker for its life: ``Consume`` and ``Get`` by a :class:`ConsumeService`
    (returned, for its ``cancel`` and ``release_gets``), and :class:`QueueAdminCalls`."""
    consume = ConsumeService(node)
    service.consume = consume.consume
    service.get = consume.get
    calls = QueueAdminCalls()
    calls.register(service)
    calls.attach(node)
    return consume


def getter_holder(node_id: str, incarnation: int) -> str:
    """What a node's basic.gets are held under on an owner (before the connection's id): its
    id and the incarnation of its lease, so the owner can tell when that process is gone
    (:func:`release_gets_of_gone_nodes`)."""
    return f"{node_id}:{incarnation}/"


def release_gets_of_gone_nodes(consume: ConsumeService, live: Mapping[str, int]) -> int:
    """Put back (redelivered) the gets ``consume`` holds for nodes that no longer hold a lease,
    or hold it as another incarnation (restarted), as a consumer's unsettled deliveries go
    back when its stream breaks. ``live``: node id -> the incarnation holding its lease (a
    refresh of the node's view). Holders not named by :func:`getter_holder` stay. How many."""

    released = consume.release_gets_where(lambda holder: holder_gone(holder, live))
    if released:
        log.info("remote queues: %d gets of nodes gone back to their queues", released)
    return released


def holder_gone(holder: str, live: Mapping[str, int]) -> bool:
    """Whether the process a :func:`getter_holder` ``holder`` names is gone: its node holds no
    lease, or holds it as another incarnation (``live``: node id -> incarnation). False for a
    holder not named that way."""
    node, colon, rest = holder.partition(":")
    incarnation, slash, _connection = rest.partition("/")
    if not (colon and slash and incarnation.isdigit()):
        return False
    return live.get(node) != int(incarnation)


class GoneNodes:
    """Told each refresh of an owner's view (``MembershipView.on_refresh``): it lets go of what
    it keeps for nodes whose process is gone. Their held gets go back to their queues
    (:func:`release_gets_of_gone_nodes`), and the exclusive queues declared through them in
    this node's shards (:data:`EXCLUSIVE_TO_KEY`) are deleted: at the first refresh and when a
    node or incarnation left the live ones (reading every topic each heartbeat would cost an
    idle node)."""

    def __init__(self, consume: ConsumeService, node: Node) -> None:
        self._consume = consume
        self._node = node
        self._last: dict[str, int] | None = None
        self._deleting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, live: Mapping[str, int]) -> None:
        release_gets_of_gone_nodes(self._consume, live)
        last, self._last = self._last, dict(live)
        if last is None or any(live.get(node) != incarnation for node, incarnation in last.items()):
            self._drop_exclusive_queues(live)

    def _drop_exclusive_queues(self, live: Mapping[str, int]) -> None:
        node = self._node
        shards = node.shards
        for info in node.topics.all():
            holder = info.config.get(EXCLUSIVE_TO_KEY)
            if (
                not isinstance(holder, str)
                or info.name in self._deleting
                or not holder_gone(holder, live)
                or shards.local(shards.queue_number(info.name, 0)) is None
            ):
                continue
            self._deleting.add(info.name)
            task = asyncio.get_running_loop().create_task(self._delete(info.name, holder))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _delete(self, topic: str, holder: str) -> None:
        try:
            log.info(
                "exclusive queue %s deleted: %s, whose connection it was, is gone", topic, holder
            )
            await self._node.delete_topic(topic)
            _tell_deleted(self._node, topic)
        except Exception as error:  # (tried again at the next change of the live nodes)
            log.warning("exclusive queue %s of %s not deleted: %r", topic, holder, error)
        finally:
            self._deleting.discard(topic)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


def _stats(answer: JsonObject) -> QueueStats | None:
    if not answer.get("found"):
        return None
    return QueueStats(int(answer["ready"]), int(answer["unacked"]), int(answer["consumers"]))


# -- the consumer's side ------------------------------------------------------------------------


class _AttachingConsumer:
    """``RemoteQueueConsumer``: a :class:`RemoteConsumer` attached in the background. Until
    the owner confirmed the attach, a limit or a pause is remembered and applied then."""

    def __init__(
        self,
        remote: RemoteQueuesOverRpc,
        deliver: Callable[[RemoteQueueDelivery], None],
        on_cancel: Callable[[str], None],
        prefetch: int,
    ) -> None:
        self._remote = remote
        self._deliver = deliver
        self._on_cancel = on_cancel
        self._prefetch = prefetch
        self._paused = False
        self._consumer: RemoteConsumer | None = None
        self._detached = False
        self._ended = False

    async def attach(
        self, shard: int, topic: str, tag: str, *, no_ack: bool, client_id: str
    ) -> None:
        remote = self._remote
        try:
            owner = await remote.owner(shard)
            try:
                consumer = await RemoteConsumer.attach(
                    remote.client,
                    owner.rpc_address,
                    topic,
                    tag,
                    self._prefetch,
                    no_ack=no_ack,
                    client_id=client_id,
                    deliver=self._deliver,
                    on_cancel=self._end,
                )
            except PeerUnavailable as error:
                raise ShardUnavailable(shard, owner.node, str(error)) from error
        except (ShardUnavailable, aio.AioRpcError, RuntimeError) as error:
            reason = error.details() if isinstance(error, aio.AioRpcError) else str(error)
            log.info("remote consumer %r of %s: attach failed: %s", tag, topic, reason)
            self._end(reason or "the attach failed")
            return
        if self._detached:
            await consumer.detach()
            return
        self._consumer = consumer
        if consumer.prefetch != self._prefetch:
            consumer.set_prefetch(self._prefetch)
        if self._paused:
            consumer.pause()

    def _end(self, reason: str) -> None:
        """The owner ended the consumer, or it could not be attached: told once."""
        if self._ended or self._detached:
            return
        self._ended = True
        consumer = self._consumer
        if consumer is not None:  # its stream is over: stop its writer
            self._remote.run_soon(consumer.detach())
        self._on_cancel(reason)

    @property
    def inflight(self) -> int:
        consumer = self._consumer
        return 0 if consumer is None or self._ended else consumer.inflight

    def set_prefetch(self, limit: int) -> None:
        self._prefetch = limit
        if self._consumer is not None and not self._ended:
            self._consumer.set_prefetch(limit)

    def pause(self) -> None:
        self._paused = True
        if self._consumer is not None and not self._ended:
            self._consumer.pause()

    def resume(self) -> None:
        self._paused = False
        if self._consumer is not None and not self._ended:
            self._consumer.resume()

    def ack(self, tag: int) -> None:
        consumer = self._consumer
        if consumer is not None and not self._ended:
            # (Unknown here: detached or ended meanwhile, so the owner has taken it back.)
            with suppress(ValueError):
                consumer.ack(tag)

    def nack(self, tag: int, *, requeue: bool) -> None:
        consumer = self._consumer
        if consumer is not None and not self._ended:
            with suppress(ValueError):
                consumer.nack(tag, requeue=requeue)

    def detach(self) -> int:
        if self._detached:
            return 0
        unsettled = self.inflight
        self._detached = True
        consumer = self._consumer
        if consumer is not None and not self._ended:
            self._remote.run_soon(consumer.detach())
        return unsettled


class RemoteQueuesOverRpc:
    """``core.broker.remote.RemoteQueues`` over ``client`` and ``owners`` (module docstring)."""

    def __init__(self, client: RpcClient, owners: ShardOwners, *, holder: str = "") -> None:
        """``holder``: what this node's gets are held under on their owners, before the
        connection's id (:func:`getter_holder`)."""
        self.client = client
        self._owners = owners
        self._holder = holder
        self._tasks: set[asyncio.Task[object]] = set()
        self._settling = asyncio.Lock()  # settles of gets go out in the order they were made

    @property
    def holder(self) -> str:
        return self._holder

    def run_soon(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` in a task kept until it is done (:meth:`close` cancels the rest)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("remote queues: background call failed: %r", task.exception())

    async def owner(self, shard: int) -> OwnerAddress:
        """The owner of ``shard`` (read again when none is cached); ShardUnavailable without."""
        owner = self._owners.owner_of(shard) or await self._owners.refresh(shard)
        if owner is None:
            raise ShardUnavailable(shard, reason="no live owner")
        return owner

    async def _admin(self, shard: int, name: str, args: JsonObject) -> JsonObject:
        owner = await self.owner(shard)
        try:
            return await self.client.admin(owner.rpc_address, name, args)
        except PeerUnavailable as error:
            await self._owners.refresh(shard)
            raise ShardUnavailable(shard, owner.node, str(error)) from error

    # -- RemoteQueues ------------------------------------------------------------------------

    def consumer(
        self,
        shard: int,
        topic: str,
        tag: str,
        prefetch: int,
        deliver: Callable[[RemoteQueueDelivery], None],
        *,
        no_ack: bool,
        client_id: str,
        on_cancel: Callable[[str], None],
    ) -> _AttachingConsumer:
        consumer = _AttachingConsumer(self, deliver, on_cancel, prefetch)
        self.run_soon(consumer.attach(shard, topic, tag, no_ack=no_ack, client_id=client_id))
        return consumer

    async def get(
        self, shard: int, topic: str, *, no_ack: bool, client_id: str
    ) -> tuple[RemoteQueueDelivery | None, int]:
        owner = await self.owner(shard)
        try:
            return await remote_get_counted(
                self.client,
                owner.rpc_address,
                topic,
                no_ack=no_ack,
                client_id=self._holder + client_id,
            )
        except PeerUnavailable as error:
            await self._owners.refresh(shard)
            raise ShardUnavailable(shard, owner.node, str(error)) from error

    def settle_gets(self, shard: int, tags: Sequence[int], *, ack: bool, requeue: bool) -> None:
        op = pb.Settle.ACK if ack else pb.Settle.NACK
        chosen = list(tags)

        async def settle() -> None:
            async with self._settling:
                owner = await self.owner(shard)
                await settle_gets(self.client, owner.rpc_address, chosen, op=op, requeue=requeue)

        self.run_soon(settle())

    async def stats(self, shard: int, topic: str) -> QueueStats | None:
        return _stats(await self._admin(shard, ADMIN_QUEUE_STATS, {"topic": topic}))

    async def delete(
        self, shard: int, topic: str, *, if_empty: bool, if_unused: bool
    ) -> QueueDeleted | None:
        args: JsonObject = {"topic": topic, "if_empty": if_empty, "if_unused": if_unused}
        answer = await self._admin(shard, ADMIN_QUEUE_DELETE, args)
        if not answer.get("found"):
            return None
        refused = answer.get("refused")
        if refused is not None:
            return QueueDeleted(str(refused), 0, frozenset())
        sources = answer.get("sources")
        named = frozenset(str(source) for source in sources) if isinstance(sources, list) else None
        return QueueDeleted(None, int(answer["ready"]), named or frozenset())

    async def purge(self, shard: int, topic: str) -> int | None:
        answer = await self._admin(shard, ADMIN_QUEUE_PURGE, {"topic": topic})
        return int(answer["purged"]) if answer.get("found") else None

    async def declare(
        self, shard: int, topic: str, config: dict[str, object], settings: AckQueueConfig
    ) -> QueueStats:
        args: JsonObject = {
            "topic": topic,
            "config": config,
            "settings": ack_queue_config_to_json(settings),
        }
        stats = _stats(await self._admin(shard, ADMIN_QUEUE_DECLARE, args))
        if stats is None:
            raise ShardUnavailable(shard, reason=f"its owner did not declare {topic!r}")
        return stats

    async def close(self) -> None:
        """End the background calls still running (consumers' detaches, settles)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with suppress(asyncio.CancelledError):
                await task
