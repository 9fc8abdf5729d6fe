"""Kafka transactions in the partitions (core/transactions/partitions.py, core/log/txnindex.py):
the last stable offset and the aborted transactions, as the broker keeps them and as they come
back after a restart (clean, or a crash that replays every frame), and the outcomes readers of
the log files (Spark, ``braid tail``) see.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from braid.tail import Follower, lines_of
from core.log import LogReader, LogStore
from core.log.txnindex import ABORTED, COMMITTED, OPEN, TxnOutcomes, batch_txn
from core.transactions.partitions import PartitionTransactions
from gateway.kafka.records import ControlType, build_batch, build_control_batch
from tests.transactions.conftest import crash, small_config

TOPIC = "orders"


def data(producer_id: int, *values: bytes) -> bytes:
    return build_batch(
        [(1000, None, value, []) for value in values],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )


def plain(value: bytes) -> bytes:
    return build_batch([(1000, None, value, [])])


def marker(producer_id: int, commit: bool) -> bytes:
    kind = ControlType.COMMIT if commit else ControlType.ABORT
    return build_control_batch(kind, producer_id=producer_id, producer_epoch=0)


def test_batch_fields_are_read_from_the_kafka_header() -> None:
    assert batch_txn(plain(b"x")) is None
    info = batch_txn(data(7, b"x"))
    assert info is not None
    assert (info.producer_id, info.control) == (7, False)
    commit = batch_txn(marker(7, True))
    abort = batch_txn(marker(7, False))
    assert commit is not None
    assert (commit.control, commit.commit) == (True, True)
    assert abort is not None
    assert (abort.control, abort.commit) == (True, False)


def fill(store: LogStore, txns: PartitionTransactions) -> None:
    """Offsets: 0-1 pid 1 (aborted at 2), 3 plain, 4 pid 2 (open), 5 pid 3 (committed at 6),
    7 pid 2 again (same open transaction)."""
    txns.append_data(TOPIC, 0, data(1, b"a1", b"a2"), 2, born_ms=0, client="")
    txns.append_marker(TOPIC, 0, marker(1, False), born_ms=0)
    store.append_batch(TOPIC, 0, plain(b"p"), 1)
    txns.append_data(TOPIC, 0, data(2, b"open"), 1, born_ms=0, client="")
    txns.append_data(TOPIC, 0, data(3, b"c"), 1, born_ms=0, client="")
    txns.append_marker(TOPIC, 0, marker(3, True), born_ms=0)
    txns.append_data(TOPIC, 0, data(2, b"open-2"), 1, born_ms=0, client="")


def check(txns: PartitionTransactions, high_watermark: int) -> None:
    assert txns.last_stable_offset(TOPIC, 0, high_watermark) == 4
    assert [(t.producer_id, t.first_offset) for t in txns.open_transactions()] == [(2, 4)]
    assert txns.aborted(TOPIC, 0, 0, 8) == [(1, 0)]
    assert txns.aborted(TOPIC, 0, 2, 8) == [(1, 0)]  # the marker's offset still overlaps
    assert txns.aborted(TOPIC, 0, 3, 8) == []
    assert txns.aborted(TOPIC, 0, 0, 0) == []


def test_last_stable_offset_and_aborted_transactions_survive_restart(tmp_path: Path) -> None:
    store = LogStore(small_config(tmp_path))
    txns = PartitionTransactions(store)
    fill(store, txns)
    _, end = store.queue_bounds(TOPIC, 0)
    assert end == 8
    check(txns, end)
    store.close()

    store = LogStore(small_config(tmp_path))
    try:
        check(PartitionTransactions(store), end)
    finally:
        store.close()


def test_state_is_rebuilt_after_a_crash_that_replays_every_frame(tmp_path: Path) -> None:
    store = LogStore(small_config(tmp_path))
    fill(store, PartitionTransactions(store))
    store.flush()
    crash(store)
    store = LogStore(small_config(tmp_path))
    try:
        txns = PartitionTransactions(store)
        check(txns, 8)
        # The open transaction ends after the restart: the partition is stable again.
        txns.append_marker(TOPIC, 0, marker(2, True), born_ms=0)
        assert txns.last_stable_offset(TOPIC, 0, 9) == 9
        assert txns.open_transactions() == []
    finally:
        store.close()


def test_readers_of_the_files_see_each_batch_outcome(tmp_path: Path) -> None:
    store = LogStore(small_config(tmp_path))
    fill(store, PartitionTransactions(store))
    store.flush()
    try:
        with LogReader(tmp_path) as reader:
            outcomes = TxnOutcomes.read(reader)
            entries = reader.read(TOPIC, 0, 0, max_records=100)
            states = []
            for entry in entries:
                info = batch_txn(entry.body)
                if info is None or info.control:
                    states.append("control" if info else "plain")
                else:
                    states.append(outcomes.outcome(TOPIC, 0, info.producer_id, entry.position))
            assert states == [ABORTED, "control", "plain", OPEN, COMMITTED, "control", OPEN]
            shown = [
                bytes(entry.body)
                for entry in entries
                if outcomes.shows(TOPIC, 0, entry.position, entry.body)
            ]
            assert shown == [plain(b"p"), data(3, b"c")]
            with_aborted = [
                entry.offset
                for entry in entries
                if outcomes.shows(TOPIC, 0, entry.position, entry.body, include_aborted=True)
            ]
            assert with_aborted == [0, 3, 5]
    finally:
        store.close()


def shown_values(follower: Follower) -> list[bytes | None]:
    return [
        line.body
        for record, queue, offset in follower.poll()
        for line in lines_of(record, TOPIC, queue, offset)
    ]


@pytest.mark.parametrize("include_aborted", [False, True])
def test_braid_tail_shows_committed_records_and_waits_for_open_ones(
    tmp_path: Path, include_aborted: bool
) -> None:
    store = LogStore(small_config(tmp_path))
    try:
        txns = PartitionTransactions(store)
        fill(store, txns)  # pid 2's transaction is open at offset 4
        store.flush()
        with LogReader(tmp_path) as reader:
            follower = Follower(reader, TOPIC, last=100, include_aborted=include_aborted)
            aborted = [b"a1", b"a2"] if include_aborted else []
            # Up to the open transaction: the committed one after it waits too.
            assert shown_values(follower) == [*aborted, b"p"]
            assert follower.positions == {0: 4}
            txns.append_marker(TOPIC, 0, marker(2, False), born_ms=0)
            txns.append_data(TOPIC, 0, data(4, b"late"), 1, born_ms=0, client="")
            txns.append_marker(TOPIC, 0, marker(4, True), born_ms=0)
            store.flush()
            # pid 2 aborted: its records are shown only with include_aborted.
            expected = [b"open", b"c", b"open-2", b"late"] if include_aborted else [b"c", b"late"]
            assert shown_values(follower) == expected
    finally:
        store.close()
