"""The process-wide read-only :class:`core.log.LogReader` per data directory, and the shards of
a cluster's data root.

Spark runs ``partitions()`` and ``read()`` in Python worker processes that it reuses between
tasks and queries, so a data directory's mappings are opened once per worker, not once per
partition, and refreshed when a read needs more than they show. Only :mod:`core.log` is
imported here (no numpy or Arrow), so planning stays cheap. Not thread-safe: one Spark task
runs in a worker process at a time.

A read's ``path`` is a single-node data directory (``log.json``) or a cluster's data root
(``cluster.json``, docs/cluster.md section 2): ``ROOT/shards/%04d/`` are then each a data
directory, read as one is, shard by shard. A shard nobody has written yet (no ``log.json``) is
skipped until it has one. The names of the root's layout are ``core.cluster.layout``'s (which
spark/ may not import: a test checks they agree).
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from core.log import LogReader, names
from core.log.txnindex import TxnOutcomes

# A new index or segment file is created empty, then extended: a reader mapping it in between
# sees zero bytes. How often and how long to wait before treating the error as real.
REFRESH_ATTEMPTS = 20
REFRESH_PAUSE_S = 0.01

# A cluster's data root (core.cluster.layout): this file names the shard count; each shard is
# a data directory ``shards/%04d``; the pending plan means `braid cluster init` did not finish.
CLUSTER_FILE = "cluster.json"
PENDING_FILE = "cluster.json.pending"
SHARDS_DIR = "shards"
CLUSTER_FORMAT = 1

T = TypeVar("T")
Shard = int | None  # a shard of a cluster's data root; None: a single-node directory


class NotAReadableRoot(ValueError):
    """``path`` is a cluster's data root that cannot be read (unfinished, or unknown format)."""


@dataclass(frozen=True, slots=True)
class DataRoot:
    """What a read's ``path`` is: a single-node data directory (``shards`` None) or a
    cluster's data root of ``shards`` shards."""

    path: str
    shards: int | None = None
    legacy_shard: int | None = None  # the shard an adopted single-node directory became

    @property
    def is_root(self) -> bool:
        return self.shards is not None


def data_root(path: str) -> DataRoot:
    """Whether ``path`` is a cluster's data root (read from its ``cluster.json`` each time: one
    small file) or a single-node directory (anything else: opening it says what is wrong)."""
    try:
        with open(os.path.join(path, CLUSTER_FILE), "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        if os.path.exists(os.path.join(path, PENDING_FILE)):
            raise NotAReadableRoot(
                f"{path}: `braid cluster init` did not finish ({PENDING_FILE} is there)"
            ) from None
        return DataRoot(path)
    try:
        layout = json.loads(raw)
        layout_format = layout["format"]
        shards = int(layout["shards"])
        legacy = layout.get("legacy_shard")
        legacy_shard = None if legacy is None else int(legacy)
    except (ValueError, KeyError, TypeError) as error:
        raise NotAReadableRoot(
            f"{path}/{CLUSTER_FILE} is not a valid cluster file: {error}"
        ) from None
    if layout_format != CLUSTER_FORMAT:
        raise NotAReadableRoot(
            f"{path}/{CLUSTER_FILE} has format {layout_format!r}; "
            f"this reader knows format {CLUSTER_FORMAT}"
        )
    return DataRoot(path, shards, legacy_shard)


def shard_dir(path: str, shard: Shard) -> str:
    """The data directory of ``shard`` of the root ``path``; ``path`` itself for None."""
    return path if shard is None else os.path.join(path, SHARDS_DIR, f"{shard:04d}")


def open_shards(root: DataRoot, *, refresh_readers: bool = False) -> list[tuple[Shard, LogReader]]:
    """``(shard, reader)`` of every data directory of ``root``, in shard order: ``[(None,
    reader)]`` for a single-node directory; the shards holding a log for a cluster's root (one
    written since the last call is found now). With ``refresh_readers``, each is refreshed."""
    if not root.is_root:
        found: list[tuple[Shard, LogReader]] = [(None, open_reader(root.path))]
    else:
        found = []
        for shard in range(root.shards or 0):
            directory = shard_dir(root.path, shard)
            if directory in _readers or os.path.exists(
                os.path.join(directory, names.LOG_META_FILE)
            ):
                found.append((shard, open_reader(directory)))
    if refresh_readers:
        for _, reader in found:
            refresh(reader)
    return found


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
