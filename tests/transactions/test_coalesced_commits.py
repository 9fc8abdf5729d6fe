"""Commits of one event-loop turn are written as one frame: visible together, decided each one
at restart, and safe against a crash between the decision and the frame."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from core.log import LogStore
from core.log import record as rec
from core.log.tags import TagFilter
from core.transactions import COMMITTED, OPEN, ROLLED_BACK, TransactionService
from core.transactions.layout import TXN_IDS_HEADER, decode_txn_ids

from ..log_images import copy_image
from .conftest import Harness, bodies, crash, small_config


def commit_frames(store: LogStore) -> list[rec.Record]:
    return [
        record
        for record in store.scan()
        if record.topic == "__transactions" and "commit" in record.tags
    ]


def run_to_first_wait(call: Coroutine[Any, Any, None]) -> None:
    """Run a service call up to its first wait, synchronously (nothing else runs meanwhile)."""
    call.send(None)


def open_image(image: Path) -> tuple[LogStore, TransactionService]:
    store = LogStore(small_config(image))
    return store, TransactionService(store)


async def test_commits_of_one_turn_share_one_frame_and_replay_each(harness: Harness):
    store, service = harness.open()
    before = service.begin("shop")
    await service.add(before, "orders", 0, b"before")
    await service.commit(before)
    still_open = service.begin("shop")
    await service.add(still_open, "orders", 0, b"open")
    txns = [service.begin("shop") for _ in range(3)]
    await service.add(txns[0], "orders", 0, b"a", destinations=[("orders", 0), ("audit", 0)])
    await service.add(txns[1], "payments", 1, b"b")
    await service.add(txns[2], "orders", 0, b"c1")
    await service.add(txns[2], "orders", 0, b"c2", tags=["TagA"])

    frames_before = service.metrics["commit_frames"]
    await asyncio.gather(*(service.commit(txn) for txn in txns))
    assert service.metrics["commit_frames"] == frames_before + 1
    assert service.metrics["committed"] == 4

    single, coalesced = commit_frames(store)
    assert single.key == before.encode()
    assert coalesced.key == b""
    assert coalesced.flags & rec.FLAG_LINK_INDEXED
    ids = [value for name, value in coalesced.headers if name == TXN_IDS_HEADER]
    assert [decode_txn_ids(value) for value in ids] == [tuple(txns)]
    assert len(rec.decode_link_body(coalesced.body or b"")) == 4
    assert [service.txn_state(txn) for txn in txns] == [COMMITTED] * 3
    assert bodies(store, "orders") == [b"before", b"a", b"c1", b"c2"]
    assert bodies(store, "audit") == [b"a"]
    assert bodies(store, "payments", 1) == [b"b"]
    tagged = store.read("orders", 0, 0, max_records=10, tag_filter=TagFilter(["TagA"]))
    assert [bytes(r.body) for r in tagged] == [b"c2"]

    crash(store)
    store, service = harness.open()
    assert [pending.txn_id for pending in service.pending()] == [still_open]
    assert [service.txn_state(txn) for txn in txns] == [COMMITTED] * 3
    assert bodies(store, "orders") == [b"before", b"a", b"c1", b"c2"]


async def test_a_held_back_commit_stays_in_the_resume_mark(harness: Harness, tmp_path: Path):
    store, service = harness.open()
    held = service.begin("shop")
    await service.add(held, "orders", 0, b"held")
    other = service.begin("shop")
    await service.add(other, "orders", 0, b"other")
    # The commit is decided, its frame waits for the end of the turn ...
    commit = service.commit(held)
    run_to_first_wait(commit)
    assert service.txn_state(held) == COMMITTED
    # ... when another decision is written, with a resume mark for replay to start from.
    rollback = service.rollback(other)
    run_to_first_wait(rollback)
    copy_image(store.data_dir, tmp_path / "image")  # what kill -9 would leave now
    commit.close()
    rollback.close()

    image_store, image_service = open_image(tmp_path / "image")
    try:
        # The mark still counts the held transaction: it is open again, not lost.
        assert [pending.txn_id for pending in image_service.pending()] == [held]
        assert image_service.txn_state(other) == ROLLED_BACK
        assert bodies(image_store, "orders") == []
        await image_service.commit(held)
        assert bodies(image_store, "orders") == [b"held"]
    finally:
        await image_service.aclose()
        await image_store.aclose()


async def test_reusing_an_id_writes_its_held_back_commit_first(harness: Harness, tmp_path: Path):
    store, service = harness.open()
    service.begin("g", "t-1")
    await service.add("t-1", "orders", 0, b"first")
    commit = service.commit("t-1")
    run_to_first_wait(commit)
    service.begin("g", "t-1")
    service.add_nowait("t-1", "orders", 0, b"second")
    copy_image(store.data_dir, tmp_path / "image")
    commit.close()

    image_store, image_service = open_image(tmp_path / "image")
    try:
        # The first commit precedes the second transaction's half in the log.
        assert bodies(image_store, "orders") == [b"first"]
        (pending,) = image_service.pending()
        assert (pending.txn_id, pending.halves) == ("t-1", 1)
        await image_service.commit("t-1")
        assert bodies(image_store, "orders") == [b"first", b"second"]
    finally:
        await image_service.aclose()
        await image_store.aclose()


async def test_recovered_and_new_transactions_commit_together(harness: Harness):
    store, service = harness.open()
    recovered = service.begin("shop")
    await service.add(recovered, "orders", 0, b"old", tags=["TagB"])
    crash(store)

    store, service = harness.open()
    assert service.txn_state(recovered) == OPEN
    new = service.begin("shop")
    await service.add(new, "orders", 0, b"new")
    await asyncio.gather(service.commit(recovered), service.commit(new))
    assert len(commit_frames(store)) == 1
    assert bodies(store, "orders") == [b"old", b"new"]
    # The recovered half is indexed from its own frame (its tags).
    tagged = store.read("orders", 0, 0, max_records=10, tag_filter=TagFilter(["TagB"]))
    assert [bytes(r.body) for r in tagged] == [b"old"]


async def test_one_way_commits_return_at_once_and_are_written_when_the_turn_ends(
    harness: Harness,
):
    store, service = harness.open()
    txns = [service.begin("shop") for _ in range(5)]
    for n, txn in enumerate(txns):
        await service.add(txn, "orders", 0, f"r{n}".encode())
    for txn in txns:
        await service.commit(txn, durable=False)  # does not suspend: all in this turn
    assert [service.txn_state(txn) for txn in txns] == [COMMITTED] * 5
    assert bodies(store, "orders") == []
    await asyncio.sleep(0)
    # Appended (visible) as one frame, before any fsync.
    assert bodies(store, "orders") == [f"r{n}".encode() for n in range(5)]
    assert len(commit_frames(store)) == 1


async def test_a_failed_commit_frame_fails_every_commit_in_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    store, service = harness.open()
    txns = [service.begin("shop") for _ in range(3)]
    for txn in txns:
        await service.add(txn, "orders", 0, txn.encode())

    monkeypatch.setattr(service.decisions, "append", disk_full)
    outcomes = await asyncio.gather(
        service.commit(txns[0], durable=False),
        service.commit(txns[1]),
        service.commit(txns[2], durable=False),
        return_exceptions=True,
    )
    # The durable commit fails; the one-way ones returned at once (the failure is logged).
    assert [type(outcome) for outcome in outcomes] == [type(None), OSError, type(None)]
    assert "writing 3 commits failed" in caplog.text
    # Nothing was decided: open again, invisible, and counted in the resume mark.
    assert [service.txn_state(txn) for txn in txns] == [OPEN] * 3
    assert sorted(pending.txn_id for pending in service.pending()) == sorted(txns)
    assert service.metrics["committed"] == 0
    assert bodies(store, "orders") == []
    crash(store)
    store, service = harness.open()
    assert sorted(pending.txn_id for pending in service.pending()) == sorted(txns)
    assert bodies(store, "orders") == []
    # Once the log takes appends again, the producer's retry commits them.
    await asyncio.gather(*(service.commit(txn) for txn in txns))
    assert bodies(store, "orders") == [txn.encode() for txn in txns]


async def test_a_failed_rollback_leaves_the_transaction_open(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
):
    store, service = harness.open()
    failing = service.begin("shop")
    await service.add(failing, "orders", 0, b"failing")
    later = service.begin("shop")
    await service.add(later, "orders", 0, b"later")
    with monkeypatch.context() as patched:
        patched.setattr(store, "append", disk_full)
        with pytest.raises(OSError, match="No space left"):
            await service.rollback(failing)
    assert service.txn_state(failing) == OPEN
    # The next decision's resume mark still counts it: after a crash it is open, not lost.
    await service.commit(later)
    crash(store)
    store, service = harness.open()
    assert [pending.txn_id for pending in service.pending()] == [failing]
    assert bodies(store, "orders") == [b"later"]


def disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")
