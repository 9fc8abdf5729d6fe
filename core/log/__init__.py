"""core/log: the storage engine. One CommitLog, per-queue indexes, recovery, retention.

Public API: :class:`LogStore` (writer, one per data directory), :class:`LogReader` (read-only,
any process), :class:`LogConfig`, the record model in :mod:`core.log.record`.
"""

from core.log.config import DURABILITY_ASYNC, DURABILITY_SYNC, LogConfig
from core.log.reader import LogReader, QueueRecord
from core.log.record import CorruptRecordError, Record
from core.log.store import Appended, LogStore
from core.log.tags import TagFilter

__all__ = [
    "DURABILITY_ASYNC",
    "DURABILITY_SYNC",
    "Appended",
    "CorruptRecordError",
    "LogConfig",
    "LogReader",
    "LogStore",
    "QueueRecord",
    "Record",
    "TagFilter",
]
