"""Idempotent-producer bookkeeping (``gateway.kafka.producers``) without a broker."""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from gateway.kafka.producers import (
    BATCHES_PER_PRODUCER,
    MAX_SEQUENCE,
    PRODUCER_ID_BLOCK,
    ProducerIdAllocator,
    ProducerStates,
    StoredBatch,
    TailBatch,
    in_sequence,
    last_sequence,
)


def states(tail: Iterable[TailBatch] = ()) -> ProducerStates:
    stored = list(tail)
    return ProducerStates(lambda topic, partition: iter(stored))


def store(s: ProducerStates, pid: int, epoch: int, first: int, last: int, offset: int) -> None:
    assert s.check("t", 0, pid, epoch, first, last).error == ErrorCode.none
    s.record("t", 0, pid, epoch, StoredBatch(first, last, offset, 0))


def test_unknown_producer_may_start_anywhere() -> None:
    s = states()
    assert s.check("t", 0, 7, 0, 42, 50).error == ErrorCode.none


def test_duplicates_of_the_last_five_batches() -> None:
    s = states()
    for i in range(BATCHES_PER_PRODUCER + 1):
        store(s, 1, 0, i * 10, i * 10 + 9, i * 100)
    for i in range(1, BATCHES_PER_PRODUCER + 1):
        check = s.check("t", 0, 1, 0, i * 10, i * 10 + 9)
        assert check.duplicate is not None
        assert check.duplicate.base_offset == i * 100
    # The oldest fell out of the window: no longer recognised, and out of sequence.
    assert s.check("t", 0, 1, 0, 0, 9).error == ErrorCode.out_of_order_sequence_number


def test_sequence_and_epoch_rules() -> None:
    s = states()
    store(s, 1, 3, 0, 4, 0)
    assert s.check("t", 0, 1, 3, 6, 6).error == ErrorCode.out_of_order_sequence_number
    assert s.check("t", 0, 1, 3, 5, 5).error == ErrorCode.none
    assert s.check("t", 0, 1, 2, 5, 5).error == ErrorCode.invalid_producer_epoch
    assert s.check("t", 0, 1, 4, 5, 5).error == ErrorCode.out_of_order_sequence_number
    assert s.check("t", 0, 1, 4, 0, 0).error == ErrorCode.none
    # Partitions are independent.
    assert s.check("t", 1, 1, 3, 99, 99).error == ErrorCode.none


def test_sequences_wrap() -> None:
    assert last_sequence(MAX_SEQUENCE - 1, 3) == 1
    assert in_sequence(MAX_SEQUENCE, 0)
    assert not in_sequence(MAX_SEQUENCE, 1)


def test_state_is_rebuilt_from_the_tail_of_the_partition() -> None:
    s = states([(1, 0, 0, 4, 0), (2, 0, 0, 0, 5), (1, 0, 5, 9, 6), (1, 1, 0, 1, 11)])
    # Producer 1 moved to epoch 1: only that epoch's batch is remembered.
    assert s.check("t", 0, 1, 1, 0, 1).duplicate == StoredBatch(0, 1, 11, 0)
    assert s.check("t", 0, 1, 0, 5, 9).error == ErrorCode.invalid_producer_epoch
    assert s.check("t", 0, 2, 0, 0, 0).duplicate == StoredBatch(0, 0, 5, 0)
    assert s.check("t", 0, 2, 0, 1, 3).error == ErrorCode.none


class _Table:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.writes = 0

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)

    async def put(self, key: str, value: bytes) -> int:
        """The durable mark of the write (here: how many writes so far)."""
        self.values[key] = value
        self.writes += 1
        return self.writes

    def items(self):  # type: ignore[no-untyped-def]
        return iter(self.values.items())


async def test_producer_ids_are_reserved_in_durable_blocks() -> None:
    table = _Table()
    allocator = ProducerIdAllocator(table)
    first, reservation = await allocator.next_id()
    assert (first, reservation is not None) == (0, True)
    ids = [await allocator.next_id() for _ in range(PRODUCER_ID_BLOCK)]
    assert [i for i, _ in ids] == list(range(1, PRODUCER_ID_BLOCK + 1))
    assert [r is not None for _, r in ids].count(True) == 1  # the second block
    assert table.writes == 2
    # After a restart, ids continue after everything that may have been handed out.
    restarted = ProducerIdAllocator(table)
    assert (await restarted.next_id())[0] == 2 * PRODUCER_ID_BLOCK
