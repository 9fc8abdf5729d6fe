"""Half messages by convention (core/transactions/control.py) through a real Node and LogStore:
header ``x-braid-txn-id`` stores a half, a record to ``braid.txn`` decides it, a check request
goes to ``braid.txn.check``; restart keeps pending halves and their check-backs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from core.broker import BrokerConfig, Node
from core.broker.topics import TopicError
from core.log import LogConfig, LogStore
from core.transactions.control import (
    CHECK_TOPIC,
    RESULT_HEADER,
    TXN_TOPIC,
    batch_half_mark,
    half_mark,
    parse_outcome,
)


def open_broker(data_dir: Path, **config: object) -> Node:
    store = LogStore(
        LogConfig(data_dir, segment_size=256 * 1024, index_entries_per_file=256, retention_ms=None)
    )
    return Node(store, BrokerConfig(**config))  # type: ignore[arg-type]


async def close_broker(broker: Node) -> None:
    await broker.close()
    await broker.shard.store.aclose()


def bodies(broker: Node, topic: str, queue: int = 0) -> list[bytes]:
    read = broker.shard.store.read(topic, queue, 0, max_records=1000)
    return [bytes(r.record().body or b"") for r in read]


def headers_of(broker: Node, topic: str) -> list[dict[str, bytes]]:
    read = broker.shard.store.read(topic, 0, 0, max_records=1000)
    return [dict(r.record().headers) for r in read]


def half(txn: str, group: str = "shop", **extra: str) -> list[tuple[str, bytes]]:
    headers = [("x-braid-txn-id", txn.encode()), ("x-braid-producer-group", group.encode())]
    return headers + [(name.replace("_", "-"), value.encode()) for name, value in extra.items()]


@pytest.fixture
async def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    opened = open_broker(tmp_path / "data", txn_check_timeout_ms=60_000)
    await opened.start()
    yield opened
    if not opened.shard.store.closed:
        await close_broker(opened)


async def test_half_is_invisible_until_committed_with_its_routes(broker: Node) -> None:
    await broker.declare_topic("orders")
    await broker.declare_topic("audit")
    await broker.bind("orders", "topic", "eu.*", ("audit", 0))
    result = await broker.publish("orders", b"o-1", subject="eu.paris", headers=half("t1"))
    assert result.half
    assert result.offset == -1
    assert bodies(broker, "orders") == []
    assert bodies(broker, "audit") == []
    # a second half from "another connection" joins the transaction
    await broker.publish("orders", b"o-2", subject="us.nyc", headers=half("t1"))
    done = await broker.publish(TXN_TOPIC, b"commit", subject="t1")
    assert done.refused == []
    assert bodies(broker, "orders") == [b"o-1", b"o-2"]
    assert bodies(broker, "audit") == [b"o-1"]
    stored = broker.shard.store.read("orders", 0, 0, max_records=10)[0].record()
    names = [name for name, _ in stored.headers]
    assert "x-braid-txn-id" not in names  # the request headers are not stored
    assert dict(stored.headers)["x-braid-txn"] == b"half:t1"
    # the outcome record is stored, with what happened
    assert headers_of(broker, TXN_TOPIC)[-1][RESULT_HEADER] == b"committed"
    assert broker.shard.transactions.txn_state("half:t1") == "committed"


async def test_rollback_and_errors(broker: Node) -> None:
    await broker.declare_topic("orders")
    await broker.publish("orders", b"gone", headers=half("t2"))
    rolled = await broker.publish(TXN_TOPIC, b"ROLLBACK_MESSAGE", subject="t2")
    assert rolled.refused == []
    assert bodies(broker, "orders") == []
    again = await broker.publish(TXN_TOPIC, b"commit", subject="t2")
    assert again.refused == [(TXN_TOPIC, 0)]  # rolled back: a commit is refused
    unknown = await broker.publish(TXN_TOPIC, b"commit", subject="nope")
    assert unknown.refused == [(TXN_TOPIC, 0)]
    garbage = await broker.publish(TXN_TOPIC, b"maybe", subject="t2")
    assert garbage.refused == [(TXN_TOPIC, 0)]
    results = [h[RESULT_HEADER] for h in headers_of(broker, TXN_TOPIC)]
    assert results[0] == b"rolled_back"
    assert all(r.startswith(b"error: ") for r in results[1:])
    # the id may also come from the header (ids with dots from MQTT)
    await broker.publish("orders", b"kept", headers=half("a.b"))
    ok = await broker.publish(TXN_TOPIC, b"commit", headers=[("x-braid-txn-id", b"a.b")])
    assert ok.refused == []
    assert bodies(broker, "orders") == [b"kept"]
    # a Kafka, AMQP or service transaction id is out of reach
    own = broker.shard.transactions.begin("amqp-tx")
    await broker.shard.transactions.add(own, "orders", 0, b"theirs")
    refused = await broker.publish(TXN_TOPIC, b"commit", subject=own)
    assert refused.refused == [(TXN_TOPIC, 0)]
    assert broker.shard.transactions.txn_state(own) == "open"


def test_half_mark_parsing() -> None:
    assert half_mark([("a", b"1")]) is None
    mark = half_mark([("x-braid-txn-id", b" t "), ("x-braid-txn-timeout-ms", b"250")])
    assert mark is not None
    assert (mark.txn_id, mark.producer_group, mark.timeout_ms) == ("t", "default", 250.0)
    with pytest.raises(TopicError):
        half_mark([("x-braid-txn-id", b"")])
    with pytest.raises(TopicError):
        half_mark([("x-braid-txn-id", b"t"), ("x-braid-txn-timeout-ms", b"soon")])
    assert parse_outcome(b" Commit\n") == "commit"
    assert parse_outcome(b"UNKNOW") == "unknown"
    assert parse_outcome(None) is None


def test_batch_half_mark_reads_kafka_batches() -> None:
    from aiokafka.record.default_records import (  # type: ignore[import-untyped]
        DefaultRecordBatchBuilder,
    )

    def batch(*headers: list[tuple[str, bytes]], codec: int = 0) -> bytes:
        builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
        for offset, record_headers in enumerate(headers):
            builder.append(offset, 0, b"k", b"v", record_headers)
        return bytes(builder.build())

    assert batch_half_mark(batch([], [("x", b"1")])) is None
    mark = batch_half_mark(batch([], half("kt", "g")))
    assert mark is not None
    assert (mark.txn_id, mark.producer_group) == ("kt", "g")
    # compressed batches are not searched (documented: stored as plain batches)
    assert batch_half_mark(batch(half("kt", "g"), codec=1)) is None


async def test_check_back_answered_unknown_then_commit(tmp_path: Path) -> None:
    broker = open_broker(
        tmp_path / "data",
        txn_check_timeout_ms=100,
        txn_max_checks=5,
        txn_check_call_timeout_ms=2000,
    )
    await broker.start()
    try:
        await broker.declare_topic("orders")
        headers = half("t3", "shop", app="yes")
        await broker.publish("orders", b"pay", subject="eu", headers=headers)
        checks = await wait_records(broker, CHECK_TOPIC, 1)
        request = checks[0]
        assert request.subject == "shop"
        assert request.body == b"pay"
        assert dict(request.headers)["x-braid-correlation-id"] == b"t3"
        assert dict(request.headers)["x-braid-txn-id"] == b"t3"
        assert dict(request.headers)["app"] == b"yes"
        # "unknown" answers the running check: it ends at once and the next one comes later
        await broker.publish(TXN_TOPIC, b"unknown", subject="t3")
        await wait_records(broker, CHECK_TOPIC, 2)
        assert broker.shard.transactions.metrics["checks_unknown"] >= 1
        assert bodies(broker, "orders") == []
        await broker.publish(TXN_TOPIC, b"commit", subject="t3")
        assert bodies(broker, "orders") == [b"pay"]
        assert broker.shard.half_messages.metrics["check_answers"] >= 2
    finally:
        await close_broker(broker)


async def test_unanswered_checks_end_in_rollback(tmp_path: Path) -> None:
    broker = open_broker(
        tmp_path / "data", txn_check_timeout_ms=50, txn_max_checks=2, txn_check_call_timeout_ms=50
    )
    await broker.start()
    try:
        await broker.publish("orders", b"never", headers=half("t4"))
        await wait_until(lambda: broker.shard.transactions.txn_state("half:t4") != "open")
        assert broker.shard.transactions.txn_state("half:t4") == "rolled_back"
        assert len(bodies(broker, CHECK_TOPIC)) == 2
        assert bodies(broker, "orders") == []
    finally:
        await close_broker(broker)


async def test_pending_half_survives_restart_and_is_checked_again(tmp_path: Path) -> None:
    broker = open_broker(tmp_path / "data", txn_check_timeout_ms=60_000)
    await broker.start()
    await broker.publish("orders", b"later", headers=half("t5", "shop"))
    await broker.publish("orders", b"checked", headers=half("t6", "shop"))
    await close_broker(broker)

    broker = open_broker(tmp_path / "data", txn_check_timeout_ms=100)
    await broker.start()
    try:
        await broker.publish(TXN_TOPIC, b"commit", subject="t5")
        assert bodies(broker, "orders") == [b"later"]
        checks = await wait_records(broker, CHECK_TOPIC, 1)
        assert dict(checks[0].headers)["x-braid-txn-id"] == b"t6"
        await broker.publish(TXN_TOPIC, b"commit", subject="t6")
        assert bodies(broker, "orders") == [b"later", b"checked"]
    finally:
        await close_broker(broker)


async def wait_until(condition: Callable[[], bool], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def wait_records(broker: Node, topic: str, count: int):  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        while True:
            found = broker.shard.store.read(topic, 0, 0, max_records=1000)
            if len(found) >= count:
                return [r.record() for r in found]
            await asyncio.sleep(0.02)
