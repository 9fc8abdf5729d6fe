"""Durability: group commit, flush and the periodic flush (RocketMQ's GroupCommitService and
FlushRealTimeService; Kafka's ``Log.flush``).

In ``sync`` mode an append is acknowledged after the fdatasync that covers it: waiters queue
with the commit-log position their append ends at, one fdatasync runs in a worker thread for
everything appended so far, and every waiter at or before that position is resolved (concurrent
appends share one fsync while the event loop keeps appending). In ``async`` mode a background
task fdatasyncs every ``flush_interval_ms`` (:meth:`GroupCommit.flush_async`). The commit log's
``flushed_position`` is the named position this module moves.

A fenced store (:mod:`core.log.fence`: the commit log's ``fence_check`` said a newer owner
claimed the log, at a group commit's fsync or a checkpoint's) releases nobody: every waiter
fails with :class:`~core.log.fence.StoreFenced`, appends are refused, one ERROR line is logged
and the ``on_fenced`` callbacks run (the store stops its background writers).

Thread-safety: waiters are queued and resolved on the event-loop thread; only
``CommitLog.sync_to`` runs in the worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

from core.log.commitlog import CommitLog
from core.log.consumequeue import ConsumeQueue
from core.log.fence import StoreFenced

log = logging.getLogger(__name__)


class GroupCommit:
    """fdatasyncs of ``commitlog`` (and of the indexes in ``queues`` on a full flush) in
    ``executor``'s thread; ``fsyncs`` counts the commit-log syncs."""

    def __init__(
        self,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        executor: Executor,
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.executor = executor
        self.fsyncs = 0
        # Called before each group commit picks the position it syncs to: appends a caller
        # holds back until the end of a loop turn (coalesced transaction commits) get written
        # first, so they share that fsync.
        self.before_sync: list[Callable[[], None]] = []
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self.task: asyncio.Task[None] | None = None  # the group commit under way, if any
        # Set once the log is fenced (see the module docstring); the callbacks run then, once.
        self.fenced: StoreFenced | None = None
        self.on_fenced: list[Callable[[StoreFenced], None]] = []

    async def wait(self, end: int) -> None:
        """Return once everything before commit-log position ``end`` is durable."""
        if self.commitlog.flushed_position >= end:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_waiter(end, future)
        await future

    def add_waiter(self, end: int, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` once everything before ``end`` is durable."""
        if self.commitlog.flushed_position >= end:
            if not future.done():
                future.set_result(None)
            return
        self._waiters.append((end, future))
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiters:
                for write_held_back in self.before_sync:
                    write_held_back()
                target = self.commitlog.write_position
                await loop.run_in_executor(self.executor, self.commitlog.sync_to, target)
                self.fsyncs += 1
                while self._waiters and self._waiters[0][0] <= target:
                    _, future = self._waiters.popleft()
                    if not future.done():
                        future.set_result(None)
        except StoreFenced as error:
            # sync_to raised before moving flushed_position: nobody waiting was released.
            self.fence(error)
        except BaseException as error:
            self.fail_waiters(error)
            raise
        finally:
            self.task = None

    def fence(self, error: StoreFenced) -> None:
        """The log is fenced: fail every waiter with ``error``, refuse later appends; the first
        time, log it and run the ``on_fenced`` callbacks. Called on the event-loop thread."""
        self.commitlog.refuse_appends()
        failed = self.fail_waiters(error)
        if self.fenced is not None:
            return
        self.fenced = error
        log.error(
            "%s: fenced (%s): %d waiting appends failed, later appends refused, nothing more "
            "written or acknowledged",
            error.data_dir,
            error.reason,
            failed,
        )
        for callback in self.on_fenced:
            try:
                callback(error)
            except Exception:
                log.exception("on_fenced callback %r failed", callback)

    def fail_waiters(self, error: BaseException) -> int:
        """Fail every waiter with ``error`` (none of them is durable and checked); returns how
        many were failed."""
        failed = 0
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(error)
                failed += 1
        return failed

    def write_held_back(self) -> None:
        """Write what the ``before_sync`` callers hold back (before a flush at close)."""
        for write_held_back in self.before_sync:
            write_held_back()

    def flush(self) -> None:
        """Blocking: make everything appended so far durable, indexes included."""
        self.commitlog.sync_to(self.commitlog.write_position)
        self.fsyncs += 1
        for index in self.queues.values():
            index.sync()

    def release_waiters(self) -> None:
        """Resolve every waiter: called after :meth:`flush` made them durable (at close, for
        waiters of a group commit that never ran)."""
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)

    async def flush_async(self) -> None:
        """The periodic flush of ``async`` durability: fdatasync what was appended since."""
        target = self.commitlog.write_position
        if target > self.commitlog.flushed_position:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self.executor, self.commitlog.sync_to, target
                )
            except StoreFenced as error:
                self.fence(error)
                return
            self.fsyncs += 1
