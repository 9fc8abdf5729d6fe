"""Shard: the store-bound half of the broker (docs/cluster.md section 6).

One :class:`~core.log.LogStore` (one directory) and everything its log is the source of truth
for: the ack queues (AMQP queues, MQTT session and shared-group queues) with their state, the
committed offsets and the membership of offset groups (Kafka consumer groups), delay timers,
transactions (half messages, and the Kafka transactions stored in its partitions), retained
MQTT messages and session states, and the shard's own durable entries (redrive intents) in
its ``__meta`` (:attr:`Shard.local_metadata`).

What is cluster-wide (topics, bindings, routing, security, limits, flow control) is its node's
(:class:`~core.broker.node.Node`); a shard asks its node for it through :class:`ShardHost`:
routing a dead letter and declaring the topic it goes to, publishing a transaction's check
request. A node holds one shard per shard it serves (one, number 0, in step 2 of section 15).

Not thread-safe: the event loop's thread, like the log store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from core.broker.ack_queues import AckQueues
from core.broker.broker import BrokerConfig, Destination, PublishResult
from core.broker.topics import TopicInfo, TopicRegistry
from core.cluster.local import LocalMetadata
from core.delivery.ackqueue import AckQueue, DeadLetterHook
from core.delivery.message import Message
from core.groups import GroupCoordinator
from core.log import LogStore
from core.log import record as rec
from core.log.names import ACKS_TOPIC
from core.offsets import OffsetStore
from core.routing.table import BindingTable
from core.state import DurableTable
from core.state.retained import RetainedMessages
from core.state.sessions import SessionStates
from core.timers import TimerService
from core.transactions import TransactionService
from core.transactions.control import HalfMessages
from core.transactions.partitions import PartitionTransactions, partition_transactions

log = logging.getLogger(__name__)

# Ack state of dirty queues is written this often (batched, never per ack).
ACK_STATE_FLUSH_INTERVAL_S = 0.05


class ShardHost(Protocol):
    """What a shard asks of its node (the :class:`~core.broker.node.Node` is one)."""

    @property
    def topics(self) -> TopicRegistry: ...

    @property
    def bindings(self) -> BindingTable[Destination]: ...

    def route(
        self, topic: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> list[Destination]: ...

    def copy_elsewhere(
        self,
        shard: int,
        message: Message,
        destinations: list[Destination],
        headers: list[tuple[str, bytes]],
    ) -> list[Destination]: ...

    async def declare_topic(
        self, name: str, queues: int | None = None, config: dict[str, Any] | None = None
    ) -> tuple[TopicInfo, bool]: ...

    async def publish(
        self,
        topic: str,
        body: bytes | memoryview | None,
        *,
        subject: str = "",
        headers: rec.Headers = (),
        client: str = "",
        address: str = "",
        create_topic: bool | None = None,
        wait_durable: bool = True,
    ) -> PublishResult: ...


class Shard(AckQueues):
    def __init__(
        self,
        number: int,
        store: LogStore,
        config: BrokerConfig,
        host: ShardHost,
        local_metadata: LocalMetadata,
    ) -> None:
        self.number = number
        self.store = store
        self.config = config
        self.host = host
        # The node's topics and bindings, read here (is a dead letter's target declared; which
        # queues dead-letter into which: core/deadletter/redrive.py).
        self.topics = host.topics
        self.bindings = host.bindings
        # Entries that stay in this shard's log in a cluster too (redrive intents: their crash
        # safety needs them beside the redrive's LINKs). On a single node: the node's own
        # metadata, the same __meta table.
        self.local_metadata = local_metadata
        self.offsets = OffsetStore(store)
        # Membership of offset groups (Kafka consumer groups); in memory, members rejoin.
        self.groups = GroupCoordinator(
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
        )
        # Half messages and their commit/rollback (RocketMQ semantics): the base of Kafka
        # transactions and AMQP tx. Front ends register their check-back per producer group.
        self.transactions = TransactionService(
            store,
            check_timeout_ms=config.txn_check_timeout_ms,
            max_checks=config.txn_max_checks,
            check_call_timeout_ms=config.txn_check_call_timeout_ms,
        )
        # The same from every protocol: header x-braid-txn-id, topics braid.txn(.check); its
        # check requests are published through the node.
        self.half_messages = HalfMessages(host, self.transactions)
        # Delayed records (and retries with back-off) become visible at their time.
        self.timers = TimerService(store)
        for group in self.offsets.groups():
            self.groups.ensure_group(group)
        self.ack_queues: dict[Destination, AckQueue] = {}
        self._ack_states = DurableTable(store, ACKS_TOPIC)
        self._watchers: dict[Destination, list[asyncio.Future[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Work started from a callback that could not wait for it (start_eagerly's spawn).
        self._background: set[asyncio.Task[object]] = set()
        # Observer of records leaving a queue unconsumed (tests, metrics); the move itself is
        # the shard's (_dead_letter).
        self.dead_letter_hook: DeadLetterHook | None = None
        self.metrics: dict[str, int] = {"retried": 0, "dead_lettered": 0, "dropped": 0}
        self._retained: RetainedMessages | None = None
        self._session_states: SessionStates | None = None
        self._partition_transactions: PartitionTransactions | None = None

    def listen(self) -> None:
        """Follow the log's index (consumers and long polls woken) and guard its segments
        from retention; the node calls it once it has opened the shard's ack queues."""
        self.store.index_listeners.append(self._on_index)
        self.store.retention_guards.append(self._segment_is_owed)

    # -- startup / shutdown ----------------------------------------------------------------

    async def start(self) -> None:
        await self.timers.start()
        await self.half_messages.declare_topics()
        await self.transactions.start()
        self._tasks = [
            asyncio.create_task(self._periodic(ACK_STATE_FLUSH_INTERVAL_S, self.flush_ack_states))
        ]

    async def _periodic(self, interval: float, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                action()
            except Exception:
                log.exception("shard task %s failed", getattr(action, "__name__", action))

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("shard %d: background work failed", self.number, exc_info=task.exception())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        self._tasks = []
        await self.transactions.aclose()
        await self.timers.stop()
        self.flush_ack_states()
        self.groups.close()
        for waiters in self._watchers.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
        self._watchers.clear()

    # -- tables made at their first use ----------------------------------------------------

    def retained(self) -> RetainedMessages:
        """The retained MQTT messages kept in this shard (replayed at the first call)."""
        table = self._retained
        if table is None:
            table = self._retained = RetainedMessages(self.store)
        return table

    def session_states(self) -> SessionStates:
        """The MQTT session states kept in this shard (replayed at the first call)."""
        table = self._session_states
        if table is None:
            table = self._session_states = SessionStates(self.store)
        return table

    @property
    def partition_transactions(self) -> PartitionTransactions:
        """The Kafka transactions stored in this shard's partitions (replayed at first use)."""
        found = self._partition_transactions
        if found is None:
            found = self._partition_transactions = partition_transactions(self.store)
        return found

    # -- index notifications and long polling ----------------------------------------------

    def _on_index(self, topic: str, queue: int, offset: int) -> None:
        destination = (topic, queue)
        ack_queue = self.ack_queues.get(destination)
        if ack_queue is not None:
            ack_queue.notify()
        waiters = self._watchers.pop(destination, None)
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_for_records(self, keys: Sequence[Destination], timeout_s: float) -> bool:
        """Long poll: True when any of ``keys`` got a new entry before ``timeout_s``."""
        if timeout_s <= 0 or not keys:
            return False
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        for key in keys:
            self._watchers.setdefault(key, []).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiters = self._watchers.get(key)
                if waiters and waiter in waiters:
                    waiters.remove(waiter)

    # -- retention -------------------------------------------------------------------------

    def _segment_is_owed(self, start: int, end: int) -> bool:
        """Retention guard: a segment holding a record an ack queue still owes, or that a
        durable table's replay needs, is kept (the metadata guards its own tables)."""
        for ack_queue in self.ack_queues.values():
            owed = ack_queue.owed_from_position()
            if owed is not None and owed < end:
                return True
        for table in (self.offsets.table, self._ack_states):
            needed = table.oldest_needed_position()
            if needed is not None and needed < end:
                # Rewrite the table's live keys at the log's end so the old segment is free.
                table.compact()
                needed = table.oldest_needed_position()
                if needed is not None and needed < end:
                    return True
        return False
