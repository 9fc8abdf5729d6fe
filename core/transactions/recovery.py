"""Rebuild the transactions left open by the last run from ``__half/0`` and ``__transactions/0``.

Replay reads both queues from the resume mark of the last op record (see
:mod:`core.transactions.layout`), merges them in commit-log order and applies each record:

- a half with ``x-braid-txn`` opens its transaction (or adds to it; an id whose previous
  transaction was decided starts a new one, so ids may be reused once decided);
- a ``check`` op raises the transaction's durable check count;
- a ``commit`` or ``rollback`` op decides it (a commit of several transactions decides each
  one its ``x-braid-txn-ids`` header names).

Transactions with halves and no decision are open again. A ``commit`` is one frame, a LINK
indexed in ``__transactions/0`` (``FLAG_LINK_INDEXED``): the log's recovery keeps or drops the
whole frame, so the decision and the visibility of its halves come back together or not at all,
and there is nothing to repair.

Reads only; the service writes. Not thread-safe.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from core.log import LogStore, QueueRecord
from core.log.names import HALF_TOPIC, TRANSACTIONS_TOPIC
from core.transactions.layout import (
    OP_CHECK,
    OP_COMMIT,
    OP_ROLLBACK,
    RESUME_HEADER,
    ResumeMark,
    decode_operation,
    encode_group_headers,
    encode_half_headers,
    half_info,
)
from core.transactions.state import COMMITTED, OPEN, ROLLED_BACK, Transaction

log = logging.getLogger(__name__)

# Records per read while replaying a queue.
REPLAY_BATCH = 1024


@dataclass
class Replay:
    mark: ResumeMark
    open: list[Transaction]  # undecided, oldest first half first
    decided: dict[str, str]  # txn id -> COMMITTED / ROLLED_BACK, in decision order
    halves_read: int = 0
    ops_read: int = 0
    foreign_halves: int = 0  # half messages without x-braid-txn (not ours)


def find_resume_mark(store: LogStore) -> ResumeMark:
    """The resume mark of the newest op record; the queue starts when there is none."""
    half_start, _ = store.queue_bounds(HALF_TOPIC, 0)
    op_start, op_next = store.queue_bounds(TRANSACTIONS_TOPIC, 0)
    offset = op_next - 1
    while offset >= op_start:
        found = store.read(TRANSACTIONS_TOPIC, 0, offset, max_records=1)
        if found:
            for name, value in found[0].record().headers:
                if name == RESUME_HEADER:
                    mark = ResumeMark.decode(value)
                    # Retention may have moved the queues' starts past the mark.
                    return ResumeMark(
                        max(mark.half_offset, half_start), max(mark.op_offset, op_start)
                    )
        offset -= 1
    return ResumeMark(half_start, op_start)


def _queue_records(store: LogStore, topic: str, offset: int) -> Iterator[QueueRecord]:
    while True:
        batch = store.read(topic, 0, offset, max_records=REPLAY_BATCH)
        if not batch:
            return
        yield from batch
        offset = batch[-1].next_offset


def replay(store: LogStore, mark: ResumeMark | None = None) -> Replay:
    mark = find_resume_mark(store) if mark is None else mark
    result = Replay(mark, [], {})
    current: dict[str, Transaction] = {}  # txn id -> its newest transaction
    created: list[Transaction] = []
    halves = (
        (queued.position, 0, queued)
        for queued in _queue_records(store, HALF_TOPIC, mark.half_offset)
    )
    ops = (
        (queued.position, 1, queued)
        for queued in _queue_records(store, TRANSACTIONS_TOPIC, mark.op_offset)
    )
    for _position, source, queued in heapq.merge(halves, ops, key=lambda item: item[:2]):
        record = queued.record()
        if source == 0:
            result.halves_read += 1
            info = half_info(record.headers)
            if info is None:
                result.foreign_halves += 1
                continue
            txn = current.get(info.txn_id)
            if txn is None or txn.state != OPEN:
                txn = Transaction(info.txn_id, info.producer_group, info.timeout_ms)
                txn.half_headers = encode_half_headers(
                    info.txn_id, encode_group_headers(info.producer_group, info.timeout_ms)
                )
                txn.first_half_offset = queued.offset
                txn.first_op_offset = mark.op_offset
                current[info.txn_id] = txn
                created.append(txn)
            txn.halves.append((record.position, record.size))
            txn.sync = txn.sync or store.is_sync(record.topic)
            continue
        result.ops_read += 1
        op = decode_operation(
            record.position,
            record.size,
            record.key,
            record.client,
            record.tags,
            record.headers,
            record.body,
        )
        if op is None:
            continue
        for txn_id in op.txn_ids:  # one, or every transaction of a coalesced commit
            txn = current.get(txn_id)
            if txn is None or txn.state != OPEN:
                # Its halves are before the mark (or this repeats a decision): remember it.
                if op.kind != OP_CHECK:
                    result.decided[txn_id] = COMMITTED if op.kind == OP_COMMIT else ROLLED_BACK
                continue
            if op.kind == OP_CHECK:
                txn.checks = max(txn.checks, op.checks)
            elif op.kind in (OP_COMMIT, OP_ROLLBACK):
                txn.state = COMMITTED if op.kind == OP_COMMIT else ROLLED_BACK
                result.decided[txn_id] = txn.state
    result.open = [txn for txn in created if txn.state == OPEN]
    return result
