"""The Broker API's own types (:class:`ClientContext`, :class:`PublishOutcome`,
:class:`Publication`) and the calls every protocol uses: publish, durability, topics.

The contract is in ``core/api/__init__.py``."""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
from collections.abc import (
    Awaitable,
    Generator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Final

from core.broker.broker import (
    Destination,
    PublishResult,
)
from core.broker.eager import Pending, run_eagerly
from core.broker.node import Node
from core.broker.topics import TopicInfo
from core.log import record as rec

# -- value types and constants of the boundary ------------------------------------------------

PROTOCOL_INTERNAL: Final = rec.PROTOCOL_INTERNAL
PROTOCOL_AMQP: Final = rec.PROTOCOL_AMQP
PROTOCOL_MQTT: Final = rec.PROTOCOL_MQTT
PROTOCOL_KAFKA: Final = rec.PROTOCOL_KAFKA
Headers = rec.Headers


@dataclass(frozen=True, slots=True)
class ClientContext:
    """Who is calling: one per connection (or per session), passed with every call.

    ``protocol`` is one of the ``PROTOCOL_*`` codes; ``vhost`` is the AMQP virtual host (``/``
    for MQTT and Kafka, whose names map into vhosts as docs/security.md says); ``user`` the
    authenticated user name (``""``: anonymous); ``peer`` the client's ``host:port``;
    ``connection_id`` names the connection in logs and in the management API; ``client_id`` is
    the protocol's own client name (MQTT client id, Kafka ``client.id``, AMQP
    ``connection_name``) recorded with each record it publishes.
    """

    protocol: int
    vhost: str = "/"
    user: str = ""
    peer: str = ""
    connection_id: str = ""
    client_id: str = ""


# The context of what the broker does on its own behalf (timers, dead letters, tools).
INTERNAL_CONTEXT: Final = ClientContext(PROTOCOL_INTERNAL, connection_id="internal")


# What became of one publish once it is stored: ``offset`` in its topic's own queue ``queue``
# (-1 for a half message, which gets its offset when committed); ``refused``: destinations that
# refused it (an AMQP queue at ``x-overflow: reject-publish``; a transaction outcome that could
# not be applied), which AMQP answers with a nack; ``delivered_to``: every destination it was
# indexed in (its topic's own queue first); ``half``; ``durable_mark``: what
# :meth:`BrokerCalls.when_durable` takes to wait for this record and everything stored before
# it. The broker's own result, handed out as a value (its lists were made for this publish):
# one object per publish, where a copy into a frozen dataclass cost 6.8% of the broker's CPU
# under MQTT QoS 0 (py-spy, bench mqtt, 2026-11-26).
PublishOutcome = PublishResult


class Publication(Awaitable[PublishOutcome]):
    """The durability handle :meth:`BrokerAPI.publish` returns.

    ``stored``: the record is in the log (always, unless flow control held the publish back);
    then ``outcome`` says where it went. Awaiting the handle returns the outcome once the record
    is durable at its topic's durability (at once for an ``async`` topic). Await it at most once.
    """

    __slots__ = ("_api", "_outcome", "_pending", "_topic")

    def __init__(
        self,
        api: BrokerCalls,
        topic: str,
        outcome: PublishOutcome | None,
        pending: Pending[PublishResult] | None,
    ) -> None:
        self._api = api
        self._topic = topic
        self._outcome = outcome
        self._pending = pending

    @property
    def stored(self) -> bool:
        return self._outcome is not None

    @property
    def outcome(self) -> PublishOutcome:
        """Where the record went; only once ``stored`` (else :class:`RuntimeError`)."""
        if self._outcome is None:
            raise RuntimeError("publish held back by flow control: await the publication")
        return self._outcome

    def __await__(self) -> Generator[Any, Any, PublishOutcome]:
        outcome = self._outcome
        if outcome is None:
            assert self._pending is not None
            result = yield from self._pending.__await__()
            outcome = self._outcome = result
        yield from self._api.when_durable(outcome.durable_mark, self._topic).__await__()
        return outcome

    def cancel(self) -> None:
        """Give up a publish held back by flow control (the connection closed)."""
        if self._pending is not None and self._outcome is None:
            self._pending.close()


@dataclass(frozen=True, slots=True)
class DiskStatus:
    """The disk alarm's state (``core/log/diskspace.py``): bytes free on the log's volume at
    the last check, ``disk_free_limit_bytes`` (None: the alarm is off), whether it is on."""

    free_bytes: int
    limit_bytes: int | None
    alarm: bool


class BrokerCalls:
    """What every protocol uses: publish, durability, topics; the other parts of
    :class:`core.api.BrokerAPI` build on it."""

    def __init__(self, node: Node) -> None:
        # The node's calls, and through its ShardSet the shard each one is for (one shard,
        # number 0, in step 2 of docs/cluster.md section 15).
        self._node = node

    # -- publishing ----------------------------------------------------------------------------

    def publish(
        self,
        context: ClientContext,
        topic: str,
        body: bytes | memoryview | None,
        *,
        queue: int | None = None,
        key: bytes | None = None,
        subject: str = "",
        headers: Headers = (),
        routing_headers: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        address: str = "",
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        extra_destinations: Sequence[Destination] = (),
        create_topic: bool | None = None,
    ) -> Publication:
        """Route and store one record now; the handle is awaited for durability.

        Raises :class:`TopicError` for an unknown topic (unless auto-created) or queue.
        """
        started = run_eagerly(
            self._node.publish(
                topic,
                body,
                queue=queue,
                key=key,
                subject=subject,
                headers=headers,
                routing_headers=routing_headers,
                tags=tags,
                protocol=context.protocol,
                client=context.client_id,
                address=address,
                born_ms=born_ms,
                deliver_at_ms=deliver_at_ms,
                extra_destinations=extra_destinations,
                create_topic=create_topic,
                wait_durable=False,
            )
        )
        if isinstance(started, Pending):
            return Publication(self, topic, None, started)
        return Publication(self, topic, started, None)

    def when_durable(self, durable_mark: int, topic: str | None = None) -> Awaitable[None]:
        """Wait until everything stored up to ``durable_mark`` (a
        :attr:`PublishOutcome.durable_mark`) is durable at ``topic``'s durability (the sync
        durability when no topic is given). Marks only grow: waiting for the last of several
        publishes covers them all."""
        # One shard: the mark is a position in its log and this is its store's wait_durable;
        # many: a node-local sequence over its shards (core/broker/shards.py:DurableMarks).
        # Chosen once by the node: no lookup on this per-publish path.
        return self._node.when_durable(durable_mark, topic)

    # -- the disk alarm ------------------------------------------------------------------------

    def disk_alarm(self) -> bool:
        """The disk alarm is on: free space on the log's volume is below
        ``disk_free_limit_bytes``. Flow control blocks publishers then (``publishing_blocked``);
        a protocol that can refuse a publish for the client to retry answers it at once
        instead of waiting: MQTT 5 PUBACK 0x97 Quota exceeded, Kafka KAFKA_STORAGE_ERROR."""
        return self._node.flow.disk_alarm

    def disk_status(self) -> DiskStatus:
        """Free bytes, the limit and the alarm, for /health and /metrics (many shards: the
        lowest local one's; the shards of a root share its file system)."""
        space = self._node.shards.home.store.disk_space
        return DiskStatus(space.free_bytes, space.limit_bytes, space.alarm)

    def may_accept_connection(self) -> bool:
        """Whether a new client connection may be kept: False near the process's descriptor
        limit (the log's share kept free, core/broker/flow.py); the gateway then refuses it
        the way its protocol can (AMQP: closed; MQTT: CONNACK Server busy / Server
        unavailable; Kafka: closed), with a log line."""
        return self._node.flow.descriptors.may_open_connection()

    # -- topics --------------------------------------------------------------------------------

    def topic_info(self, context: ClientContext, name: str) -> TopicInfo | None:
        """The topic's description (a value), or None when there is none."""
        return self._node.topics.get(name)

    def has_topic(self, context: ClientContext, name: str) -> bool:
        return name in self._node.topics
