"""core/log: the storage engine. One CommitLog, per-queue indexes, recovery, retention.

Public API: :class:`LogStore` (writer, one per data directory), :class:`LogReader` (read-only,
any process), :class:`LogConfig`, the record model in :mod:`core.log.record`.

One module per on-disk structure (``record``, ``segment``, ``commitlog``, ``consumequeue``,
``checkpoint``) and per job of the writer (``frames``: encoding frames; ``index_writer``: index
entries; ``durability``: group commit and flushes; ``recovery``; ``retention``), put together by
``store``. docs/storage.md describes them.
"""

from core.log.config import DURABILITY_ASYNC, DURABILITY_SYNC, LogConfig
from core.log.fence import Fence, StoreFenced
from core.log.reader import LogReader, QueueRecord
from core.log.record import CorruptRecordError, Record
from core.log.store import Appended, LogStore
from core.log.tags import TagFilter

__all__ = [
    "DURABILITY_ASYNC",
    "DURABILITY_SYNC",
    "Appended",
    "CorruptRecordError",
    "Fence",
    "LogConfig",
    "LogReader",
    "LogStore",
    "QueueRecord",
    "Record",
    "StoreFenced",
    "TagFilter",
]
