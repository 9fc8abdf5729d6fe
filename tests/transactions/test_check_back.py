"""Check-back: an outcome left unknown is asked of the producer, a bounded number of times."""

from __future__ import annotations

import asyncio

from core.log import Record, names
from core.transactions import COMMITTED, OPEN, ROLLED_BACK

from .conftest import TIMEOUT_MS, Harness, bodies


class Producer:
    """A check-back callback answering from a script; records every call."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, str, bytes | None]] = []

    async def __call__(self, producer_group: str, txn_id: str, first: Record) -> str:
        self.calls.append((producer_group, txn_id, first.body))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "raise":
            raise ConnectionError("producer gone")
        if answer == "hang":
            await asyncio.sleep(3600)
        return answer


def op_kinds(store) -> list[tuple[str, str]]:
    return [
        (r.record().tags[0], r.record().key.decode())
        for r in store.read(names.TRANSACTIONS_TOPIC, 0, 0, max_records=10_000)
    ]


async def test_check_back_commit(harness: Harness):
    producer = Producer("commit")
    store, service = harness.open(check_back=producer)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"first")
    await service.add(txn, "orders", 1, b"second")
    await harness.advance(service, TIMEOUT_MS - service.sweep_interval_ms)
    assert producer.calls == []
    await harness.advance(service, service.sweep_interval_ms)
    assert producer.calls == [("shop", txn, b"first")]
    assert service.txn_state(txn) == COMMITTED
    assert bodies(store, "orders", 0) == [b"first"]
    assert bodies(store, "orders", 1) == [b"second"]
    assert op_kinds(store) == [("check", txn), ("commit", txn)]
    assert service.metrics["checks"] == 1


async def test_check_back_rollback(harness: Harness):
    producer = Producer("rollback")
    store, service = harness.open(check_back=producer)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"x")
    await harness.advance(service, TIMEOUT_MS)
    assert service.txn_state(txn) == ROLLED_BACK
    assert bodies(store, "orders") == []
    assert len(producer.calls) == 1


async def test_unknown_answers_then_the_default_after_max_checks(harness: Harness):
    producer = Producer("unknown", "raise", "hang", "UNKNOW")
    _store, service = harness.open(check_back=producer, max_checks=4, check_call_timeout_ms=20)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"x")
    for checks in range(1, 4):
        await harness.advance(service, TIMEOUT_MS)
        assert len(producer.calls) == checks
        assert service.txn_state(txn) == OPEN
        assert service.pending()[0].checks == checks
    await harness.advance(service, TIMEOUT_MS)
    assert len(producer.calls) == 4
    assert service.txn_state(txn) == ROLLED_BACK
    assert service.metrics["checks"] == 4
    assert service.metrics["checks_unknown"] == 4
    assert service.metrics["checks_failed"] == 2  # raised, timed out
    assert service.metrics["default_outcomes"] == 1
    await harness.advance(service, 5 * TIMEOUT_MS)
    assert len(producer.calls) == 4


async def test_default_outcome_commit(harness: Harness):
    store, service = harness.open(
        check_back=Producer("unknown"), max_checks=1, default_outcome="commit"
    )
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"x")
    await harness.advance(service, TIMEOUT_MS)
    assert service.txn_state(txn) == COMMITTED
    assert bodies(store, "orders") == [b"x"]


async def test_group_without_check_back_gets_the_default_at_its_timeout(harness: Harness):
    producer = Producer("commit")
    store, service = harness.open(check_back=producer)
    service.set_check_back("kafka", None)  # a Kafka transactional producer: never asked
    await service.start()
    txn = service.begin("kafka", timeout_ms=3 * TIMEOUT_MS)
    await service.add(txn, "k", 0, b"x")
    await harness.advance(service, 2 * TIMEOUT_MS)
    assert service.txn_state(txn) == OPEN
    await harness.advance(service, TIMEOUT_MS)
    assert service.txn_state(txn) == ROLLED_BACK
    assert producer.calls == []
    assert bodies(store, "k") == []


async def test_adding_a_half_postpones_the_check(harness: Harness):
    producer = Producer("commit")
    store, service = harness.open(check_back=producer)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"a")
    await harness.advance(service, TIMEOUT_MS * 3 / 4)
    await service.add(txn, "orders", 0, b"b")
    await harness.advance(service, TIMEOUT_MS * 3 / 4)
    assert producer.calls == []
    await harness.advance(service, TIMEOUT_MS / 4)
    assert len(producer.calls) == 1
    assert bodies(store, "orders") == [b"a", b"b"]


async def test_producer_commit_during_a_check_wins(harness: Harness):
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(group: str, txn_id: str, first: Record) -> str:
        started.set()
        await release.wait()
        return "rollback"

    store, service = harness.open(check_back=slow)
    await service.start()
    txn = service.begin("shop")
    await service.add(txn, "orders", 0, b"x")
    harness.clock.advance(TIMEOUT_MS)
    await started.wait()
    assert service.pending()[0].checking
    await service.commit(txn)
    release.set()
    await service.settle()
    assert service.txn_state(txn) == COMMITTED
    assert bodies(store, "orders") == [b"x"]


async def test_begun_transaction_without_halves_expires_silently(harness: Harness):
    producer = Producer("commit")
    store, service = harness.open(check_back=producer)
    await service.start()
    end = store.commitlog.write_position
    txn = service.begin("shop")
    await harness.advance(service, TIMEOUT_MS)
    assert service.txn_state(txn) == ROLLED_BACK
    assert producer.calls == []
    assert store.commitlog.write_position == end
