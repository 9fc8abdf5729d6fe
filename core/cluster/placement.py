"""Placement: which shard of a cluster holds a queue-like thing (docs/cluster.md section 3).

Every kind has one fixed rule over the cluster's shard count ``S``, a hash of the thing's name:
``h(s)`` is Kafka's murmur2 of the UTF-8 bytes, ``& 0x7fffffff`` (``core/broker/partitioner.py``,
the hash every Kafka client uses to pick a partition), stable across processes and Python
versions, which Python's salted ``hash()`` is not.

| kind (``place:<kind>`` in Redis) | name | shard |
|---|---|---|
| ``partition``: a topic's queue ``q`` | :func:`partition_key` ``(t, q)`` | ``(h(t) + q) % S`` |
| ``queue``: an AMQP queue | :func:`queue_key` ``(vhost, name)`` | ``h(vhost + "\\0" + name) % S`` |
| ``queue``, exclusive | the same | a shard the declaring node owns, else the hash rule |
| ``session``: an MQTT persistent session | client id | ``h(cid) % S`` |
| ``share``: a ``$share`` group queue | :func:`share_key` ``(group, filter)`` | ``h(key) % S`` |
| ``group``: a Kafka consumer group | group id | ``h(id) % S`` |
| ``txn``: a transaction coordinator | transactional id | ``h(id) % S`` |
| ``retained``: a retained-message slot | MQTT topic name | ``h(name) % S`` |

A placement is computed once, when the thing is created, and *recorded* (Redis ``place:<kind>``,
written with the definition); readers use the recorded value (:class:`Placements`), because it
may differ from the rule: an adopted single-node directory keeps everything in its legacy shard,
an exclusive queue sits on its declaring node, and a later move changes the record, not the rule.
Pure functions, no I/O; not thread-safe (a node's event loop owns its :class:`Placements`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from core.broker.partitioner import murmur2

# The kinds of placement: the ``<kind>`` of the Redis hashes ``place:<kind>`` (section 4).
PLACE_PARTITION: Final = "partition"
PLACE_QUEUE: Final = "queue"
PLACE_SESSION: Final = "session"
PLACE_SHARE: Final = "share"
PLACE_GROUP: Final = "group"
PLACE_TXN: Final = "txn"
PLACE_RETAINED: Final = "retained"
PLACE_KINDS: Final = (
    PLACE_PARTITION,
    PLACE_QUEUE,
    PLACE_SESSION,
    PLACE_SHARE,
    PLACE_GROUP,
    PLACE_TXN,
    PLACE_RETAINED,
)

# Separates the parts of a two-part name: NUL appears in no topic, vhost or queue name a
# client can declare, and core/cluster/metadata.py's queue keys use it the same way.
KEY_SEPARATOR: Final = "\0"
_POSITIVE: Final = 0x7FFFFFFF  # Kafka's Utils.toPositive


def key_hash(key: str) -> int:
    """``h(key)``: Kafka's murmur2 of the UTF-8 bytes, made non-negative as Kafka does."""
    return murmur2(key.encode()) & _POSITIVE


def _check_shards(shards: int) -> None:
    if shards < 1:
        raise ValueError(f"a cluster has at least one shard, not {shards}")


# -- names of two-part things: the keys of their place:<kind> entries ----------------------------


def partition_key(topic: str, queue: int) -> str:
    """The placement name of queue (partition) ``queue`` of ``topic``."""
    return f"{topic}{KEY_SEPARATOR}{queue}"


def split_partition_key(name: str) -> tuple[str, int]:
    topic, separator, queue = name.rpartition(KEY_SEPARATOR)
    if not separator or not queue.isdigit():
        raise ValueError(f"not a partition placement name: {name!r}")
    return topic, int(queue)


def queue_key(vhost: str, name: str) -> str:
    """The placement name of the AMQP queue ``name`` of ``vhost``."""
    return f"{vhost}{KEY_SEPARATOR}{name}"


def share_key(group: str, topic_filter: str) -> str:
    """The placement name of the ``$share/<group>/<filter>`` queue. A share name holds no
    ``/`` [MQTT-4.8.2-2], so the first ``/`` ends it and the key is unambiguous."""
    return f"{group}/{topic_filter}"


# -- the rule of each kind ---------------------------------------------------------------------


def partition_shard(topic: str, queue: int, shards: int) -> int:
    """``(h(topic) + queue) % S``: consecutive partitions on consecutive shards, so a topic of
    up to ``S`` partitions has each on its own shard, whatever its name hashes to."""
    _check_shards(shards)
    if queue < 0:
        raise ValueError(f"a queue number is not negative: {queue}")
    return (key_hash(topic) + queue) % shards


def hash_shard(key: str, shards: int) -> int:
    """``h(key) % S``: the rule of every kind but partitions, given the kind's key."""
    _check_shards(shards)
    return key_hash(key) % shards


def queue_shard(vhost: str, name: str, shards: int) -> int:
    return hash_shard(queue_key(vhost, name), shards)


def exclusive_queue_shard(vhost: str, name: str, shards: int, own_shards: Iterable[int]) -> int:
    """An exclusive queue dies with its connection, so it sits on the declaring node, as
    RabbitMQ places it: the ``h(key) % len(own)``-th of the node's sorted shards. A node that
    owns no shard (a proxy node) places it by the hash rule."""
    _check_shards(shards)
    own = sorted(set(own_shards))
    for shard in own:
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is not one of the cluster's {shards}")
    if not own:
        return queue_shard(vhost, name, shards)
    return own[key_hash(queue_key(vhost, name)) % len(own)]


def session_shard(client_id: str, shards: int) -> int:
    return hash_shard(client_id, shards)


def share_shard(group: str, topic_filter: str, shards: int) -> int:
    return hash_shard(share_key(group, topic_filter), shards)


def group_shard(group_id: str, shards: int) -> int:
    return hash_shard(group_id, shards)


def transaction_shard(transactional_id: str, shards: int) -> int:
    return hash_shard(transactional_id, shards)


def retained_shard(topic: str, shards: int) -> int:
    return hash_shard(topic, shards)


def rule_shard(kind: str, name: str, shards: int) -> int:
    """The rule of ``kind`` applied to its placement ``name`` (for a partition, the name made
    by :func:`partition_key`; for an AMQP queue, by :func:`queue_key`)."""
    if kind == PLACE_PARTITION:
        topic, queue = split_partition_key(name)
        return partition_shard(topic, queue, shards)
    if kind not in PLACE_KINDS:
        raise ValueError(f"unknown placement kind {kind!r} (one of {', '.join(PLACE_KINDS)})")
    return hash_shard(name, shards)


class Placements:
    """The placements recorded for a cluster (kind -> name -> shard), as read from Redis'
    ``place:<kind>`` hashes and kept current by the metadata watch.

    :meth:`shard_of` answers from the record only. :meth:`place` decides where a thing being
    created goes; the caller records the answer with the definition (:meth:`record` once the
    change is applied), so every node afterwards reads the same shard."""

    def __init__(
        self,
        shards: int,
        *,
        legacy_shard: int | None = None,
        recorded: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        _check_shards(shards)
        if legacy_shard is not None and not 0 <= legacy_shard < shards:
            raise ValueError(f"legacy shard {legacy_shard} is not one of the {shards} shards")
        self.shards = shards
        self.legacy_shard = legacy_shard
        self._recorded: dict[str, dict[str, int]] = {kind: {} for kind in PLACE_KINDS}
        for kind, names in (recorded or {}).items():
            for name, shard in names.items():
                self.record(kind, name, shard)

    def shard_of(self, kind: str, name: str) -> int | None:
        """The recorded shard of ``name``, or None when nothing of that name is placed."""
        return self._names(kind).get(name)

    def place(
        self,
        kind: str,
        name: str,
        *,
        own_shards: Iterable[int] | None = None,
        existing: bool = False,
    ) -> int:
        """Where ``name`` of ``kind`` is (when recorded) or goes: the kind's rule.

        ``own_shards``: the declaring node's shards, for an exclusive AMQP queue.
        ``existing``: the thing predates the adoption of a single-node directory (section 2's
        ``--adopt``), so it stays in the legacy shard where its data already is; on a root
        created empty (no legacy shard) the rule applies."""
        recorded = self.shard_of(kind, name)
        if recorded is not None:
            return recorded
        if existing and self.legacy_shard is not None:
            self._names(kind)  # the kind must still be a known one
            return self.legacy_shard
        if own_shards is not None:
            if kind != PLACE_QUEUE:
                raise ValueError(f"only AMQP queues are placed on the declaring node, not {kind}")
            vhost, _, queue = name.partition(KEY_SEPARATOR)
            return exclusive_queue_shard(vhost, queue, self.shards, own_shards)
        return rule_shard(kind, name, self.shards)

    def record(self, kind: str, name: str, shard: int) -> None:
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is not one of the {self.shards} shards")
        self._names(kind)[name] = shard

    def forget(self, kind: str, name: str) -> None:
        """The thing was deleted: its placement goes with its definition."""
        self._names(kind).pop(name, None)

    def items(self, kind: str) -> dict[str, int]:
        """A copy of the recorded placements of ``kind``."""
        return dict(self._names(kind))

    def _names(self, kind: str) -> dict[str, int]:
        try:
            return self._recorded[kind]
        except KeyError:
            raise ValueError(
                f"unknown placement kind {kind!r} (one of {', '.join(PLACE_KINDS)})"
            ) from None
