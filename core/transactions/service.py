"""TransactionService: transactional half messages with RocketMQ semantics, over the log.

A transaction is a set of HALF records (each appended to its own topic, durable, indexed only in
``__half/0`` so no reader sees it) that become visible together, at every destination, through
ONE LINK record (one frame, so a multi-record, multi-topic commit is atomic), or never. Record and
header layout: :mod:`core.transactions.layout`; restart: :mod:`core.transactions.recovery`.

Outcomes:

- the producer (or a front end: AMQP ``tx.commit``, Kafka ``EndTxn``) calls :meth:`commit` or
  :meth:`rollback`;
- otherwise, ``check_timeout_ms`` after the last half was added (or after the last check) the
  service asks the producer group's check-back callback, at most ``max_checks`` times
  (RocketMQ: transactionCheckMax = 15), then applies ``default_outcome``; a group without a
  callback (AMQP tx, Kafka transactions) gets ``default_outcome`` at the first timeout (Kafka
  aborts a transaction that outlives transaction.timeout.ms).

Every decision is a record in ``__transactions/0``, each check too (before the callback runs),
so the bound on checks holds across restarts (RocketMQ's TRANSACTION_CHECK_TIMES). A commit is
ONE frame, a LINK that is also the commit's op record (``FLAG_LINK_INDEXED``): one append, and no
crash can separate the decision from the visibility.

Not thread-safe: use from the event-loop thread that runs the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, TypedDict

from core.clock import Clock, LoopClock, Timer
from core.log import LogStore, Record
from core.log import record as rec
from core.log.consumequeue import ConsumeQueue
from core.log.names import HALF_TOPIC, TRANSACTIONS_TOPIC
from core.log.store import Appended
from core.log.tags import tags_mask
from core.transactions.decisions import DecisionWriter, LinkDecision, TargetIndex
from core.transactions.layout import (
    OP_CHECK,
    OP_COMMIT,
    OP_ROLLBACK,
    REASON_CHECK_BACK,
    REASON_CLIENT,
    REASON_MAX_CHECKS,
    REASON_TIMEOUT,
    ResumeMark,
    encode_group_headers,
    encode_half_headers,
    encode_op_headers,
    encode_txn_ids_header,
    op_headers,
)
from core.transactions.recovery import Replay, replay
from core.transactions.state import (
    COMMIT,
    COMMITTED,
    OPEN,
    ROLLBACK,
    ROLLED_BACK,
    UNKNOWN,
    PendingTransaction,
    Transaction,
    TransactionError,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)


class RecordFields(TypedDict, total=False):
    """A published record's own fields, as ``LogStore.append`` and the half-message paths take
    them after the body (``Broker.publish`` hands the same ones to either)."""

    key: bytes | None
    headers: rec.Headers
    tags: Sequence[str]
    subject: str
    client: str
    address: str
    protocol: int
    born_ms: int


class HalfFields(RecordFields, total=False):
    """The record fields :meth:`TransactionService.add_nowait` takes after the body."""

    destinations: Sequence[tuple[str, int]] | None
    flags: int
    record_count: int


# check_back(producer_group, txn_id, first half record) -> "commit" | "rollback" | "unknown".
CheckBack = Callable[[str, str, Record], Awaitable[str]]

# RocketMQ broker defaults: transactionTimeOut = 6 s before the first check,
# transactionCheckMax = 15 checks before the message is discarded.
DEFAULT_CHECK_TIMEOUT_MS = 6000
DEFAULT_MAX_CHECKS = 15
# How long one check-back call may take before it counts as "unknown" (RocketMQ sends the check
# one-way and waits for the producer's EndTransaction; a bounded wait is the equivalent here).
DEFAULT_CHECK_CALL_TIMEOUT_MS = 3000
# Overdue transactions are found by one sweep of the open ones this often at most (RocketMQ's
# transactionCheckInterval is 60 s; a quarter of the timeout keeps checks close to it).
MAX_SWEEP_INTERVAL_MS = 1000
# Outcomes of decided transactions kept for txn_state() (they are in the log anyway).
RECENT_OUTCOMES = 100_000
# Flags a half message may carry besides FLAG_HALF (a Kafka batch, a Kafka control batch).
_ALLOWED_HALF_FLAGS = rec.FLAG_BATCH | rec.FLAG_TXN_CONTROL

_OUTCOME_STATE = {COMMIT: COMMITTED, ROLLBACK: ROLLED_BACK}
# NamedTuple construction without its Python-level __new__ (a decision per commit).
_new_tuple = tuple.__new__
_COMMIT_TAGS = (OP_COMMIT,)
# Halves one coalesced commit frame names at most (more are written as a further frame).
MAX_COALESCED_HALVES = 4096


class TransactionService:
    """Create it right after opening the store, before anything else appends: the constructor
    replays ``__half/0`` and ``__transactions/0`` (open transactions are open again, a commit
    whose LINK is missing is linked) and registers :meth:`owes_segment` as a retention guard.
    Then ``await start()`` (timers), and from the event loop::

        txn = service.begin("producer-group")          # or begin(group, "own-id")
        await service.add(txn, "orders", 0, b"...", destinations=[("orders", 0), ("audit", 0)])
        await service.add(txn, "payments", 3, b"...")
        await service.commit(txn)                       # or rollback(txn)
    """

    def __init__(
        self,
        store: LogStore,
        *,
        check_back: CheckBack | None = None,
        check_timeout_ms: float = DEFAULT_CHECK_TIMEOUT_MS,
        max_checks: int = DEFAULT_MAX_CHECKS,
        default_outcome: str = ROLLBACK,
        check_call_timeout_ms: float = DEFAULT_CHECK_CALL_TIMEOUT_MS,
        sweep_interval_ms: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        if default_outcome not in (COMMIT, ROLLBACK):
            raise ValueError(f"default_outcome must be {COMMIT!r} or {ROLLBACK!r}")
        if max_checks < 0 or check_timeout_ms <= 0:
            raise ValueError("max_checks must be >= 0 and check_timeout_ms > 0")
        self.store = store
        self.decisions = DecisionWriter(store)  # the commit frames
        self.default_check_back = check_back
        # Per producer group: its callback, or None for "never check back" (AMQP tx, Kafka).
        self.check_backs: dict[str, CheckBack | None] = {}
        self.check_timeout_ms = check_timeout_ms
        self.max_checks = max_checks
        self.default_outcome = default_outcome
        self.check_call_timeout_ms = check_call_timeout_ms
        self.sweep_interval_ms = (
            min(check_timeout_ms / 4, MAX_SWEEP_INTERVAL_MS)
            if sweep_interval_ms is None
            else sweep_interval_ms
        )
        self.clock: Clock = clock or LoopClock()
        self._metrics: dict[str, int] = {
            "pending": 0,
            "committed": 0,
            "rolled_back": 0,
            "checks": 0,
            "checks_unknown": 0,
            "checks_failed": 0,
            "default_outcomes": 0,
            "recovered_pending": 0,
            # Frames holding the client commits of one event-loop turn (committed / this: how
            # many commits share a frame).
            "commit_frames": 0,
        }
        self._open: dict[str, Transaction] = {}
        # Open transactions that stored a half, oldest first half first: the resume mark and the
        # retention guard come from the head.
        self._stored: OrderedDict[str, Transaction] = OrderedDict()
        # Insertion-ordered; trimmed in bulk to the newest RECENT_OUTCOMES when it holds twice
        # that (deleting its first key one at a time would rescan deleted slots each time).
        self._recent: dict[str, str] = {}
        # The encoded half headers after the txn id, per (producer group, timeout).
        self._group_headers: dict[tuple[str, float | None], bytes] = {}
        self._plain_targets: dict[tuple[str, int], TargetIndex] = {}
        # Whether a topic's durability is sync (the store's configuration does not change).
        self._sync_topics: dict[str, bool] = {}
        self._ops_index: ConsumeQueue | None = None  # __transactions/0, once it exists
        self._half_index: ConsumeQueue | None = None  # __half/0, once it exists
        # Client commits decided in this event-loop turn, written together at its end (or
        # before the next group commit picks its fsync position): see _write_commits.
        self._unwritten: dict[str, Transaction] = {}
        self._unwritten_halves = 0
        self._written_waiters: list[asyncio.Future[None]] = []  # resolved once appended
        self._durable_waiters: list[asyncio.Future[None]] = []  # resolved once durable
        self._sync_decisions = store.is_sync(TRANSACTIONS_TOPIC)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: Timer | None = None
        # Generated ids: random per service instance (so unique across restarts), then a counter.
        self._id_prefix = os.urandom(8).hex() + "-"
        self._id_counter = itertools.count(1)
        self._started = False
        self._closed = False
        self.replay: Replay = self._recover()
        # Stays registered after aclose(): open halves are owed until decided, service or not.
        store.retention_guards.append(self.owes_segment)
        store.before_sync.append(self._write_commits)

    @property
    def metrics(self) -> dict[str, int]:
        """Counters (``pending``: open transactions now, filled in when read)."""
        self._metrics["pending"] = len(self._open)
        return self._metrics

    # -- restart ---------------------------------------------------------------------------

    def _recover(self) -> Replay:
        result = replay(self.store)
        for txn_id, state in result.decided.items():
            self._remember(txn_id, state)
        for txn in result.open:
            self._open[txn.txn_id] = txn
            self._stored[txn.txn_id] = txn
        self._metrics["recovered_pending"] = len(result.open)
        if result.open:
            log.info(
                "transactions: %d pending again (replayed %d halves, %d ops)",
                len(result.open),
                result.halves_read,
                result.ops_read,
            )
        return result

    async def start(self) -> None:
        """Start looking for overdue transactions. Those restart found open (and any begun
        before) are due ``check_timeout_ms`` from now: their timers restart."""
        self._started = True
        now = self.clock.now_ms()
        for txn in self._open.values():
            txn.deadline_ms = now + self._timeout(txn)
        self._sweeper = self.clock.call_later(self.sweep_interval_ms, self._sweep)

    async def aclose(self) -> None:
        """Stop the sweeper and running checks; open transactions stay open in the log."""
        self._write_commits()
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def settle(self) -> None:
        """Wait until no check-back or default outcome is in progress (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- configuration ---------------------------------------------------------------------

    def set_check_back(self, producer_group: str, check_back: CheckBack | None) -> None:
        """Give ``producer_group`` its own callback; None means the group is never asked and a
        timeout applies the default outcome (AMQP tx, Kafka transactions)."""
        self.check_backs[producer_group] = check_back

    def _check_back_for(self, producer_group: str) -> CheckBack | None:
        if producer_group in self.check_backs:
            return self.check_backs[producer_group]
        return self.default_check_back

    # -- the producer's side ---------------------------------------------------------------

    def begin(
        self,
        producer_group: str,
        transaction_id: str | None = None,
        *,
        timeout_ms: float | None = None,
    ) -> str:
        """Open a transaction and return its id. ``transaction_id`` may be given (a front end's
        own id: it must not name an open transaction, and may be reused once that one is
        decided). ``timeout_ms`` replaces ``check_timeout_ms`` for this transaction (Kafka's
        transaction.timeout.ms); it is stored with each half, so it survives restart."""
        if transaction_id is None:
            txn_id = f"{self._id_prefix}{next(self._id_counter):x}"
        else:
            txn_id = transaction_id
        if txn_id in self._unwritten:
            # Its commit must precede the new transaction's halves in the log (replay tells
            # the two apart by that order). (If that append fails, the id is open again.)
            self._write_commits()
        if txn_id in self._open:
            raise TransactionError(f"transaction {txn_id!r} is already open")
        if timeout_ms is not None and timeout_ms <= 0:
            raise ValueError("timeout_ms must be positive")
        txn = Transaction(txn_id, producer_group, timeout_ms)
        opened = self._open
        opened[txn_id] = txn
        if transaction_id is not None and txn_id in self._recent:
            del self._recent[txn_id]  # a front end's id used again: open, not decided
        if self._started:
            txn.deadline_ms = self.clock.now_ms() + (
                self.check_timeout_ms if timeout_ms is None else timeout_ms
            )
        return txn_id

    def _half_headers(self, txn: Transaction) -> bytes:
        group_key = (txn.producer_group, txn.timeout_ms)
        encoded_group = self._group_headers.get(group_key)
        if encoded_group is None:
            encoded_group = encode_group_headers(txn.producer_group, txn.timeout_ms)
            if len(self._group_headers) < 10_000:  # groups are few; ids with timeouts are not
                self._group_headers[group_key] = encoded_group
        encoded = txn.half_headers = encode_half_headers(txn.txn_id, encoded_group)
        return encoded

    def add_nowait(
        self,
        txn_id: str,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        key: bytes | None = b"",
        headers: rec.Headers = (),
        tags: Sequence[str] = (),
        subject: str = "",
        client: str = "",
        address: str = "",
        destinations: Sequence[tuple[str, int]] | None = None,
        protocol: int = rec.PROTOCOL_INTERNAL,
        born_ms: int = 0,
        flags: int = 0,
        record_count: int = 1,
    ) -> Appended:
        """Append a half message to the open transaction ``txn_id``; not yet durable (await
        ``store.wait_durable(appended.end)``, or let :meth:`commit` wait). The fields are the
        record's, as :meth:`LogStore.append` takes them; ``destinations`` are where a commit
        makes it visible (default ``(topic, queue)``)."""
        txn = self._open.get(txn_id)
        if txn is None:
            raise TransactionError(self._not_open(txn_id))
        if flags & ~_ALLOWED_HALF_FLAGS:
            raise ValueError("a half message may only add FLAG_BATCH or FLAG_TXN_CONTROL")
        own_headers = txn.half_headers or self._half_headers(txn)
        appended: Appended | None = None
        if (
            type(body) is bytes
            and type(key) is bytes
            and record_count == 1
            and not (headers or tags or subject or client or address or destinations or flags)
        ):
            # The common half (a producer's one record): encoded in place, see append_half.
            appended = self.store.append_half(
                topic, queue, body, key, own_headers, protocol, born_ms
            )
        if appended is None:
            appended = self.store.append(
                topic,
                queue,
                body,
                key=key,
                # Encoded headers concatenate: the producer's, then the transaction's.
                headers=rec.encode_headers(headers) + own_headers if headers else own_headers,
                tags=tags,
                subject=subject,
                client=client,
                address=address,
                destinations=destinations,
                protocol=protocol,
                born_ms=born_ms,
                flags=flags | rec.FLAG_HALF,
                record_count=record_count,
            )
            known = TargetIndex(
                tags_mask(tags) if tags else 0, record_count, destinations or ((topic, queue),)
            )
        else:
            known = self._plain_targets.get((topic, queue)) or self._plain_target(topic, queue)
        position, end, _ = appended
        halves = txn.halves
        if not halves:
            txn.first_half_offset = appended.offsets[0][2]
            txn.first_op_offset = self._op_next_offset()
            self._stored[txn_id] = txn
        halves.append((position, end - position))
        if len(txn.half_index) == len(halves) - 1:
            txn.half_index.append(known)
        if not txn.sync:
            sync = self._sync_topics.get(topic)
            if sync is None:
                sync = self._sync_topics[topic] = self.store.is_sync(topic)
            txn.sync = sync
        if self._started:
            txn.deadline_ms = self.clock.now_ms() + (
                self.check_timeout_ms if txn.timeout_ms is None else txn.timeout_ms
            )
        return appended

    def _plain_target(self, topic: str, queue: int) -> TargetIndex:
        """How a half without tags or destinations is indexed once committed (one per queue,
        shared by every such half)."""
        if len(self._plain_targets) >= 100_000:
            self._plain_targets.clear()  # queues come and go; keep the cache bounded
        known = self._plain_targets[(topic, queue)] = TargetIndex(0, 1, ((topic, queue),))
        return known

    async def add(
        self,
        txn_id: str,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        **fields: Unpack[HalfFields],
    ) -> int:
        """Append a half message (the fields as for :meth:`add_nowait`) and return its
        commit-log position once it is durable (at ``topic``'s durability): only then may the
        producer run its local transaction."""
        appended = self.add_nowait(txn_id, topic, queue, body, **fields)
        await self.store.wait_durable(appended.end, topic)
        return appended.position

    async def commit(self, txn_id: str, *, durable: bool = True) -> None:
        """Make every half of ``txn_id`` visible at its destinations, atomically, and return
        once that is durable. Committing a committed transaction does nothing.

        The commits of one event-loop turn are appended together, as one frame, when the turn
        ends (and before any fsync starts): with many producers the decision frame, its index
        entry and its checksum were a third of a transaction's cost. The transaction is decided
        at once (``txn_state``); a crash before its frame is appended leaves it open.

        ``durable=False`` is RocketMQ's one-way EndTransaction: it returns at once, without
        suspending, and the frame is appended when the turn ends (a failure to append it is
        logged). Once appended it survives a process crash (the segments are shared memory
        maps), but an OS crash before the next fsync may lose it. A transaction whose commit
        was lost is open again after restart, to be checked back: only for producer groups
        with a check-back."""
        txn = self._open.get(txn_id)
        if txn is None or not txn.halves:
            wait = self._decide(txn_id, COMMIT)
            if wait is not None and durable:
                await self.store.wait_durable(*wait)
            return
        self._forget(txn, COMMIT)  # it stays in _stored (the resume mark) until written
        loop = asyncio.get_running_loop()
        unwritten = self._unwritten
        if not unwritten:
            loop.call_soon(self._write_commits)
        unwritten[txn_id] = txn
        self._unwritten_halves += len(txn.halves)
        future: asyncio.Future[None] | None = None
        if durable:
            future = loop.create_future()
            if txn.sync or self._sync_decisions:
                self._durable_waiters.append(future)
            else:
                self._written_waiters.append(future)
        if self._unwritten_halves >= MAX_COALESCED_HALVES:
            self._write_commits()
        if future is not None:
            await future

    def _write_commits(self) -> None:
        """Append the commits :meth:`commit` held back (one frame for all of them), then wake
        their callers: at once, or once the frame is durable."""
        unwritten = self._unwritten
        if not unwritten:
            return
        self._unwritten = {}
        self._unwritten_halves = 0
        written, durable = self._written_waiters, self._durable_waiters
        self._written_waiters = []
        self._durable_waiters = []
        stored = self._stored
        for txn_id in unwritten:
            stored.pop(txn_id, None)
        try:
            end = self._append_commits(list(unwritten.values()))
        except Exception as error:
            log.exception("transactions: writing %d commits failed", len(unwritten))
            self._reopen(unwritten.values())
            for future in written + durable:
                if not future.done():
                    future.set_exception(error)
            return
        for future in written:
            if not future.done():
                future.set_result(None)
        self._metrics["commit_frames"] += 1
        add_durable_waiter = self.store.add_durable_waiter
        for future in durable:
            add_durable_waiter(end, future)

    async def rollback(self, txn_id: str, *, durable: bool = True) -> None:
        """Discard every half of ``txn_id``: they are never indexed anywhere visible. Rolling
        back a rolled-back transaction does nothing. ``durable`` as for :meth:`commit`."""
        wait = self._decide(txn_id, ROLLBACK)
        if wait is not None and durable:
            await self.store.wait_durable(*wait)

    # -- state -----------------------------------------------------------------------------

    def txn_state(self, txn_id: str) -> str | None:
        """``"open"``, ``"committed"``, ``"rolled_back"``, or None if unknown (never begun, or
        decided long ago and forgotten)."""
        if txn_id in self._open:
            return OPEN
        return self._recent.get(txn_id)

    def pending(self) -> list[PendingTransaction]:
        """Every open transaction."""
        return [
            PendingTransaction(
                txn.txn_id,
                txn.producer_group,
                len(txn.halves),
                txn.halves[0][0] if txn.halves else None,
                txn.checks,
                txn.checking,
            )
            for txn in self._open.values()
        ]

    def owes_segment(self, start: int, end: int) -> bool:
        """Retention guard (the service registers it in ``store.retention_guards``): True while
        the commit-log range ``[start, end)`` may hold a half of an open transaction. Segments
        go oldest first, so keeping everything from the oldest open half on is exact enough."""
        if not self._stored:
            return False
        oldest = next(iter(self._stored.values()))
        return oldest.halves[0][0] < end

    # -- deciding --------------------------------------------------------------------------

    def _not_open(self, txn_id: str) -> str:
        state = self._recent.get(txn_id)
        if state is None:
            return f"unknown transaction {txn_id!r}"
        return f"transaction {txn_id!r} is already {state.replace('_', ' ')}"

    def _decide(self, txn_id: str, outcome: str) -> tuple[int, str | None] | None:
        """The client's decision, written now; returns what :meth:`LogStore.wait_durable`
        must wait for to make it durable, None when nothing was stored. (Not a coroutine: a
        commit is as hot as a publish, and each coroutine level costs.)"""
        txn = self._open.get(txn_id)
        if txn is None:
            if self._recent.get(txn_id) == _OUTCOME_STATE[outcome]:
                return None
            raise TransactionError(self._not_open(txn_id))
        end = self._decide_now(txn, outcome, REASON_CLIENT)
        if end is None:
            return None
        return end, None if txn.sync else TRANSACTIONS_TOPIC

    def _decide_now(self, txn: Transaction, outcome: str, reason: str) -> int | None:
        """Write the decision (synchronously: nothing else runs in between) and forget the
        transaction. Returns the position to wait for, None when nothing was stored."""
        self._forget(txn, outcome)
        self._stored.pop(txn.txn_id, None)
        if not txn.halves:
            return None
        # The mark no longer counts this transaction, yet replay still reads this record (it is
        # at or after the mark's op offset).
        try:
            if outcome == COMMIT:
                return self._append_commit(
                    txn.txn_id, txn.producer_group, reason, txn.halves, txn.known_half_index()
                ).end
            op = self._append_op(
                OP_ROLLBACK,
                txn.txn_id,
                txn.producer_group,
                reason,
                None,
                rec.encode_link_body(txn.halves),
                self._mark(),
            )
        except BaseException:
            self._reopen((txn,))
            raise
        return op.end

    def _reopen(self, txns: Collection[Transaction]) -> None:
        """Undo :meth:`_forget` for decisions that never reached the log: the transactions are
        open again (as a restart would find them), may be decided again, and count in the
        resume mark and the retention guard."""
        for txn in txns:
            self._metrics["committed" if txn.state == COMMITTED else "rolled_back"] -= 1
            txn.state = OPEN
            self._open[txn.txn_id] = txn
            self._recent.pop(txn.txn_id, None)
        stored = [*self._stored.values(), *(txn for txn in txns if txn.txn_id not in self._stored)]
        stored.sort(key=lambda txn: txn.first_half_offset)  # oldest first half first
        self._stored = OrderedDict((txn.txn_id, txn) for txn in stored)

    def _forget(self, txn: Transaction, outcome: str) -> None:
        """Decided: no longer open (the caller writes the decision)."""
        txn.state = _OUTCOME_STATE[outcome]
        del self._open[txn.txn_id]
        self._remember(txn.txn_id, txn.state)
        self._metrics["committed" if outcome == COMMIT else "rolled_back"] += 1

    def _remember(self, txn_id: str, state: str) -> None:
        recent = self._recent
        if txn_id in recent:
            del recent[txn_id]  # inserted again below: the newest
        recent[txn_id] = state
        if len(recent) > 2 * RECENT_OUTCOMES:
            newest = list(recent.items())[-RECENT_OUTCOMES:]
            self._recent = dict(newest)

    # -- op records ------------------------------------------------------------------------

    def _op_next_offset(self) -> int:
        index = self._ops_index
        if index is None:
            index = self._ops_index = self.store.queue_index(TRANSACTIONS_TOPIC, 0)
            if index is None:
                return 0
        return index.next_offset

    def _mark(self) -> ResumeMark:
        return ResumeMark(*self._mark_offsets())

    def _mark_offsets(self) -> tuple[int, int]:
        if self._stored:
            oldest = next(iter(self._stored.values()))
            return oldest.first_half_offset, oldest.first_op_offset
        half_index = self._half_index
        if half_index is None:
            half_index = self._half_index = self.store.queue_index(HALF_TOPIC, 0)
        return 0 if half_index is None else half_index.next_offset, self._op_next_offset()

    def _append_op(
        self,
        kind: str,
        txn_id: str,
        producer_group: str,
        reason: str | None,
        checks: int | None,
        body: bytes,
        mark: ResumeMark,
    ) -> Appended:
        return self.store.append(
            TRANSACTIONS_TOPIC,
            0,
            body,
            key=txn_id.encode(),
            client=producer_group,
            tags=(kind,),
            headers=op_headers(mark, reason, checks),
        )

    def _append_commit(
        self,
        txn_id: str,
        producer_group: str,
        reason: str,
        halves: Sequence[tuple[int, int]],
        half_index: Sequence[TargetIndex] | None = None,
    ) -> Appended:
        """The commit decision and the LINK making ``halves`` visible, as one frame indexed in
        ``__transactions/0`` (see :mod:`core.transactions.layout`). ``half_index``: how each
        half is indexed, when this service appended them (no need to read their frames)."""
        decision = (
            txn_id.encode(),
            producer_group,
            _COMMIT_TAGS,
            encode_op_headers(self._mark_offsets(), reason, None),
        )
        return self.decisions.append(halves, _new_tuple(LinkDecision, decision), half_index)

    def _append_commits(self, txns: Sequence[Transaction]) -> int:
        """One commit frame deciding every transaction of ``txns``, committed by their clients
        (see :mod:`core.transactions.layout`; one transaction keeps the single layout);
        returns its end."""
        if len(txns) == 1:
            (txn,) = txns
            return self._append_commit(
                txn.txn_id, txn.producer_group, REASON_CLIENT, txn.halves, txn.known_half_index()
            ).end
        halves: list[tuple[int, int]] = []
        half_index: list[TargetIndex] | None = []
        txn_ids: list[bytes] = []
        for txn in txns:
            halves += txn.halves
            txn_ids.append(txn.txn_id.encode())
            if half_index is not None:
                known = txn.known_half_index()
                if known is None:
                    half_index = None  # a half found by restart: the store reads the frames
                else:
                    half_index += known
        headers = encode_op_headers(self._mark_offsets(), REASON_CLIENT, None)
        decision = (b"", "", _COMMIT_TAGS, headers + encode_txn_ids_header(txn_ids))
        return self.decisions.append(halves, _new_tuple(LinkDecision, decision), half_index).end

    # -- timers and check-back -------------------------------------------------------------

    def _timeout(self, txn: Transaction) -> float:
        return self.check_timeout_ms if txn.timeout_ms is None else txn.timeout_ms

    def _sweep(self) -> None:
        """Start resolving every open transaction past its deadline; then sweep again later."""
        self._sweeper = None
        if self._closed:
            return
        now = self.clock.now_ms()
        overdue = [
            txn for txn in self._open.values() if not txn.checking and txn.deadline_ms <= now
        ]
        loop = asyncio.get_running_loop()
        for txn in overdue:
            txn.checking = True
            task = loop.create_task(self._overdue(txn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._sweeper = self.clock.call_later(self.sweep_interval_ms, self._sweep)

    async def _overdue(self, txn: Transaction) -> None:
        try:
            await self._resolve_overdue(txn)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("transaction %s: check failed", txn.txn_id)
            txn.deadline_ms = self.clock.now_ms() + self._timeout(txn)
        finally:
            txn.checking = False

    async def _resolve_overdue(self, txn: Transaction) -> None:
        if not txn.halves:
            # Begun, nothing stored: nothing to ask about or to write.
            self._decide_now(txn, ROLLBACK, REASON_TIMEOUT)
            return
        check_back = self._check_back_for(txn.producer_group)
        if check_back is None or txn.checks >= self.max_checks:
            await self._apply_default(
                txn, REASON_TIMEOUT if check_back is None else REASON_MAX_CHECKS
            )
            return
        txn.checks += 1
        self._metrics["checks"] += 1
        # The count is durable before the producer is asked: the bound holds across crashes.
        op = self._append_op(
            OP_CHECK, txn.txn_id, txn.producer_group, None, txn.checks, b"", self._mark()
        )
        await self.store.wait_durable(op.end)
        if txn.state != OPEN:
            return  # the producer decided meanwhile
        answer = await self._ask(check_back, txn)
        if txn.state != OPEN:
            return  # the producer decided while we asked
        if answer in (COMMIT, ROLLBACK):
            end = self._decide_now(txn, answer, REASON_CHECK_BACK)
            if end is not None:
                await self.store.wait_durable(end)
            return
        self._metrics["checks_unknown"] += 1
        if txn.checks >= self.max_checks:
            await self._apply_default(txn, REASON_MAX_CHECKS)
            return
        txn.deadline_ms = self.clock.now_ms() + self._timeout(txn)

    async def _ask(self, check_back: CheckBack, txn: Transaction) -> str:
        try:
            first = self.store.read_at(txn.halves[0][0])
            answer = await asyncio.wait_for(
                check_back(txn.producer_group, txn.txn_id, first),
                self.check_call_timeout_ms / 1000,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the producer failed to answer: as good as "unknown"
            self._metrics["checks_failed"] += 1
            log.info("transaction %s: check-back failed: %r", txn.txn_id, error)
            return UNKNOWN
        normalized = str(answer).lower()
        return normalized if normalized in (COMMIT, ROLLBACK) else UNKNOWN

    async def _apply_default(self, txn: Transaction, reason: str) -> None:
        self._metrics["default_outcomes"] += 1
        log.info("transaction %s: %s after %s", txn.txn_id, self.default_outcome, reason)
        end = self._decide_now(txn, self.default_outcome, reason)
        if end is not None:
            await self.store.wait_durable(end)
