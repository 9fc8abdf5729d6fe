"""ShardSet: shard number -> the :class:`~core.broker.shard.Shard` that serves it on this node
(docs/cluster.md sections 3 and 6), and :class:`DurableMarks`: when what a publish wrote to
several shards is durable.

A node serves some of its cluster's ``count`` shards (all of them when it is the only node).
The lookups name what is being placed (a queue, a consumer group, a session, a transaction);
with one shard (a single node, a root of one shard) every lookup answers it at no cost. With
several, a lookup resolves the thing's shard by :class:`~core.cluster.placement.Placements`
(the recorded placement, else the rule of its kind) and answers the local shard, or raises
:class:`~core.errors.ShardUnavailable` for a shard this node does not serve (step 6 of section
15 plugs shards of other nodes in behind :meth:`ShardSet.local`).

Kinds: a destination ``(topic, queue)`` (a Kafka partition, an AMQP queue, an MQTT session's or
``$share`` group's queue: the core sees them all as queues of topics) is placed by the
partition rule ``(h(topic) + queue) % S``; consumer groups, MQTT session states and
transactions by the hash of their id. Section 3 places an AMQP queue by ``vhost\\0name`` and a
session queue by its client id; the core does not know the gateways' names, so here they are
placed as the topic queues they are (the records, written at creation, keep every node in
agreement whatever the rule).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from core.broker.remote import Destination, ForwardResult
from core.cluster import placement
from core.errors import ShardUnavailable

if TYPE_CHECKING:  # (annotations only: shard.py does not import this module)
    from core.broker.shard import Shard

# Destinations whose shard is remembered (a dict lookup on the publish path instead of a hash
# of the topic name); cleared whole when full, as the log store's head caches are.
CACHED_PLACEMENTS = 65536
# Failed forwards remembered for their publish's wait: a wait comes at once after its publish
# (or its read's), so only a flood of failures (a dead owner) reaches this many.
FAILED_KEPT = 65536
# What settles one forward of a publish (DurableMarks.forwarded): its result or its error (a
# RemoteAppend.send's ForwardSettled, or a future's outcome).
Settle = Callable[[ForwardResult | None, BaseException | None], None]


class ShardSet:
    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        count: int | None = None,
        placements: placement.Placements | None = None,
    ) -> None:
        """``shards``: the local shards, each with its ``number``; ``count``: how many shards
        the cluster has (default: as many as given, numbered 0..n-1); ``placements``: the
        recorded placements (default: none recorded, the rules)."""
        count = len(shards) if count is None else count
        numbers = [shard.number for shard in shards]
        if (
            not shards
            or len(set(numbers)) != len(numbers)
            or not all(0 <= number < count for number in numbers)
        ):
            raise ValueError(f"local shards must be distinct numbers in 0..{count - 1}: {numbers}")
        self.count = count
        self.placements = placements or placement.Placements(count)
        if self.placements.shards != count:
            raise ValueError(f"placements over {self.placements.shards} shards, not {count}")
        self._local: dict[int, Shard] = {shard.number: shard for shard in shards}
        self._shards = tuple(sorted(shards, key=lambda shard: shard.number))
        # One shard: every lookup is it (the single node's publish path never looks up).
        self.single = count == 1
        # What has no placement yet (the log's settings and directory, the live feed, the
        # retained messages) is the lowest local shard's; section 3 gives retained slots
        # shards of their own.
        self.home = self._shards[0]
        self._queue_numbers: dict[tuple[str, int], int] = {}

    def __getitem__(self, number: int) -> Shard:
        """The local shard ``number``; :class:`ShardUnavailable` when this node does not
        serve it."""
        shard = self._local.get(number)
        if shard is None:
            raise ShardUnavailable(number, reason="not served by this node")
        return shard

    def add(self, shard: Shard) -> None:
        """Serve ``shard`` from now on (taken over from a node that died, issue 23). The home
        shard stays the one the node started with: its metadata and live feed are over it."""
        number = shard.number
        if not 0 <= number < self.count or number in self._local:
            raise ValueError(f"shard {number} is served already or not in 0..{self.count - 1}")
        self._local[number] = shard
        self._shards = tuple(sorted((*self._shards, shard), key=lambda s: s.number))

    def local(self, number: int) -> Shard | None:
        """The local shard ``number``, or None when another node serves it."""
        return self._local.get(number)

    def __iter__(self) -> Iterator[Shard]:
        """The shards this node serves, by number."""
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    # -- placement (section 3) -------------------------------------------------------------

    def queue_number(self, topic: str, queue: int) -> int:
        """The shard number of ``(topic, queue)``, local or not."""
        if self.single:
            return self.home.number
        key = (topic, queue)
        number = self._queue_numbers.get(key)
        if number is None:
            if len(self._queue_numbers) >= CACHED_PLACEMENTS:
                self._queue_numbers.clear()
            number = self._queue_numbers[key] = self.placements.place(
                placement.PLACE_PARTITION, placement.partition_key(topic, queue)
            )
        return number

    def record_queue(self, topic: str, queue: int, number: int) -> None:
        """``(topic, queue)`` was placed in shard ``number`` (its record applied)."""
        self.placements.record(
            placement.PLACE_PARTITION, placement.partition_key(topic, queue), number
        )
        self._queue_numbers.pop((topic, queue), None)

    def forget_queue(self, topic: str, queue: int) -> None:
        """``(topic, queue)`` was deleted: its placement goes with it."""
        self.placements.forget(placement.PLACE_PARTITION, placement.partition_key(topic, queue))
        self._queue_numbers.pop((topic, queue), None)

    def _placed(self, kind: str, name: str) -> Shard:
        if self.single:
            return self.home
        return self[self.placements.place(kind, name)]

    def for_queue(self, topic: str, queue: int) -> Shard:
        """The shard of ``(topic, queue)``: a Kafka partition, an AMQP queue, an MQTT session's
        or ``$share`` group's queue."""
        if self.single:
            return self.home
        return self[self.queue_number(topic, queue)]

    def for_group(self, group_id: str) -> Shard:
        """The shard of a Kafka consumer group (its coordinator and committed offsets)."""
        return self._placed(placement.PLACE_GROUP, group_id)

    def for_session(self, client_id: str) -> Shard:
        """The shard of an MQTT client's persistent session state."""
        return self._placed(placement.PLACE_SESSION, client_id)

    def for_transaction(self, transaction_id: str) -> Shard:
        """The shard of a transaction's half messages and their commit or rollback."""
        return self._placed(placement.PLACE_TXN, transaction_id)


class DurableMarks:
    """Durable marks across the shards of a node (docs/cluster.md section 6).

    With one shard a mark is a position in its log and the store waits for it (this class is
    not on that path). With several, a publish stores a record in each local shard its
    destinations sit in and forwards it to the others' owners, so no one position says when
    it is durable: its mark is then :meth:`next`, a node-local sequence number that only
    grows, and :meth:`wait` makes durable everything every local shard holds when it is called
    (which covers every record stored before: a mark is handed out after its appends) and
    waits for the forwards of every publish up to the mark. A mark from another source (a
    metadata change's position in the lowest shard's log) is covered the same way, so a
    gateway's ``max`` of marks stays right.

    The forwards are counted per mark (:meth:`forwarded`), not held as futures: the forwarder
    calls each one's settle function as the answers arrive, and one pass then wakes every
    wait whose marks are all answered (a future per wait, none per forward and no gather:
    those cost a forwarded publish's origin 15-20% of its CPU).

    A forward that failed (:class:`~core.errors.ShardUnavailable`) fails the wait for its own
    mark; an earlier one does not fail a later publish's wait (its own publisher was told).
    """

    def __init__(self, shards: Iterable[Shard]) -> None:
        """``shards``: the node's local shards (a :class:`ShardSet`: read at each wait, so a
        shard added later is covered)."""
        self._shards = shards
        self._sequence = 0
        # sequence -> how many forwards of that publish are unanswered; with _order (those
        # sequences in order, trimmed lazily) the lowest is found without a scan.
        self._unsettled: dict[int, int] = {}
        self._order: deque[int] = deque()
        # sequence -> why a forward of it failed, for its wait (the latest FAILED_KEPT).
        self._failed: dict[int, BaseException] = {}
        # (mark, tie-breaker, future) of the waits for forwards, lowest mark first.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._waits = 0

    def next(self) -> int:
        self._sequence += 1
        return self._sequence

    def forwarded(self, mark: int, count: int, refused: list[Destination]) -> Settle:
        """The publish ``mark`` (the latest :meth:`next`) has ``count`` forwards in flight;
        returns what settles each of them: the destinations a forward's owner refused are added
        to ``refused`` (the publish's outcome, read by a gateway after its wait)."""
        self._unsettled[mark] = count
        self._order.append(mark)

        def settled(result: ForwardResult | None, error: BaseException | None) -> None:
            if error is not None:
                self._fail(mark, error)
            elif result is not None and result.refused:
                refused.extend(result.refused)
            left = self._unsettled[mark] - 1
            if left:
                self._unsettled[mark] = left
                return
            del self._unsettled[mark]
            if self._waiters:
                self._wake()
            elif self._order[0] == mark:
                # Trimmed as they are answered even when nobody waits (a transient publish
                # is not waited for): _order stays as long as the forwards in flight.
                self._lowest()

        return settled

    def add_forwards(self, mark: int, forwards: list[asyncio.Future[ForwardResult]]) -> None:
        """:meth:`forwarded` for ``forwards``, futures of other calls of the publish ``mark``
        (the latest :meth:`next`); what they refused is the caller's to read."""
        settled = self.forwarded(mark, len(forwards), [])

        def done(future: asyncio.Future[ForwardResult]) -> None:
            if future.cancelled():
                settled(None, asyncio.CancelledError())
            else:
                error = future.exception()
                settled(None if error else future.result(), error)

        for future in forwards:
            future.add_done_callback(done)

    def _fail(self, mark: int, error: BaseException) -> None:
        failed = self._failed
        if mark in failed:
            return
        if len(failed) >= FAILED_KEPT:
            del failed[next(iter(failed))]
        failed[mark] = error

    def _lowest(self) -> int | None:
        """The lowest sequence with forwards unanswered, None when there is none."""
        order, unsettled = self._order, self._unsettled
        while order and order[0] not in unsettled:
            order.popleft()
        return order[0] if order else None

    def _wake(self) -> None:
        lowest = self._lowest()
        waiters = self._waiters
        while waiters and (lowest is None or waiters[0][0] < lowest):
            mark, _, future = heapq.heappop(waiters)
            if future.done():  # its wait was cancelled
                continue
            error = self._failed.get(mark)
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def failed(self, marks: Iterable[int]) -> dict[int, BaseException]:
        """Which of ``marks`` had a forward fail, with its error: a wait for the last of several
        marks does not raise for an earlier one's (the latest FAILED_KEPT failures are kept)."""
        failed = self._failed
        if not failed:
            return {}
        return {mark: failed[mark] for mark in marks if mark in failed}

    def is_durable(self, mark: int, topic: str | None = None) -> bool:
        """Whether :meth:`wait` would return at once."""
        for shard in self._shards:
            store = shard.store
            log = store.commitlog
            if log.flushed_position < log.write_position and (
                topic is None or store.is_sync(topic)
            ):
                return False
        if mark in self._failed:
            return False  # the wait raises
        lowest = self._lowest()
        return lowest is None or lowest > mark

    async def wait(self, mark: int, topic: str | None = None) -> None:
        """Everything stored so far in the local shards, and every forward of the publishes up
        to ``mark``, durable at ``topic``'s durability (class docstring)."""
        for shard in self._shards:
            store = shard.store
            await store.wait_durable(store.commitlog.write_position, topic)
        lowest = self._lowest()
        if lowest is not None and lowest <= mark:
            future = asyncio.get_running_loop().create_future()
            self._waits += 1
            heapq.heappush(self._waiters, (mark, self._waits, future))
            await future
            return
        error = self._failed.get(mark)
        if error is not None:
            raise error
