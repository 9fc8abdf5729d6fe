"""A bounded set of open per-queue index files (RocksDB's ``max_open_files``): mapped on demand,
the least recently used unmapped first.

Why: every queue kept its index file mapped, and a mapping holds a file descriptor (Python's
``mmap`` keeps a ``dup`` of the one it was made from, up to 3.13's ``trackfd``), so ~10,000
topics from one MQTT client took every descriptor of the process (issue 21 item 3): checkpoints
then failed, listeners stopped, and a restart mapped them all again and was as stuck. Now at
most ``limit`` index files are mapped at once: a mapped file costs one descriptor (two while
the writer appends to it: fallocate and pwrite need one of their own, since the mapping's is
not reachable from Python), an unmapped one none; fdatasync opens one for the call. The
commit log's segments stay mapped (one per segment: the log's size, not its queue count).

A file that cannot be unmapped yet (a read still holds a slice of its mapping) stays mapped and
counted, and is tried again at the next eviction. The event-loop thread only; not thread-safe.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Protocol

# RocksDB's max_open_files defaults to -1 (no bound); a bound is the point here, and a few
# hundred mappings cover the tails of the queues being written and read at once.
DEFAULT_MAX_OPEN_FILES = 256
# Never fewer: a queue touches two files at once (its tail and the one before), and a cache
# smaller than what one operation holds would unmap what it just mapped.
MIN_OPEN_FILES = 8


def bounded_by_fd_limit(wanted: int) -> int:
    """``wanted``, but at most an eighth of the process's descriptor limit (soft
    RLIMIT_NOFILE): a mapped file being appended to holds two descriptors (its mapping's and
    one for fallocate and pwrite), so the index files take at most a quarter; the rest is for
    connections, segments and the checkpoint."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max(wanted, MIN_OPEN_FILES)
    return max(MIN_OPEN_FILES, min(wanted, soft // 8))


class Mappable(Protocol):
    def unmap(self) -> bool:
        """Unmap (closing the descriptor); False while a slice of the mapping is held."""
        ...


class OpenFiles:
    """Up to ``limit`` mapped files, least recently used first out."""

    def __init__(self, limit: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self.limit = max(limit, MIN_OPEN_FILES)
        self._mapped: OrderedDict[Mappable, None] = OrderedDict()
        self.mapped = 0  # files mapped since start (each a miss of the cache)

    def __len__(self) -> int:
        return len(self._mapped)

    def make_room(self) -> None:
        """Unmap the least recently used files until one more fits (skipping any that a held
        slice keeps mapped)."""
        mapped = self._mapped
        for candidate in list(mapped):
            if len(mapped) < self.limit:
                return
            if candidate.unmap():
                del mapped[candidate]

    def add(self, item: Mappable) -> None:
        """``item`` was just mapped."""
        self._mapped[item] = None
        self.mapped += 1

    def touch(self, item: Mappable) -> None:
        """``item`` was used: last to be unmapped."""
        mapped = self._mapped
        if item in mapped:
            mapped.move_to_end(item)

    def discard(self, item: Mappable) -> None:
        """``item`` was unmapped by its owner (closed, deleted)."""
        self._mapped.pop(item, None)
