"""Errors the core raises to a gateway for a request that cannot be served, each carrying the
code the gateway maps to its protocol's answer (a Kafka error code, an AMQP reply code, an MQTT
reason code).

A module of its own, below every package of the core: ``core.broker`` and
``core.transactions.control`` both raise :class:`TopicError`, and neither may import the other
(``core.broker.broker`` imports ``core.transactions.control``).
"""

from __future__ import annotations


class TopicError(ValueError):
    """An invalid topic operation; ``code`` names the condition for the gateway to map."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ShardUnavailable(Exception):
    """The shard holding what a call needs has no live owner (docs/cluster.md section 11), or
    its owner did not answer in time. Retriable: the gateway answers with its protocol's
    retriable error (Kafka LEADER_NOT_AVAILABLE / NOT_LEADER_OR_FOLLOWER, an AMQP basic.nack or
    404 on a passive declare, MQTT 0x80 / CONNACK 0x88)."""

    def __init__(self, shard: int, owner: int | None = None, reason: str = "") -> None:
        what = f"shard {shard}" + (f" (owner node {owner})" if owner is not None else "")
        super().__init__(f"{what} is unavailable" + (f": {reason}" if reason else ""))
        self.shard = shard
        self.owner = owner


class NotLeader(Exception):
    """A Kafka partition request reached a node that does not own the partition's shard
    (section 8): the gateway answers NOT_LEADER_OR_FOLLOWER naming ``owner`` and ``epoch``.
    Other protocols never see it: their calls are forwarded to the owner."""

    def __init__(self, shard: int, owner: int | None, epoch: int) -> None:
        super().__init__(f"shard {shard} is led by node {owner} at epoch {epoch}")
        self.shard = shard
        self.owner = owner
        self.epoch = epoch
