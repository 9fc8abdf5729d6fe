"""Parity of every fast write path with its reference (core/log/frames.py, index_writer.py,
core/transactions/decisions.py).

Two stores take the same operations at the same pinned clock: one with its fast paths (plain
records and batches encoded in place from shared heads, half messages, a transaction's decision
frame, a LINK whose targets' index fields the caller knows), one with ``fast_paths=False``, where
every frame goes through the reference encoder (``encode_record_parts``) and every index entry
through the general dispatch. Their commit logs and index files must be byte-identical, and so
must what each call returned and what the index listeners heard. Then both crash, the log is
torn at the same byte (a frame cut in the middle, everything after it lost), and recovery must
bring both back to the same bytes again, each queue a prefix of what it held before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.log import LogReader, LogStore, names
from core.log import frames as frames_module
from core.log import record as rec
from core.log.recovery import RecoveryReport
from core.transactions.decisions import DecisionWriter, LinkDecision, TargetIndex

from .conftest import small_config

SEGMENT = 128 * 1024
HALF_HEADERS = rec.encode_headers([("x-braid-txn", b"t" * 19)])


class PinnedClock:
    """The frame writer's clock (``core.log.frames.clock_ns``), moved only by the test."""

    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.ms * 1_000_000 + 123_456  # a fraction of a millisecond, as a real clock


@pytest.fixture
def pinned_clock(monkeypatch: pytest.MonkeyPatch) -> PinnedClock:
    clock = PinnedClock()
    monkeypatch.setattr(frames_module, "clock_ns", clock)
    return clock


queues = st.integers(0, 2)
keys = st.sampled_from([b"", b"k", b"key-" * 9])
protocols = st.sampled_from([rec.PROTOCOL_INTERNAL, rec.PROTOCOL_AMQP, rec.PROTOCOL_MQTT])
bodies = st.one_of(st.binary(max_size=300), st.binary(min_size=1000, max_size=3000))
batches = st.one_of(  # of any sizes, or all of one size (write_many's uniform path)
    st.lists(st.binary(max_size=2500), min_size=1, max_size=30),
    st.integers(0, 2200).flatmap(
        lambda size: st.lists(st.binary(min_size=size, max_size=size), min_size=2, max_size=30)
    ),
)
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("plain"),
            queues,
            bodies,
            keys,
            protocols,
            st.sampled_from([0, 1_600_000_000_000]),  # born_ms
            st.booleans(),  # body as a view of a larger buffer
        ),
        st.tuples(st.just("many"), queues, batches, keys, protocols, st.booleans()),
        st.tuples(st.just("half"), queues, bodies, keys, st.sampled_from([b"", HALF_HEADERS])),
        st.tuples(st.just("tagged"), queues, bodies, st.sampled_from([("a",), ("a", "b")])),
        st.tuples(
            st.just("commit"),
            st.integers(1, 3),  # halves it decides
            st.sampled_from(["g", "producer-group-" * 3]),
            st.booleans(),  # known targets given, or read back from the frames
            st.booleans(),  # into explicit destinations, or each half's own
        ),
        st.tuples(st.just("link_known"), st.integers(1, 3)),
        st.tuples(st.just("tick"), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=30,
)


def run(store: LogStore, clock: PinnedClock, ops: list[tuple[Any, ...]]) -> list[object]:
    """Apply ``ops`` to ``store``; what each call returned, and what the listeners heard."""
    heard: list[object] = []
    store.index_listeners.append(lambda *entry: heard.append(entry))
    decisions = DecisionWriter(store)
    results: list[object] = []
    open_halves: list[tuple[int, int, TargetIndex]] = []
    plain_records: list[tuple[int, int]] = []
    for number, op in enumerate(ops):
        kind = op[0]
        if kind == "tick":
            clock.ms += op[1]
            continue
        if kind == "plain":
            _, queue, body, key, protocol, born_ms, as_view = op
            data = memoryview(b"!" + body)[1:] if as_view else body
            appended = store.append("p", queue, data, key=key, protocol=protocol, born_ms=born_ms)
            plain_records.append((appended.position, appended.end - appended.position))
        elif kind == "many":
            _, queue, batch, key, protocol, as_views = op
            data = [memoryview(b"!" + body)[1:] for body in batch] if as_views else batch
            appended = store.append_many("p", queue, data, key=key, protocol=protocol)
        elif kind == "half":
            _, queue, body, key, headers = op
            # As the transaction service does: the half path, or the general one at a roll.
            found = store.append_half("h", queue, body, key, headers)
            appended = found or store.append(
                "h", queue, body, key=key, headers=headers, flags=rec.FLAG_HALF
            )
            size = appended.end - appended.position
            open_halves.append((appended.position, size, TargetIndex(0, 1, (("h", queue),))))
        elif kind == "tagged":
            _, queue, body, tags = op
            appended = store.append("t", queue, body, tags=tags, headers=[("x", b"1")])
        elif kind == "commit":
            _, count, client, known, routed = op
            halves, open_halves[:] = open_halves[:count], open_halves[count:]
            if not halves:
                continue
            decision = LinkDecision(
                b"txn-%d" % number,
                client,
                ("commit",),
                rec.encode_headers([("x-braid-txn-resume", b"%d 0" % number)]),
            )
            appended = decisions.append(
                [(position, size) for position, size, _ in halves],
                decision,
                [target for _, _, target in halves] if known else None,
                [("routed", 0), ("routed", 1)] if routed else None,
            )
        else:  # link_known: what the timer service does when records fire
            targets = plain_records[-op[1] :]
            if not targets:
                continue
            appended = store.link_frames(
                targets, [("fired", 0), ("fired", 1)], index_info=[(0, 1)] * len(targets)
            )
        results.append(tuple(appended))
    store.index_listeners.clear()
    return [results, heard]


def image(data_dir: Path) -> dict[str, bytes]:
    """Every commit-log segment and index file of ``data_dir``, by relative path."""
    found = {}
    for top in (names.COMMITLOG_DIR, names.INDEX_DIR):
        for path in sorted((data_dir / top).rglob("*")):
            if path.is_file():
                found[str(path.relative_to(data_dir))] = path.read_bytes()
    return found


def queue_entries(store: LogReader) -> dict[tuple[str, int], list[tuple[int, ...]]]:
    entries = {}
    for topic, queue in store.queues(include_system=True):
        index = store.queue_index(topic, queue)
        assert index is not None
        entries[(topic, queue)] = [tuple(e) for e in index.raw_entries(0, index.next_entry)]
    return entries


def crash(store: LogStore) -> None:
    """Drop ``store`` as kill -9 would: no flush, no checkpoint, no clean-shutdown marker."""
    store.closed = True
    store._executor.shutdown()
    LogReader.close(store)


def tear(data_dir: Path, cut: int) -> None:
    """Lose every byte of the commit log from ``cut`` on (zeros, as never-written pages read)."""
    for path in (data_dir / names.COMMITLOG_DIR).iterdir():
        base = names.number_of(path)
        size = path.stat().st_size
        if base + size <= cut:
            continue
        start = max(cut - base, 0)
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(size - start), start)
        finally:
            os.close(fd)


def first_nonzero_byte(data_dir: Path, cut: int, end: int) -> int:
    """The log position of the first non-zero byte at or after ``cut`` (``end`` if none)."""
    found = end
    for path in (data_dir / names.COMMITLOG_DIR).iterdir():
        base = names.number_of(path)
        data = path.read_bytes()
        start = max(cut - base, 0)
        stripped = data[start:].lstrip(b"\0")
        if stripped:
            found = min(found, base + len(data) - len(stripped))
    return found


def recovered(report: RecoveryReport) -> tuple[object, ...]:
    return (
        report.replayed_records,
        report.end_position,
        report.truncated_bytes,
        report.corrupt_positions,
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations, st.integers(0, 1000))
def test_fast_paths_write_the_reference_bytes_and_recover_the_same(
    tmp_path_factory: pytest.TempPathFactory,
    pinned_clock: PinnedClock,
    ops: list[tuple[Any, ...]],
    cut_permille: int,
) -> None:
    directories = {
        fast: tmp_path_factory.mktemp("fast" if fast else "reference") for fast in (1, 0)
    }
    stores = {
        fast: LogStore(small_config(directory, segment_size=SEGMENT), fast_paths=bool(fast))
        for fast, directory in directories.items()
    }
    start_ms = pinned_clock.ms
    outcomes = {}
    for fast, store in stores.items():
        pinned_clock.ms = start_ms  # the same clock readings for both
        outcomes[fast] = run(store, pinned_clock, ops)
    fast_store, reference = stores[1], stores[0]
    # The reference store took no fast path (no frame head was ever filled); the fast one
    # did wherever a plain op came.
    assert all(head.store_ms == -1 for head in reference._plain_heads.values())
    assert not reference._half_heads
    if any(op[0] in ("plain", "many") for op in ops):
        assert any(head.store_ms != -1 for head in fast_store._plain_heads.values())
    assert outcomes[1] == outcomes[0]
    for name in ("appends", "appended_bytes", "index_entries"):
        assert fast_store.metrics[name] == reference.metrics[name], name
    before = queue_entries(fast_store)
    assert before == queue_entries(reference)
    end = fast_store.commitlog.write_position
    assert end == reference.commitlog.write_position
    for store in stores.values():
        crash(store)
    assert image(directories[1]) == image(directories[0])

    # A crash in the middle: the log torn at the same byte in both, then recovery.
    cut = end * cut_permille // 1000
    # Zeros written over zeros change nothing (a cut inside an all-zero body leaves that frame
    # whole and valid): recovery may keep the log up to the first byte the tear changed.
    changed_from = first_nonzero_byte(directories[1], cut, end)
    for directory in directories.values():
        tear(directory, cut)
    reopened = {
        fast: LogStore(small_config(directory, segment_size=SEGMENT), fast_paths=bool(fast))
        for fast, directory in directories.items()
    }
    assert recovered(reopened[1].recovery) == recovered(reopened[0].recovery)
    assert reopened[1].commitlog.write_position <= changed_from
    after = queue_entries(reopened[1])
    assert after == queue_entries(reopened[0])
    for queue, entries in after.items():
        assert entries == before.get(queue, [])[: len(entries)], queue
    if cut == end:
        assert after == {queue: entries for queue, entries in before.items() if entries}
    for store in reopened.values():
        assert store.verify() == []
        crash(store)
    assert image(directories[1]) == image(directories[0])


@pytest.mark.parametrize("fast", [True, False])
def test_each_fast_path_is_taken_only_with_fast_paths(
    tmp_path: Path, pinned_clock: PinnedClock, fast: bool
) -> None:
    """The parity test compares something: with fast paths each one runs (it leaves its state:
    frame heads per queue, the staging buffer, the decision head), without them none does."""
    store = LogStore(small_config(tmp_path / "d", segment_size=SEGMENT), fast_paths=fast)
    decisions = DecisionWriter(store)
    store.append("p", 0, b"body", key=b"k")
    store.append_many("p", 1, [b"x" * 1200] * 40, key=b"key")  # 48 KiB: staged
    half = store.append_half("h", 0, b"half", b"", HALF_HEADERS)
    assert (half is not None) == fast
    if half is None:
        half = store.append("h", 0, b"half", headers=HALF_HEADERS, flags=rec.FLAG_HALF)
    decision = LinkDecision(b"txn", "g", ("commit",), b"")
    decisions.append([(half.position, half.end - half.position)], decision)
    used = sorted(queue for queue, head in store._plain_heads.items() if head.store_ms != -1)
    assert used == ([("p", 0), ("p", 1)] if fast else [])
    assert sorted(store._half_heads) == ([("h", 0)] if fast else [])
    assert (len(store.frames._staging) >= 48_000) == fast
    assert (decisions._head is not None) == fast
    assert [bytes(r.body) for r in store.read("p", 1, 0, max_records=100)] == [b"x" * 1200] * 40
    assert [r.record().key for r in store.read(names.TRANSACTIONS_TOPIC, 0, 0)] == [b"txn"]
    assert [bytes(r.body) for r in store.read("h", 0, 0)] == [b"half"]
    assert store.verify() == []
    store.close()
