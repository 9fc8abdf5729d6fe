"""Restart at every step: pending transactions resume, checks stay bounded, commits are visible
exactly once whatever the moment of the crash, and retention keeps pending halves."""

from __future__ import annotations

import pytest

from core.log import LogStore, Record
from core.log import record as rec
from core.transactions import COMMITTED, OPEN, ROLLED_BACK, TransactionService

from .conftest import SMALL_SEGMENT, TIMEOUT_MS, Harness, bodies, crash, small_config


class SimulatedCrash(Exception):
    pass


async def test_pending_transaction_resumes_after_restart_with_its_check_count(harness: Harness):
    calls: list[str] = []

    async def unknown(group: str, txn_id: str, first: Record) -> str:
        calls.append(txn_id)
        return "unknown"

    store, service = harness.open(check_back=unknown, max_checks=3)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a", destinations=[("orders", 0), ("audit", 0)])
    await service.add(txn, "payments", 0, b"b")
    await harness.advance(service, 2 * TIMEOUT_MS)
    assert len(calls) == 2
    await harness.close(store, service)

    store, service = harness.open(check_back=unknown, max_checks=3)
    assert service.metrics["recovered_pending"] == 1
    (pending,) = service.pending()
    assert (pending.txn_id, pending.producer_group, pending.halves, pending.checks) == (
        txn,
        "shop",
        2,
        2,
    )
    assert bodies(store, "orders") == []
    await service.start()
    await harness.advance(service, TIMEOUT_MS - service.sweep_interval_ms)
    assert len(calls) == 2  # the timer restarted with the service
    await harness.advance(service, service.sweep_interval_ms)
    # The third check is the last one (the count survived): then the default, rollback.
    assert calls == [txn, txn, txn]
    assert service.txn_state(txn) == ROLLED_BACK
    await harness.close(store, service)

    store, service = harness.open(check_back=unknown, max_checks=3)
    assert service.pending() == []
    assert service.txn_state(txn) == ROLLED_BACK
    for topic in ("orders", "audit", "payments"):
        assert bodies(store, topic) == []


async def test_check_back_after_restart_commits(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a")
    await service.add(txn, "payments", 0, b"b")
    crash(store)

    async def commit(group: str, txn_id: str, first: Record) -> str:
        return "commit"

    store, service = harness.open(check_back=commit)
    assert [p.txn_id for p in service.pending()] == [txn]
    await service.start()
    await harness.advance(service, TIMEOUT_MS)
    assert service.txn_state(txn) == COMMITTED
    assert bodies(store, "orders") == [b"a"]
    assert bodies(store, "payments") == [b"b"]


def commit_records(store: LogStore) -> list[rec.Record]:
    return [
        record
        for record in store.scan()
        if record.topic == "__transactions" and "commit" in record.tags
    ]


async def test_commit_is_one_frame_that_is_decision_and_link(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a", headers=[("h", b"1")])
    await service.add(txn, "payments", 0, b"b")
    await service.commit(txn)
    (commit,) = commit_records(store)
    assert commit.flags & rec.FLAG_LINK
    assert commit.flags & rec.FLAG_LINK_INDEXED
    assert commit.key == txn.encode()
    assert commit.client == "shop"
    # Replay reads it from __transactions/0, as stored.
    (stored,) = store.read("__transactions", 0, 0, max_records=10)
    assert stored.position == commit.position
    # Readers of the destinations see the halves themselves: the decision's headers (the resume
    # mark) are not laid over theirs.
    (visible,) = store.read("orders", 0, 0, max_records=10)
    assert [name for name, _ in visible.record().headers if not name.startswith("x-braid-")] == [
        "h"
    ]
    assert all(name != "x-braid-txn-resume" for name, _ in visible.record().headers)


async def test_commit_that_never_reached_the_log_leaves_the_transaction_open(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a", destinations=[("orders", 0), ("audit", 0)])
    await service.add(txn, "payments", 0, b"b")

    def die(*args: object, **kwargs: object) -> None:
        raise SimulatedCrash

    monkeypatch.setattr(service.decisions, "append", die)
    with pytest.raises(SimulatedCrash):
        await service.commit(txn)
    crash(store)

    # Nothing was decided in the log: the transaction is open again, invisible, and the
    # producer (or a check-back) decides it once more.
    store, service = harness.open()
    assert [p.txn_id for p in service.pending()] == [txn]
    assert bodies(store, "orders") == []
    await service.commit(txn)
    crash(store)
    for _ in range(2):
        store, service = harness.open()
        assert service.txn_state(txn) == COMMITTED
        assert bodies(store, "orders") == [b"a"]
        assert bodies(store, "audit") == [b"a"]
        assert bodies(store, "payments") == [b"b"]
        crash(store)


async def test_crash_right_after_the_commit_does_not_link_twice(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a")
    await service.add(txn, "payments", 0, b"b")
    await service.commit(txn)
    crash(store)  # recovery replays every frame, the commit's included

    for _ in range(2):
        store, service = harness.open()
        assert service.pending() == []
        assert service.txn_state(txn) == COMMITTED
        assert bodies(store, "orders") == [b"a"]
        assert bodies(store, "payments") == [b"b"]
        crash(store)


def tear(store: LogStore, record: rec.Record) -> None:
    """The frame's last bytes never reached the disk: its CRC fails, recovery erases it."""
    segment = store.commitlog.segments[record.position // SMALL_SEGMENT]
    offset = record.position % SMALL_SEGMENT
    segment.buf[offset + record.size - 4 : offset + record.size] = bytes(4)


async def test_torn_commit_at_the_tail_leaves_the_transaction_open(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a")
    await service.add(txn, "payments", 0, b"b")
    await service.commit(txn)
    (commit,) = commit_records(store)
    tear(store, commit)
    crash(store)

    # The decision and the LINK were one frame: both are gone, nothing half-visible.
    store, service = harness.open()
    assert store.recovery.truncated_bytes > 0
    assert [p.txn_id for p in service.pending()] == [txn]
    assert bodies(store, "orders") == []
    assert bodies(store, "payments") == []
    await service.rollback(txn)
    await harness.close(store, service)
    store, service = harness.open()
    assert service.txn_state(txn) == ROLLED_BACK
    assert bodies(store, "orders") == []


async def test_decided_transactions_are_not_replayed(harness: Harness):
    store, service = harness.open()
    old = service.begin("shop")
    await service.add(old, "orders", 0, b"old")
    for n in range(20):
        txn = service.begin("shop")
        await service.add(txn, "orders", 0, f"r{n}".encode())
        await service.commit(txn)
    await harness.close(store, service)
    store, service = harness.open()
    # One transaction is still open: replay starts at its half.
    assert service.replay.halves_read == 21
    await service.rollback(old)
    await harness.close(store, service)
    store, service = harness.open()
    assert service.replay.halves_read == 0
    assert len(bodies(store, "orders")) == 20


async def test_reused_transaction_id_replays_in_log_order(harness: Harness):
    store, service = harness.open()
    service.begin("g", "t-1")
    await service.add("t-1", "orders", 0, b"first")
    await service.rollback("t-1")
    service.begin("g", "t-1")
    await service.add("t-1", "orders", 0, b"second")
    crash(store)
    store, service = harness.open()
    (pending,) = service.pending()
    assert (pending.txn_id, pending.halves) == ("t-1", 1)
    await service.commit("t-1")
    assert bodies(store, "orders") == [b"second"]


async def test_retention_keeps_segments_with_pending_halves(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    position = await service.add(txn, "orders", 0, b"pending")
    committed = service.begin("shop")
    await service.add(committed, "orders", 0, b"kept-visible")
    await service.commit(committed)
    for _ in range(300):
        store.append("filler", 0, b"y" * 1000)
    assert len(store.commitlog.segments) > 4
    assert service.owes_segment(0, SMALL_SEGMENT)
    assert not service.owes_segment(0, position)
    store.config.retention_bytes = 2 * SMALL_SEGMENT
    assert store.enforce_retention() == []
    assert store.commitlog.start_position == 0

    await service.commit(txn)
    assert not service.owes_segment(0, SMALL_SEGMENT)
    assert store.enforce_retention()
    assert store.commitlog.start_position > position
    await harness.close(store, service)
    store, service = harness.open()
    assert service.pending() == []


async def test_async_durability_store(tmp_path):
    store = LogStore(small_config(tmp_path / "a", durability="async", flush_interval_ms=10))
    await store.start()
    service = TransactionService(store)
    txn = service.begin("g")
    await service.add(txn, "orders", 0, b"a")
    assert service.txn_state(txn) == OPEN
    await service.commit(txn)
    assert bodies(store, "orders") == [b"a"]
    assert service.txn_state(txn) == COMMITTED
    assert service.txn_state("never") is None
    await service.aclose()
    await store.aclose()
