"""The process-wide read-only :class:`core.log.LogReader` per data directory.

Spark runs ``partitions()`` and ``read()`` in Python worker processes that it reuses between
tasks and queries, so a data directory's mappings are opened once per worker, not once per
partition, and refreshed when a read needs more than they show. Only :mod:`core.log` is
imported here (no numpy or Arrow), so planning stays cheap. Not thread-safe: one Spark task
runs in a worker process at a time.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TypeVar

from core.log import LogReader
from core.log.txnindex import TxnOutcomes

# A new index or segment file is created empty, then extended: a reader mapping it in between
# sees zero bytes. How often and how long to wait before treating the error as real.
REFRESH_ATTEMPTS = 20
REFRESH_PAUSE_S = 0.01

T = TypeVar("T")

_readers: dict[str, LogReader] = {}
# Per reader: the outcomes of its log's Kafka transactions, read from ``__kafka_txns/0`` once
# and then only what was indexed since (TxnOutcomes.refresh).
_transactions: weakref.WeakKeyDictionary[LogReader, TxnOutcomes] = weakref.WeakKeyDictionary()


def open_reader(data_dir: str) -> LogReader:
    """The process-wide reader of ``data_dir`` (Python workers are reused between tasks, so the
    mappings of a data directory are opened once per worker, not once per partition)."""
    reader = _readers.get(data_dir)
    if reader is None:
        reader = _readers[data_dir] = retry_while_files_grow(lambda: LogReader(data_dir))
    return reader


def close_readers() -> None:
    for reader in _readers.values():
        reader.close()
    _readers.clear()
    _transactions.clear()


def known_transactions(reader: LogReader) -> TxnOutcomes:
    """The outcomes of ``reader``'s log's Kafka transactions as last read (none yet: empty)."""
    outcomes = _transactions.get(reader)
    if outcomes is None:
        outcomes = _transactions[reader] = TxnOutcomes()
    return outcomes


def transactions(reader: LogReader) -> TxnOutcomes:
    """The outcomes of the Kafka transactions of ``reader``'s log, brought up to date now:
    call it after refreshing ``reader``, so the transaction index is read after the partitions
    (see :meth:`TxnOutcomes.last_stable_offset`)."""
    outcomes = known_transactions(reader)
    retry_while_files_grow(lambda: outcomes.refresh(reader))
    return outcomes


def retry_while_files_grow(action: Callable[[], T]) -> T:
    """Run ``action``, retrying while it fails only because the writer has just created a file
    it has not yet extended (``mmap`` of an empty file raises ValueError)."""
    for _ in range(REFRESH_ATTEMPTS - 1):
        try:
            return action()
        except ValueError as error:
            if "empty file" not in str(error):
                raise
            time.sleep(REFRESH_PAUSE_S)
    return action()


def refresh(reader: LogReader) -> None:
    retry_while_files_grow(reader.refresh)
