"""Kafka transactions (KIP-98) with Kafka's semantics for Kafka consumers.

How a transaction is stored (``core/transactions/partitions.py`` through the Broker API):

- Each transactional batch is stored in its partition when produced
  (``produce_batch(transaction=...)``), at the offset and with the timestamps the producer is
  told. The partition's last stable offset (LSO) stays at the first offset of the earliest open
  transaction: a read_committed consumer reads nothing at or past it (``fetch.py``), a
  read_uncommitted one reads up to the high watermark.
- EndTxn(commit): the state ``PrepareCommit`` goes to the broker's metadata table first (in the
  log before any marker), then a COMMIT control batch to every partition of the transaction
  (``write_transaction_marker``: the LSO moves past the transaction), then the offsets staged
  by TxnOffsetCommit are committed and the state becomes ``CompleteCommit``.
- EndTxn(abort), a transaction timeout: an ABORT control batch to every partition; the
  partition lists the transaction among its aborted ones, and a read_committed Fetch returns
  that list, by which the client drops its records (as with Kafka).

Other protocols never see a Kafka transaction's records in the partition (the live feed holds
them until the COMMIT marker and drops aborted ones; Spark and ``braid tail`` show committed
ones); they are not routed to bindings.

State per transactional id (Kafka's ``TransactionMetadata``): producer id, epoch, timeout, and
``PrepareCommit``/``CompleteCommit`` around a commit's markers, durable in the broker's
metadata table (``kafka:txn:<id>``). Transactions still open in some partition when the broker
starts were cut by a restart: where the table says ``PrepareCommit`` the commit is completed
(its markers written), else they are aborted and their producers fenced (epoch + 1), so that no
producer can commit half a transaction. A transaction older than its ``transaction.timeout.ms``
is aborted and its producer fenced, as Kafka does. (Transactions of the half-message format
this module used before, still open in the core's transaction service, are rolled back at
start the same way.)

Differences from Kafka: the consumer offsets of a transaction are committed right after its
markers, not with them (a crash in between leaves the data committed and the offsets not: the
input is consumed again); a transaction cut by a restart is aborted, not resumed.

On a cluster (docs/cluster.md sections 8, 10) the coordinator is the node the transactional id
is placed on; partitions other nodes lead get their markers through ``WriteTxnMarkers``. Their
list is in the record (``remote``, written durably by AddPartitionsToTxn and kept through
PrepareCommit), so a restarted coordinator still ends the transaction there; a restarted leader
settles only the transactions its own coordinator knows and leaves the others' open for them.

Transitions (``TxnState``; anything else is INVALID_TXN_STATE, as TransactionCoordinator):
EMPTY/COMPLETE_* --AddPartitions/AddOffsets/Produce--> ONGOING --EndTxn--> PREPARE_* --(durable)-->
COMPLETE_*. A request during PREPARE_* gets CONCURRENT_TRANSACTIONS (the client retries).

Not thread-safe: event-loop thread only.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from kio.schema.errors import ErrorCode

from core.api import (
    PROTOCOL_KAFKA,
    ClientContext,
    Clock,
    LoopClock,
    Timer,
    TopicError,
    now_ms,
)
from gateway.kafka.producers import KeyValueTable, ProducerIdAllocator
from gateway.kafka.records import ControlType, build_control_batch

if TYPE_CHECKING:
    from core.api import BrokerAPI

log = logging.getLogger(__name__)

_TXN_KEY: Final = "kafka:txn:"
# Producer group of a Kafka transactional id in the TransactionService.
GROUP_PREFIX: Final = "kafka:"
# Kafka's transaction.max.timeout.ms default (15 minutes): longer timeouts are refused.
MAX_TRANSACTION_TIMEOUT_MS: Final = 15 * 60 * 1000
# Epochs are int16; Kafka moves to a new producer id before the epoch overflows.
MAX_EPOCH: Final = 2**15 - 2
# Who the coordinator's own calls are made as (markers, commits, rollbacks, timeouts).
COORDINATOR_CONTEXT: Final = ClientContext(PROTOCOL_KAFKA, connection_id="kafka-transactions")
# What a batch of another node's transactional producer is stored under on its leader.
REMOTE_PREFIX: Final = "kafka-remote:"


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


# (topic, partition, offset, leader_epoch, metadata), as OffsetStore.commit takes them
StagedOffset = tuple[str, int, int, int, str]


@dataclass(eq=False)
class Transaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[tuple[str, int]] = field(default_factory=set)
    offsets: dict[str, dict[tuple[str, int], StagedOffset]] = field(default_factory=dict)
    service_id: str | None = None  # the open service transaction holding the halves
    # The partitions other nodes lead, durable in the record before the producer was told it
    # may write there: what a restart of this coordinator must end (docs/cluster.md section 8).
    remote: set[tuple[str, int]] = field(default_factory=set)
    started_ms: int = -1  # when it went ONGOING (DescribeTransactions); -1 when not ongoing
    timer: Timer | None = None

    def to_json(self, state: TxnState | None = None) -> bytes:
        """The durable record; ``state`` only around a commit's markers (PrepareCommit, then
        CompleteCommit) and while partitions of other nodes are in the transaction (Ongoing,
        PrepareCommit, with ``remote``): what a restart needs to end a transaction it cut."""
        fields: dict[str, object] = {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "timeout_ms": self.timeout_ms,
        }
        if state is not None:
            fields["state"] = state.value
            if state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT) and self.remote:
                fields["remote"] = sorted(self.remote)
        return json.dumps(fields).encode()


@dataclass(frozen=True, slots=True)
class _CutRemote:
    """A transaction a restart cut whose record names partitions of other nodes: their
    markers (COMMIT after PrepareCommit, else ABORT) are still owed."""

    commit: bool
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, int], ...]


class TransactionCoordinator:
    """Every transactional id of the broker (see the module docstring)."""

    def __init__(
        self,
        api: BrokerAPI,
        table: KeyValueTable,
        producer_ids: ProducerIdAllocator,
        *,
        metrics: dict[str, int] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.api = api
        # The transaction timeouts' timers (core/clock.py): a test moves a ManualClock instead
        # of sleeping for a timeout.
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.table = table
        self.producer_ids = producer_ids
        self._by_id: dict[str, Transaction] = {}
        self._by_producer: dict[int, Transaction] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Transactional ids whose table record says PrepareCommit (a commit a restart cut).
        self._committing: set[str] = set()
        # Transactional ids whose record names other nodes' partitions (Ongoing/PrepareCommit).
        self._cut_remote: dict[str, _CutRemote] = {}
        self.metrics = metrics if metrics is not None else {}
        for key in ("committed", "aborted", "expired"):
            self.metrics.setdefault(key, 0)
        for key, value in table.items():
            if key.startswith(_TXN_KEY):
                raw = json.loads(value)
                txn = Transaction(
                    key[len(_TXN_KEY) :],
                    int(raw["producer_id"]),
                    int(raw["producer_epoch"]),
                    int(raw["timeout_ms"]),
                )
                self._by_id[txn.transactional_id] = txn
                self._by_producer[txn.producer_id] = txn
                committing = raw.get("state") == TxnState.PREPARE_COMMIT.value
                if committing:
                    self._committing.add(txn.transactional_id)
                remote = tuple((str(topic), int(n)) for topic, n in raw.get("remote", ()))
                if remote:
                    self._cut_remote[txn.transactional_id] = _CutRemote(
                        committing, txn.producer_id, txn.producer_epoch, remote
                    )

    def transactions(self) -> list[Transaction]:
        """Every transactional id's state, by id (DescribeTransactions, ListTransactions)."""
        return [self._by_id[key] for key in sorted(self._by_id)]

    async def recover(self) -> None:
        """Complete the commits a restart cut (PrepareCommit in the table: COMMIT markers where
        the transaction is still open) and abort the other transactions it cut, fencing their
        producers: the part of such a transaction sent before the restart cannot be committed
        together with the part sent after it.

        On a cluster node only the transactions this node coordinates are settled: one open in
        a partition here whose producer is another node's is left to that coordinator (its
        WriteTxnMarkers, or its timeout). The markers owed to other nodes' partitions (named in
        the record) are written in the background, retried until each leader answers; the
        transactional id answers CONCURRENT_TRANSACTIONS meanwhile."""
        end = 0
        for pending in self.api.open_transactions():
            # The half-message format of earlier versions.
            if not pending.producer_group.startswith(GROUP_PREFIX):
                continue
            transactional_id = pending.producer_group[len(GROUP_PREFIX) :]
            await self.api.roll_back_transaction(COORDINATOR_CONTEXT, pending.transaction_id)
            txn = self._by_id.get(transactional_id)
            if txn is not None:
                await self._bump_epoch(txn)
                end = max(end, await self.table.put(_TXN_KEY + transactional_id, txn.to_json()))
            log.warning(
                "kafka: transaction of %r was open at shutdown (%d batches): aborted, "
                "producer fenced",
                transactional_id,
                pending.halves,
            )
        fenced: dict[str, Transaction] = {}
        stamp = now_ms()
        clustered = self.api.leader_table(COORDINATOR_CONTEXT) is not None
        for opened in self.api.open_partition_transactions(COORDINATOR_CONTEXT):
            txn = self._by_producer.get(opened.producer_id)
            if txn is None and clustered:
                # Another node's producer (producer ids are unique in the cluster): its
                # coordinator ends the transaction here.
                log.info(
                    "kafka: transaction of producer %d (in %s/%d) open at start: left to its "
                    "coordinator",
                    opened.producer_id,
                    opened.topic,
                    opened.partition,
                )
                continue
            commit = (
                txn is not None
                and txn.transactional_id in self._committing
                and txn.producer_epoch == opened.producer_epoch
            )
            marker = build_control_batch(
                ControlType.COMMIT if commit else ControlType.ABORT,
                producer_id=opened.producer_id,
                producer_epoch=opened.producer_epoch,
                timestamp_ms=stamp,
            )
            publication = self.api.write_transaction_marker(
                COORDINATOR_CONTEXT, opened.topic, opened.partition, marker, born_ms=stamp
            )
            outcome = publication.outcome if publication.stored else await publication
            end = max(end, outcome.durable_mark)
            if txn is not None and not commit:
                fenced[txn.transactional_id] = txn
            log.warning(
                "kafka: transaction of producer %d (in %s/%d) was open at shutdown: %s",
                opened.producer_id,
                opened.topic,
                opened.partition,
                "commit completed" if commit else "aborted, producer fenced",
            )
        cut_remote, self._cut_remote = self._cut_remote, {}
        for txn in fenced.values():
            if txn.transactional_id in cut_remote:
                continue  # fenced once its other nodes' markers are written (_end_cut)
            await self._bump_epoch(txn)
            end = max(end, await self.table.put(_TXN_KEY + txn.transactional_id, txn.to_json()))
        for transactional_id in self._committing:
            txn = self._by_id.get(transactional_id)
            if txn is not None and transactional_id not in fenced | cut_remote:
                state = TxnState.COMPLETE_COMMIT
                end = max(
                    end, await self.table.put(_TXN_KEY + transactional_id, txn.to_json(state))
                )
        self._committing.clear()
        if end:
            await self.api.when_durable(end)
        for transactional_id, cut in cut_remote.items():
            txn = self._by_id.get(transactional_id)
            if txn is None or txn.producer_id != cut.producer_id:
                continue
            txn.state = TxnState.PREPARE_COMMIT if cut.commit else TxnState.PREPARE_ABORT
            txn.remote = set(cut.partitions)
            log.warning(
                "kafka: transaction of %r was open at shutdown in %d partitions of other nodes: "
                "%s there",
                transactional_id,
                len(cut.partitions),
                "completing its commit" if cut.commit else "aborting it, producer fenced",
            )
            task = asyncio.get_running_loop().create_task(self._end_cut(txn, cut))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _end_cut(self, txn: Transaction, cut: _CutRemote) -> None:
        """Write the markers a restart left owed in other nodes' partitions, then record the
        outcome (an abort fences the producer, as for the partitions here)."""
        await self.api.write_remote_transaction_markers(
            COORDINATOR_CONTEXT,
            txn.transactional_id,
            cut.producer_id,
            cut.producer_epoch,
            cut.commit,
            cut.partitions,
        )
        if cut.commit:
            record = txn.to_json(TxnState.COMPLETE_COMMIT)
        else:
            await self._bump_epoch(txn)
            record = txn.to_json()
        await self.api.when_durable(await self.table.put(_TXN_KEY + txn.transactional_id, record))
        self._reset(txn, TxnState.COMPLETE_COMMIT if cut.commit else TxnState.COMPLETE_ABORT)

    def close(self) -> None:
        for txn in self._by_id.values():
            if txn.timer is not None:
                txn.timer.cancel()
                txn.timer = None
        for task in self._tasks:
            task.cancel()

    async def _bump_epoch(self, txn: Transaction) -> None:
        self._by_producer.pop(txn.producer_id, None)
        if txn.producer_epoch >= MAX_EPOCH:
            txn.producer_id, _ = await self.producer_ids.next_id()
            txn.producer_epoch = 0
        else:
            txn.producer_epoch += 1
        self._by_producer[txn.producer_id] = txn

    def _reset(self, txn: Transaction, state: TxnState) -> None:
        if txn.timer is not None:
            txn.timer.cancel()
            txn.timer = None
        txn.state = state
        txn.partitions = set()
        txn.offsets = {}
        txn.remote = set()
        txn.service_id = None
        txn.started_ms = -1

    # -- InitProducerId --------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int
    ) -> tuple[ErrorCode, int, int]:
        """``(error, producer_id, epoch)`` for a transactional producer (a new one, or the
        next epoch of a known id, after aborting its open transaction: Kafka's fencing)."""
        if not 0 < timeout_ms <= MAX_TRANSACTION_TIMEOUT_MS:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        txn = self._by_id.get(transactional_id)
        if txn is None:
            producer_id, _ = await self.producer_ids.next_id()
            txn = Transaction(transactional_id, producer_id, 0, timeout_ms)
            self._by_id[transactional_id] = txn
            self._by_producer[producer_id] = txn
        else:
            if txn.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                return ErrorCode.concurrent_transactions, -1, -1
            if txn.state is TxnState.ONGOING:
                await self._abort(txn, "a new producer instance initialised its id")
            await self._bump_epoch(txn)
            txn.timeout_ms = timeout_ms
            self._reset(txn, TxnState.EMPTY)
        await self.api.when_durable(
            await self.table.put(_TXN_KEY + transactional_id, txn.to_json())
        )
        return ErrorCode.none, txn.producer_id, txn.producer_epoch

    # -- checks ----------------------------------------------------------------------------

    def _current(
        self, transactional_id: str, producer_id: int, epoch: int, fenced: ErrorCode
    ) -> tuple[ErrorCode, Transaction | None]:
        txn = self._by_id.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if epoch != txn.producer_epoch:
            return fenced, None
        if txn.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return ErrorCode.concurrent_transactions, None
        return ErrorCode.none, txn

    def _begin(self, txn: Transaction) -> None:
        if txn.state is TxnState.ONGOING:
            return
        txn.state = TxnState.ONGOING
        txn.started_ms = now_ms()
        # What Produce names the transaction by (its batches carry the producer id).
        txn.service_id = txn.transactional_id
        epoch = txn.producer_epoch
        txn.timer = self.clock.call_later(txn.timeout_ms, lambda: self._expire(txn, epoch))

    # -- AddPartitionsToTxn / AddOffsetsToTxn / TxnOffsetCommit ------------------------------

    async def add_partitions(
        self,
        client: ClientContext,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        partitions: list[tuple[str, int]],
        fenced: ErrorCode,
    ) -> dict[tuple[str, int], ErrorCode]:
        """AddPartitionsToTxn: each partition's error; the topics are looked up for ``client``
        (the requesting connection's context), not as the coordinator. Partitions other nodes
        lead are recorded durably before the answer (Kafka's transaction log does it for every
        partition): a restart of this coordinator ends the transaction there too."""
        error, txn = self._current(transactional_id, producer_id, epoch, fenced)
        if txn is None:
            return dict.fromkeys(partitions, error)
        unknown = {
            (topic, partition)
            for topic, partition in partitions
            if (info := self.api.topic_info(client, topic)) is None
            or not 0 <= partition < info.queues
        }
        if unknown:
            return {
                key: (
                    ErrorCode.unknown_topic_or_partition
                    if key in unknown
                    else ErrorCode.operation_not_attempted
                )
                for key in partitions
            }
        self._begin(txn)
        txn.partitions.update(partitions)
        remote = {key for key in partitions if key not in txn.remote and not self._is_local(key)}
        if remote:
            txn.remote.update(remote)
            await self.api.when_durable(
                await self.table.put(_TXN_KEY + transactional_id, txn.to_json(TxnState.ONGOING))
            )
        return dict.fromkeys(partitions, ErrorCode.none)

    def _is_local(self, key: tuple[str, int]) -> bool:
        try:
            return self.api.partition_is_local(COORDINATOR_CONTEXT, *key)
        except TopicError:
            return True  # deleted meanwhile: nothing to end there

    def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str, fenced: ErrorCode
    ) -> ErrorCode:
        error, txn = self._current(transactional_id, producer_id, epoch, fenced)
        if txn is None:
            return error
        self._begin(txn)
        txn.offsets.setdefault(group_id, {})
        return ErrorCode.none

    def stage_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group_id: str,
        offsets: list[StagedOffset],
        fenced: ErrorCode,
    ) -> ErrorCode:
        error, txn = self._current(transactional_id, producer_id, epoch, fenced)
        if txn is None:
            return error
        if txn.state is not TxnState.ONGOING:
            return ErrorCode.invalid_txn_state
        staged = txn.offsets.setdefault(group_id, {})
        for offset in offsets:
            staged[(offset[0], offset[1])] = offset
        return ErrorCode.none

    def has_pending_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction will commit an offset here (OffsetFetch require_stable)."""
        return any(
            (topic, partition) in txn.offsets.get(group_id, {})
            for txn in self._by_id.values()
            if txn.state is not TxnState.EMPTY
        )

    # -- Produce ---------------------------------------------------------------------------

    def check_produce(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> tuple[ErrorCode, str | None]:
        """May this transactional batch be stored now? ``(error, the name the batch is stored
        under)``. The partition joins the transaction if the producer did not add it (Kafka
        before KIP-890 did not check either). On a cluster node, a producer this node's
        coordinator does not know is another node's (producer ids are unique across the
        cluster): its batch is accepted as Kafka's partition leader accepts it, and its
        coordinator ends the transaction here with ``WriteTxnMarkers``."""
        txn = self._by_producer.get(producer_id)
        if txn is None:
            if self.api.leader_table(COORDINATOR_CONTEXT) is not None:
                return ErrorCode.none, f"{REMOTE_PREFIX}{producer_id}"
            return ErrorCode.invalid_producer_id_mapping, None
        if epoch < txn.producer_epoch:
            return ErrorCode.invalid_producer_epoch, None
        if epoch > txn.producer_epoch or txn.state in (
            TxnState.PREPARE_COMMIT,
            TxnState.PREPARE_ABORT,
        ):
            return ErrorCode.invalid_txn_state, None
        self._begin(txn)
        txn.partitions.add((topic, partition))
        return ErrorCode.none, txn.service_id

    # -- EndTxn ----------------------------------------------------------------------------

    async def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        fenced: ErrorCode,
    ) -> ErrorCode:
        error, txn = self._current(transactional_id, producer_id, epoch, fenced)
        if txn is None:
            return error
        state = txn.state
        if state is TxnState.COMPLETE_COMMIT:
            return ErrorCode.none if commit else ErrorCode.invalid_txn_state
        if state is TxnState.COMPLETE_ABORT:
            return ErrorCode.invalid_txn_state if commit else ErrorCode.none
        if state is not TxnState.ONGOING:
            return ErrorCode.invalid_txn_state
        if commit:
            return await self._commit(txn)
        await self._abort(txn, "the producer aborted it")
        return ErrorCode.none

    async def _commit(self, txn: Transaction) -> ErrorCode:
        txn.state = TxnState.PREPARE_COMMIT
        if txn.timer is not None:
            txn.timer.cancel()
            txn.timer = None
        # PrepareCommit is in the log before any marker: a restart that finds some partition of
        # the transaction still open completes the commit there (Kafka's transaction log).
        key = _TXN_KEY + txn.transactional_id
        prepared = await self.table.put(key, txn.to_json(TxnState.PREPARE_COMMIT))
        if txn.remote:
            # Durable before another node's COMMIT marker: a restart must complete, not abort.
            await self.api.when_durable(prepared)
        end = await self._write_markers(txn, ControlType.COMMIT)
        for group_id, staged in txn.offsets.items():
            if staged:
                end = max(
                    end,
                    self.api.commit_offsets_nowait(COORDINATOR_CONTEXT, group_id, staged.values()),
                )
        end = max(end, await self.table.put(key, txn.to_json(TxnState.COMPLETE_COMMIT)))
        await self.api.when_durable(end)
        self._reset(txn, TxnState.COMPLETE_COMMIT)
        self.metrics["committed"] += 1
        return ErrorCode.none

    async def _abort(self, txn: Transaction, reason: str) -> None:
        txn.state = TxnState.PREPARE_ABORT
        if txn.timer is not None:
            txn.timer.cancel()
            txn.timer = None
        log.debug("kafka: transaction %r aborted: %s", txn.transactional_id, reason)
        end = await self._write_markers(txn, ControlType.ABORT)
        if txn.remote:
            # The record no longer names other nodes' partitions: nothing owed there.
            end = max(end, await self.table.put(_TXN_KEY + txn.transactional_id, txn.to_json()))
        if end:
            await self.api.when_durable(end)
        self._reset(txn, TxnState.COMPLETE_ABORT)
        self.metrics["aborted"] += 1

    async def _write_markers(self, txn: Transaction, control_type: ControlType) -> int:
        """The markers in every partition of the transaction: this node's written here, the
        others' by their leaders (``WriteTxnMarkers``, retried until each leader answered).
        Returns the durable mark of the local ones."""
        local: list[tuple[str, int]] = []
        remote: list[tuple[str, int]] = []
        for key in sorted(txn.partitions):
            try:
                is_local = self.api.partition_is_local(COORDINATOR_CONTEXT, *key)
            except TopicError:
                continue  # deleted meanwhile
            (local if is_local else remote).append(key)
        if remote:
            await self.api.write_remote_transaction_markers(
                COORDINATOR_CONTEXT,
                txn.transactional_id,
                txn.producer_id,
                txn.producer_epoch,
                control_type is ControlType.COMMIT,
                remote,
            )
        end = 0
        stamp = now_ms()
        for topic, partition in local:
            marker = build_control_batch(
                control_type,
                producer_id=txn.producer_id,
                producer_epoch=txn.producer_epoch,
                timestamp_ms=stamp,
            )
            try:
                publication = self.api.write_transaction_marker(
                    COORDINATOR_CONTEXT, topic, partition, marker, born_ms=stamp
                )
            except TopicError:
                continue  # deleted meanwhile
            # Held back by flow control (rare): wait for it to be stored, and durable.
            outcome = publication.outcome if publication.stored else await publication
            end = max(end, outcome.durable_mark)
        return end

    def _expire(self, txn: Transaction, epoch: int) -> None:
        """The transaction timed out: abort it and fence its producer (Kafka bumps the epoch
        so that the producer learns of the abort on its next request)."""
        txn.timer = None
        if txn.state is not TxnState.ONGOING or txn.producer_epoch != epoch:
            return
        log.info(
            "kafka: transaction %r timed out after %d ms: aborted",
            txn.transactional_id,
            txn.timeout_ms,
        )
        self.metrics["expired"] += 1

        async def expire() -> None:
            await self._abort(txn, "timed out")
            await self._bump_epoch(txn)
            await self.api.when_durable(
                await self.table.put(_TXN_KEY + txn.transactional_id, txn.to_json())
            )

        task = asyncio.get_running_loop().create_task(expire())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
