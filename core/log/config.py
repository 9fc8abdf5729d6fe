"""Configuration of the log engine, and the per-directory metadata fixed at creation."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from core.log import names
from core.log.diskspace import DEFAULT_DISK_FREE_CHECK_INTERVAL_MS, DEFAULT_DISK_FREE_LIMIT_BYTES
from core.log.openfiles import DEFAULT_MAX_OPEN_FILES

DURABILITY_SYNC = "sync"  # group commit: the append completes after the fsync that covers it
DURABILITY_ASYNC = (
    "async"  # flushed every flush_interval_ms; survives a process crash, not power loss
)
DURABILITY_MODES = (DURABILITY_SYNC, DURABILITY_ASYNC)

# RocketMQ's default CommitLog file is 1 GiB; Kafka's segment.bytes too.
DEFAULT_SEGMENT_SIZE = 1 << 30
# 256Ki entries x 40 bytes = 10 MiB per index file (RocketMQ: 300,000 x 20 bytes).
DEFAULT_INDEX_ENTRIES_PER_FILE = 1 << 18
# Kafka's log.retention.hours default is 168 (7 days).
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
FORMAT_VERSION = 1


@dataclass
class LogConfig:
    data_dir: Path
    segment_size: int = DEFAULT_SEGMENT_SIZE
    index_entries_per_file: int = DEFAULT_INDEX_ENTRIES_PER_FILE
    durability: str = DURABILITY_SYNC
    # Per-topic override of ``durability``.
    topic_durability: dict[str, str] = field(default_factory=dict)
    flush_interval_ms: int = 200
    checkpoint_interval_ms: int = 1000
    retention_ms: int | None = DEFAULT_RETENTION_MS
    retention_bytes: int | None = None
    retention_check_interval_ms: int = 60_000
    # CRC-check on reads also the frames the running writer appended itself (docs/storage.md).
    check_own_writes: bool = False
    # The disk alarm (core/log/diskspace.py): publishers stop while the log's volume has less
    # free than this (RabbitMQ's disk_free_limit, 50 MB); None (-1 in a config file): off.
    disk_free_limit_bytes: int | None = DEFAULT_DISK_FREE_LIMIT_BYTES
    disk_free_check_interval_ms: int = DEFAULT_DISK_FREE_CHECK_INTERVAL_MS
    # Index files mapped at once at most (RocksDB's max_open_files; each mapping holds a
    # descriptor; at most an eighth of RLIMIT_NOFILE, see core/log/openfiles.py).
    max_open_files: int = DEFAULT_MAX_OPEN_FILES

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        for mode in (self.durability, *self.topic_durability.values()):
            if mode not in DURABILITY_MODES:
                raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {mode!r}")
        if self.segment_size < 4096:
            raise ValueError("segment_size must be at least 4096 bytes")

    def durability_for(self, topic: str) -> str:
        return self.topic_durability.get(topic, self.durability)


@dataclass(frozen=True)
class LogMeta:
    """What a data directory was created with; a reader needs it to compute file positions."""

    segment_size: int
    index_entries_per_file: int
    version: int = FORMAT_VERSION

    @classmethod
    def load(cls, data_dir: Path) -> LogMeta | None:
        path = data_dir / names.LOG_META_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return cls(raw["segment_size"], raw["index_entries_per_file"], raw["version"])

    def store(self, data_dir: Path) -> None:
        write_atomically(
            data_dir / names.LOG_META_FILE,
            json.dumps(
                {
                    "segment_size": self.segment_size,
                    "index_entries_per_file": self.index_entries_per_file,
                    "version": self.version,
                }
            ).encode(),
        )


def write_atomically(path: Path, data: bytes) -> None:
    """Write, fsync, rename, fsync the directory: the file is either old or new after a crash."""
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)
