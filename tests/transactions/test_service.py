"""Commit, rollback and visibility: a transaction's records appear together, once, or never."""

from __future__ import annotations

import pytest

from core.log import LogReader, LogStore, names
from core.log import record as rec
from core.transactions import (
    COMMITTED,
    OPEN,
    PRODUCER_GROUP_HEADER,
    ROLLED_BACK,
    TXN_HEADER,
    TransactionError,
    TransactionService,
    user_headers,
)

from .conftest import Harness, bodies


def link_frames(store: LogStore) -> list[rec.Record]:
    return [record for record in store.scan() if record.flags & rec.FLAG_LINK]


async def test_commit_makes_a_multi_topic_transaction_visible_at_once(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(
        txn,
        "orders",
        0,
        b"order-1",
        key=b"k1",
        headers=[("h", b"v")],
        tags=["new"],
        destinations=[("orders", 0), ("audit", 0)],
        protocol=rec.PROTOCOL_AMQP,
        client="c1",
        address="orders/new",
    )
    await service.add(txn, "payments", 1, b"pay-1")
    await service.add(txn, "orders", 0, b"order-2")
    for topic, queue in (("orders", 0), ("audit", 0), ("payments", 1)):
        assert bodies(store, topic, queue) == []
    assert service.txn_state(txn) == OPEN
    links_before = len(link_frames(store))

    await service.commit(txn)

    assert bodies(store, "orders") == [b"order-1", b"order-2"]
    assert bodies(store, "audit") == [b"order-1"]
    assert bodies(store, "payments", 1) == [b"pay-1"]
    # One LINK frame made all four index entries: they carry its one store time.
    assert len(link_frames(store)) == links_before + 1
    entries = [
        entry
        for topic, queue in (("orders", 0), ("audit", 0), ("payments", 1))
        for entry in store.read(topic, queue, 0)
    ]
    assert len({entry.store_ms for entry in entries}) == 1
    first = store.read("orders", 0, 0)[0].record()
    assert first.key == b"k1"
    assert first.tags == ["new"]
    assert first.protocol == rec.PROTOCOL_AMQP
    assert (first.client, first.address) == ("c1", "orders/new")
    assert user_headers(first.headers) == [("h", b"v")]
    assert (TXN_HEADER, txn.encode()) in first.headers
    assert (PRODUCER_GROUP_HEADER, b"shop") in first.headers
    assert service.txn_state(txn) == COMMITTED
    assert service.metrics["committed"] == 1
    assert service.metrics["pending"] == 0
    assert service.pending() == []


async def test_rollback_leaves_nothing_visible_even_after_reopen(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a", destinations=[("orders", 0), ("audit", 0)])
    await service.add(txn, "payments", 0, b"b")
    await service.rollback(txn)
    assert service.txn_state(txn) == ROLLED_BACK
    assert service.metrics["rolled_back"] == 1
    for topic in ("orders", "audit", "payments"):
        assert bodies(store, topic) == []
    await harness.close(store, service)

    store, service = harness.open()
    assert service.pending() == []
    assert service.txn_state(txn) == ROLLED_BACK
    for topic in ("orders", "audit", "payments"):
        assert bodies(store, topic) == []
    # The halves are still in the log, only in __half.
    assert bodies(store, names.HALF_TOPIC) == [b"a", b"b"]


async def test_pending_records_are_invisible_to_another_reader(harness: Harness):
    store, service = harness.open()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"pending", destinations=[("orders", 0), ("audit", 0)])
    store.append("orders", 0, b"plain")
    store.flush()
    with LogReader(harness.data_dir) as reader:
        assert bodies(reader, "orders") == [b"plain"]
        assert bodies(reader, "audit") == []
        assert ("audit", 0) not in reader.queues()
        assert bodies(reader, names.HALF_TOPIC) == [b"pending"]
        await service.commit(txn)
        reader.refresh()
        assert bodies(reader, "orders") == [b"plain", b"pending"]
        assert bodies(reader, "audit") == [b"pending"]


async def test_kafka_batch_half_takes_its_record_count_of_offsets(harness: Harness):
    store, service = harness.open()
    txn = service.begin("kafka-producer")
    await service.add(
        txn,
        "k",
        0,
        b"\x00" * 61,
        flags=rec.FLAG_BATCH,
        record_count=3,
        protocol=rec.PROTOCOL_KAFKA,
    )
    await service.add(txn, "k", 0, b"\x00" * 61, flags=rec.FLAG_BATCH, record_count=2)
    await service.commit(txn)
    assert store.queue_bounds("k", 0) == (0, 5)
    assert [r.offset for r in store.read("k", 0, 0)] == [0, 3]


async def test_state_errors_and_idempotent_decisions(harness: Harness):
    store, service = harness.open()
    with pytest.raises(TransactionError, match="unknown"):
        await service.add("nope", "t", 0, b"x")
    txn = service.begin("g", "my-txn")
    with pytest.raises(TransactionError, match="already open"):
        service.begin("g", "my-txn")
    with pytest.raises(ValueError, match="FLAG_BATCH"):
        await service.add(txn, "t", 0, b"x", flags=rec.FLAG_LINK)
    await service.add(txn, "t", 0, b"x")
    await service.commit(txn)
    await service.commit(txn)  # again: nothing happens
    assert bodies(store, "t") == [b"x"]
    with pytest.raises(TransactionError, match="already committed"):
        await service.add(txn, "t", 0, b"y")
    with pytest.raises(TransactionError, match="already committed"):
        await service.rollback(txn)
    other = service.begin("g")
    await service.rollback(other)
    await service.rollback(other)
    with pytest.raises(TransactionError, match="already rolled back"):
        await service.commit(other)
    # A decided id may be reused: a new transaction.
    assert service.begin("g", "my-txn") == "my-txn"
    await service.add("my-txn", "t", 0, b"z")
    assert service.txn_state("my-txn") == OPEN
    await service.commit("my-txn")
    assert bodies(store, "t") == [b"x", b"z"]


async def test_empty_transaction_commits_and_writes_nothing(harness: Harness):
    store, service = harness.open()
    end = store.commitlog.write_position
    txn = service.begin("g")
    await service.commit(txn)
    assert service.txn_state(txn) == COMMITTED
    assert store.commitlog.write_position == end


async def test_pending_lists_open_transactions(harness: Harness):
    _store, service = harness.open()
    first = service.begin("g1")
    second = service.begin("g2", timeout_ms=60_000)
    position = await service.add(second, "t", 0, b"x")
    await service.add(second, "t", 0, b"y")
    listed = {p.txn_id: p for p in service.pending()}
    assert listed[first].halves == 0
    assert listed[first].first_position is None
    assert listed[second].producer_group == "g2"
    assert listed[second].halves == 2
    assert listed[second].first_position == position
    assert service.metrics["pending"] == 2
    assert isinstance(service, TransactionService)
