"""What an idle queue costs (issue 21, topic churn: ~8.5 KiB per new MQTT topic in the soak), and
that queues whose index files were unmapped to stay within ``max_open_files`` lose nothing:
their records read back as written, after more appends, a checkpoint, a crash and a restart.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from core.log import LogStore
from core.log.consumequeue import ConsumeQueue
from tests.log.conftest import small_config

REPO_ROOT = Path(__file__).resolve().parents[2]
# Heap per new idle queue, measured at ~460 bytes (the ConsumeQueue, its slot in the store's
# dict and in the checkpoint's counts; the topic name is the caller's). Before the per-queue
# state was trimmed it was ~2,400 (Path objects, an _IndexFile with a WeakMethod per file, an
# instance dict, an empty dirty set, a cached encoded name and frame head).
MAX_HEAP_PER_IDLE_QUEUE = 800
ENTRIES_PER_FILE = 64  # small_config's: a queue of 150 records spans three index files
MAX_OPEN_FILES = 8  # the least OpenFiles allows: nearly every queue is evicted
SMAPS_HEADER = re.compile(r"[0-9a-f]+-[0-9a-f]+ ")


def test_an_idle_queue_costs_a_few_hundred_bytes(tmp_path: Path) -> None:
    topics = [f"churn-{n:05d}" for n in range(1_200)]  # names made before the measurement
    with LogStore(small_config(tmp_path / "data", max_open_files=64)) as store:
        for topic in topics[:200]:  # one-time costs: dict sizes, segments, caches
            store.append(topic, 0, b"x", subject="t")
        store.checkpoint()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            # As an MQTT QoS 0 publish to a fresh topic stores it (a subject: not the plain
            # fast path), then a checkpoint (its counts hold every queue).
            for topic in topics[200:]:
                store.append(topic, 0, b"x", subject="t")
            store.checkpoint()
            gc.collect()
            per_queue = (tracemalloc.get_traced_memory()[0] - before) / (len(topics) - 200)
        finally:
            tracemalloc.stop()
        assert len(store.open_files) <= 64
        assert per_queue < MAX_HEAP_PER_IDLE_QUEUE, f"{per_queue:.0f} bytes per idle queue"
        # Idle queues keep no mapped files (each would be an object and a mapping).
        idle = [store.queue_index(topic, 0) for topic in topics[:1_000]]
        assert sum(index.mapped_files for index in idle if index is not None) == 0
        assert [bytes(r.body) for r in store.read(topics[0], 0, 0)] == [b"x"]


def test_the_writer_maps_index_files_without_readahead(tmp_path: Path) -> None:
    """A fault on a fresh index file's hole read ahead read_ahead_kb (8 MiB on the machines
    measured) of zeroed page cache: 22 ms of system time per new topic. The writer's mappings
    are advised MADV_RANDOM (``rr`` in /proc/self/smaps)."""
    with LogStore(small_config(tmp_path / "data")) as store:
        store.append("advised", 0, b"x")
        index = store.queue_index("advised", 0)
        assert index is not None
        path = index.file_path(0)
        flags = index_mapping_flags(path)
        assert "rr" in flags.split(), f"{path}: VmFlags {flags}"


def index_mapping_flags(path: str) -> str:
    """The VmFlags of this process's mapping of ``path``."""
    mapped = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if SMAPS_HEADER.match(line):
                mapped = line.rstrip("\n").endswith(" " + path)
            elif mapped and line.startswith("VmFlags:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"{path} is not mapped")


def bodies(store: LogStore, topic: str) -> list[bytes]:
    records = store.read(topic, 0, 0, max_records=10_000)
    assert [r.offset for r in records] == list(range(len(records)))
    return [bytes(r.body) for r in records]


def expected(number: int, rounds: int) -> list[bytes]:
    return [b"q%d-r%d" % (number, r) for r in range(rounds)]


# The child of the crash case: interleaved appends to 40 queues over 8 mapped files (every
# append to another queue evicts), a checkpoint halfway, then killed without closing.
CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from core.log import LogConfig, LogStore
    store = LogStore(LogConfig(Path(sys.argv[1]), segment_size=64 * 1024,
                               index_entries_per_file=64, retention_ms=None, max_open_files=8))
    for r in range(150):
        for n in range(40):
            store.append(f"evicted-{n}", 0, b"q%d-r%d" % (n, r))
        if r == 75:
            store.checkpoint()
    sys.stdout.write("written\\n")
    sys.stdout.flush()
    os._exit(0)  # no close, no checkpoint of the last half: recovery replays it
    """
)


def test_evicted_queues_lose_nothing_across_a_crash_and_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(data_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.stdout == "written\n", child.stderr
    config = small_config(data_dir, max_open_files=MAX_OPEN_FILES)
    with LogStore(config) as store:
        assert store.recovery.replayed_records > 0  # the half after the checkpoint
        for n in range(40):
            assert bodies(store, f"evicted-{n}") == expected(n, 150)
            index = store.queue_index(f"evicted-{n}", 0)
            assert index is not None
            assert len(index.files) == 3  # 150 entries, 64 a file
        assert len(store.open_files) <= MAX_OPEN_FILES
        # Appends to queues whose tail files were unmapped since: each maps its tail again.
        for r in range(150, 200):
            for n in range(40):
                store.append(f"evicted-{n}", 0, b"q%d-r%d" % (n, r))
        for n in range(40):
            assert bodies(store, f"evicted-{n}") == expected(n, 200)
    with LogStore(config) as reopened:  # a clean restart: nothing to replay
        assert reopened.recovery.replayed_records == 0
        for n in range(40):
            assert bodies(reopened, f"evicted-{n}") == expected(n, 200)
        assert len(reopened.open_files) <= MAX_OPEN_FILES


def test_an_evicted_queue_deletes_and_truncates_its_files(tmp_path: Path) -> None:
    """Retention and recovery act on files that are not mapped: by path, by number."""
    with LogStore(small_config(tmp_path / "data", max_open_files=MAX_OPEN_FILES)) as store:
        for r in range(200):
            store.append("kept", 0, b"q0-r%d" % r)
        index = store.queue_index("kept", 0)
        assert isinstance(index, ConsumeQueue)
        for n in range(2 * MAX_OPEN_FILES):  # evict every file of "kept"
            store.append(f"other-{n}", 0, b"x")
        assert index.mapped_files == 0
        assert index.delete_files_before(2 * ENTRIES_PER_FILE) == 2
        assert sorted(os.listdir(index.directory)) == [
            f"{2 * ENTRIES_PER_FILE:020d}.idx",
            f"{3 * ENTRIES_PER_FILE:020d}.idx",
        ]
        records = store.read("kept", 0, 0, max_records=1000)
        assert [bytes(r.body) for r in records] == expected(0, 200)[2 * ENTRIES_PER_FILE :]
        for n in range(2 * MAX_OPEN_FILES):
            store.append(f"other-{n}", 0, b"y")
        index.truncate(150)  # as recovery does to a queue's checkpointed count
        assert index.next_offset == 150
        assert sorted(os.listdir(index.directory)) == [f"{2 * ENTRIES_PER_FILE:020d}.idx"]
        store.append("kept", 0, b"after")
        records = store.read("kept", 0, 140, max_records=1000)
        assert [bytes(r.body) for r in records] == [*expected(0, 150)[140:], b"after"]


@pytest.mark.parametrize("records", [0, 1, 101, 102, 103, 150, 205, 1023, 1024, 1025, 1500])
def test_a_reopened_queue_counts_its_entries(tmp_path: Path, records: int) -> None:
    """The end of a file's entries is searched from its first hole (SEEK_HOLE: the blocks
    reserved so far, 4 KiB = 102.4 entries at first, then doubling): counts on both sides of
    each boundary, and of a file's end (1,024 entries here)."""
    config = small_config(tmp_path / "data", index_entries_per_file=1024)
    with LogStore(config) as store:
        for r in range(records):
            store.append("counted", 0, b"q0-r%d" % r)
    with LogStore(config) as reopened:
        assert reopened.queue_bounds("counted", 0) == (0, records)
        assert bodies(reopened, "counted") == expected(0, records)
        reopened.append("counted", 0, b"next")
        assert reopened.read("counted", 0, records)[0].offset == records


def test_entries_past_a_reported_hole_are_still_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem may report a hole where entries are (a reservation failed and the
    mapping's pages are not written back yet): the search goes on past it."""
    config = small_config(tmp_path / "data", index_entries_per_file=1024)
    with LogStore(config) as store:
        for r in range(300):
            store.append("counted", 0, b"q0-r%d" % r)
    monkeypatch.setattr(ConsumeQueue, "_data_bytes", lambda self, number: 10 * 40)
    with LogStore(config) as reopened:
        assert reopened.queue_bounds("counted", 0) == (0, 300)
        assert bodies(reopened, "counted") == expected(0, 300)
