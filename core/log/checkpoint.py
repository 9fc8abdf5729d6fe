"""The checkpoint: up to which commit-log position the indexes are complete and durable
(Kafka's recovery-point checkpoint, RocketMQ's StoreCheckpoint).

File ``DATA_DIR/checkpoint``, JSON::

    {"position": C, "queues": {"<topic dir>/<queue>": entry count, ...}, "written_ms": ms}

``C`` is the commit-log write position when the checkpoint was captured and each count the
queue's index entries at that moment. Before the file is replaced (atomically: temp file, fsync,
rename, fsync of the directory) the commit log is fdatasync'ed up to ``C`` and so are the index
files written since the last capture, so recovery (:mod:`core.log.recovery`) may trust both and
replay only the frames after ``C``. Not checksummed (the atomic replace means it is whole or the
previous one); derived from the commit log, so a lost checkpoint costs a longer replay.

Thread-safety: captured on the event-loop thread; written in the store's worker thread or
blocking on the caller's, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import Executor
from pathlib import Path

from core.log import names
from core.log.commitlog import CommitLog
from core.log.config import write_atomically
from core.log.consumequeue import ConsumeQueue
from core.log.segment import sync_path


def queue_key(topic: str, queue: int) -> str:
    """The name of (topic, queue) in the checkpoint's ``queues``."""
    return f"{names.encode_topic_dir(topic)}/{queue}"


def read_checkpoint(data_dir: Path) -> tuple[int, dict[str, int]]:
    """``(C, entry count by queue_key)`` of the last checkpoint; ``(0, {})`` when none."""
    path = data_dir / names.CHECKPOINT_FILE
    if not path.exists():
        return 0, {}
    raw = json.loads(path.read_text())
    return int(raw["position"]), {str(k): int(v) for k, v in raw["queues"].items()}


class Checkpoints:
    """Captures and writes checkpoints of ``commitlog`` and ``queues`` in ``data_dir``;
    ``written`` counts them."""

    def __init__(
        self,
        data_dir: Path,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        executor: Executor,
    ) -> None:
        self.data_dir = data_dir
        self.commitlog = commitlog
        self.queues = queues
        self.executor = executor
        self.written = 0
        # The last capture written: counts by the store's own (topic, queue) keys, not by
        # queue_key strings (one more string per queue kept between checkpoints).
        self._last: tuple[int, dict[tuple[str, int], int]] | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._written_seq = 0

    def _capture(self) -> tuple[int, dict[tuple[str, int], int], list[str], int]:
        self._seq += 1
        counts = {key: index.next_entry for key, index in self.queues.items()}
        dirty: list[str] = []
        for index in self.queues.values():
            for number in index.take_dirty():
                if index.has_file(number):
                    dirty.append(index.file_path(number))
        return self.commitlog.write_position, counts, dirty, self._seq

    def _write(
        self, position: int, counts: dict[tuple[str, int], int], dirty: list[str], seq: int
    ) -> None:
        # One at a time (a blocking checkpoint from close() or drop_queues() can meet one the
        # background task is writing in the executor: they shared checkpoint.tmp), and never an
        # older capture over a newer one; a newer one also waits until the older one's index
        # files are synced, since its capture did not list them again.
        with self._lock:
            self.commitlog.sync_to(position)
            for path in dirty:
                # By path, with a descriptor of its own (this thread must not use the event
                # loop's, which core/log/openfiles.py may close meanwhile). A file deleted by
                # retention meanwhile: its entries are gone anyway.
                with contextlib.suppress(FileNotFoundError):
                    sync_path(path)
            if seq < self._written_seq:
                return
            payload = {
                "position": position,
                "queues": {queue_key(t, q): count for (t, q), count in counts.items()},
                "written_ms": time.time_ns() // 1_000_000,
            }
            write_atomically(self.data_dir / names.CHECKPOINT_FILE, json.dumps(payload).encode())
            self._written_seq = seq
            self._last = (position, counts)
            self.written += 1

    def write(self) -> None:
        """Blocking checkpoint: indexes are complete up to the recorded commit-log position."""
        self._write(*self._capture())

    async def write_async(self) -> None:
        """:meth:`write` in the worker thread; nothing when nothing changed since the last."""
        position, counts, dirty, seq = self._capture()
        if self._last == (position, counts) and not dirty:
            return
        await asyncio.get_running_loop().run_in_executor(
            self.executor, self._write, position, counts, dirty, seq
        )
