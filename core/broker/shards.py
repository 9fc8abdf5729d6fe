"""ShardSet: shard number -> the :class:`~core.broker.shard.Shard` that serves it on this node
(docs/cluster.md section 6).

Step 2 of section 15: a node has one shard, number 0, and it is local; every lookup answers it.
The lookups already name what is being placed (a queue, a consumer group, a session, a
transaction), so that placement (section 3: a hash of the name, recorded when it is created;
step 3) and shards of other nodes (a ``RemoteShard`` with the same surface, or
``Unavailable``; step 6) come in behind them without changing their callers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: shard.py does not import this module)
    from core.broker.shard import Shard


class ShardSet:
    def __init__(self, shards: Sequence[Shard]) -> None:
        numbers = [shard.number for shard in shards]
        if numbers != list(range(len(shards))) or not shards:
            raise ValueError(f"shards must be numbered 0..n-1, got {numbers}")
        self._shards = tuple(shards)
        # What has no placement yet (the log's settings and directory, the live feed, the
        # retained messages) is shard 0's; section 3 gives retained slots shards of their own.
        self.home = self._shards[0]

    def __getitem__(self, number: int) -> Shard:
        return self._shards[number]

    def __iter__(self) -> Iterator[Shard]:
        """The shards this node serves, by number."""
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    # -- placement (section 3): one shard for now ---------------------------------------

    def for_queue(self, topic: str, queue: int) -> Shard:
        """The shard of ``(topic, queue)``: a Kafka partition, an AMQP queue, an MQTT session's
        or ``$share`` group's queue."""
        return self.home

    def for_group(self, group_id: str) -> Shard:
        """The shard of a Kafka consumer group (its coordinator and committed offsets)."""
        return self.home

    def for_session(self, client_id: str) -> Shard:
        """The shard of an MQTT client's persistent session state."""
        return self.home

    def for_transaction(self, transaction_id: str) -> Shard:
        """The shard of a transaction's half messages and their commit or rollback."""
        return self.home
