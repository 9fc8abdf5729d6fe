"""MQTT across the nodes of a cluster (docs/cluster.md section 8): the
:class:`~core.broker.remote.MqttCluster` the Broker API uses, over the pieces that exist on
their own:

- the route table of clean-session subscriptions (core/cluster/mqtt_routes.py): a route is
  written on this node's first live subscriber of a filter and removed on its last;
- the ``Deliver`` fan-out (core/cluster/rpc/fanout.py): a publish this node delivers live goes
  to each other node with matching routes once; a received Fanout goes to the Broker API's
  dispatch (the local subscribers, as a local publish). A record of another protocol (AMQP,
  Kafka) is fanned out by the owner of its shard, whose live feed reads it back
  (:meth:`NodeMqttCluster.others_want` says which topics it reads back for other nodes);
- the session registry and ``TakeOverSession`` (core/cluster/mqtt_sessions.py,
  core/cluster/rpc/takeover.py): a CONNECT registers its client id and has the connection on
  another node closed by that node's gateway;
- the nodes with members of each ``$share`` group (core/cluster/mqtt_shares.py), so the last
  member's node deletes the group's queue only when no other node has members;
- the wills of this node's connections in ``mqtt:wills:<node>`` (core/cluster/mqtt_wills.py).

The process that assembles a cluster node builds one per node, plugs :meth:`attach` into the
node's gRPC service and hands it to ``BrokerAPI.set_mqtt_cluster``.

Route writes are background tasks, in the order asked: :meth:`RouteTable.subscribe` counts
the local subscriber when it starts and writes the membership the node has *now*, so an add
and a remove of one filter in quick succession end in the right state whatever the order
their writes reach Redis in. A failed write is logged; the table rewrites this node's whole set
after each reconnect.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final

from core.api.sessions import local_retained_matching
from core.broker.node import Node
from core.broker.remote import FanoutDispatch, OrphanedWillPublisher, SessionCloser, ShardOwners
from core.cluster.mqtt_routes import RouteTable
from core.cluster.mqtt_sessions import SessionAdminCalls, SessionRegistry, SessionsOverRpc
from core.cluster.mqtt_shares import ShareMembers
from core.cluster.mqtt_wills import WillBook
from core.cluster.placement import PLACE_RETAINED
from core.cluster.rpc.client import RpcClient
from core.cluster.rpc.fanout import FanoutReceiver, FanoutSender
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.server import NodeService
from core.cluster.rpc.takeover import SessionTakeover, TakeOverHandler

log = logging.getLogger(__name__)

# {"topic": t, "value": latin-1 text or None} -> {}: set or clear a retained message in the
# topic's slot shard, which the called node serves.
ADMIN_RETAINED_PUT: Final = "retained_put"
# {"filter": f, "shards": [n, ...]} -> {"found": [[topic, latin-1 value], ...]}: what the
# called node's shards among ``shards`` retain matching the filter.
ADMIN_RETAINED_MATCH: Final = "retained_match"

# Builds the node's SessionTakeover once the closer (this object's) is known.
TakeoverFactory = Callable[[SessionCloser], SessionTakeover]


class NodeMqttCluster:
    """One node's MQTT cluster side (see the module docstring). ``owners``: the shard
    ownership table (the forwarder's), None on a node that owns every shard. Without
    ``shares`` this node's groups are its own (their queues go with its last member); without
    ``wills`` wills are not written down."""

    def __init__(
        self,
        node: int,
        routes: RouteTable,
        sender: FanoutSender,
        registry: SessionRegistry,
        takeover: TakeoverFactory,
        owners: ShardOwners | None = None,
        *,
        shares: ShareMembers | None = None,
        wills: WillBook | None = None,
    ) -> None:
        self._node = node
        self.shares = shares
        self.wills = wills
        self.routes = routes
        self.sender = sender
        self.registry = registry
        self.takeover = takeover(self._close_session)
        self._owners = owners
        self.receiver = FanoutReceiver(self._dispatch)
        self.handler = TakeOverHandler(self._close_session)
        self._dispatch_to: FanoutDispatch | None = None
        self._close_to: SessionCloser | None = None
        self._publish_orphan: OrphanedWillPublisher | None = None
        self._pending: set[asyncio.Task[Any]] = set()

    @property
    def node(self) -> int:
        return self._node

    def attach(self, service: NodeService) -> None:
        """Answer ``Deliver`` and ``TakeOverSession`` on this node's gRPC service."""
        service.deliver = self.receiver.deliver
        service.take_over_session = self.handler.take_over_session

    def handle(self, dispatch: FanoutDispatch, close_session: SessionCloser) -> None:
        self._dispatch_to = dispatch
        self._close_to = close_session

    # -- routes --------------------------------------------------------------------------

    def add_route(self, topic_filter: str) -> None:
        self._spawn(self.routes.subscribe(topic_filter), f"route + {topic_filter!r}")

    def remove_route(self, topic_filter: str) -> None:
        self._spawn(self.routes.unsubscribe(topic_filter), f"route - {topic_filter!r}")

    async def routes_written(self) -> None:
        pending = list(self._pending)
        if pending:
            await asyncio.wait(pending)

    def nodes_for(self, topic: str) -> set[int]:
        return self.routes.nodes_for(topic)

    def others_want(self, log_topic: str) -> bool:
        """Whether another node has a route a record of ``log_topic`` may match: this node's
        live feed then reads such records back even with no local subscriber, to fan them
        out (records of other protocols reach every node only from their shard's owner)."""
        return self.routes.others_want(log_topic)

    def owner_of(self, shard: int) -> int | None:
        if self._owners is None:
            return self._node
        owner = self._owners.owner_of(shard)
        return None if owner is None else owner.node

    # -- fan-out -------------------------------------------------------------------------

    def send(self, node: int, mqtt_topic: str, fields: bytes, qos: int) -> None:
        self.sender.send(node, mqtt_topic, fields, qos)

    def _dispatch(self, mqtt_topic: str, fields: bytes, qos: int) -> None:
        dispatch = self._dispatch_to
        if dispatch is not None:
            dispatch(mqtt_topic, fields, qos)

    # -- sessions ------------------------------------------------------------------------

    async def connect(self, client_id: str) -> int:
        connected = await self.takeover.connect(client_id)
        return connected.gen

    def release(self, client_id: str, gen: int) -> None:
        self._spawn(self.registry.release(client_id, gen), f"release of {client_id!r}")

    # -- $share groups and wills ---------------------------------------------------------

    # (Redis failures are logged: a group's queue is then kept, never deleted under others.)

    async def share_joined(self, name: str) -> None:
        if self.shares is not None:
            try:
                await self.shares.joined(name)
            except Exception as error:
                log.warning("mqtt cluster: members of %r not written: %s", name, error)

    async def share_left(self, name: str) -> bool:
        if self.shares is None:
            return True
        try:
            return await self.shares.left(name)
        except Exception as error:
            log.warning("mqtt cluster: %r kept, members unknown: %s", name, error)
            return False

    async def share_elsewhere(self, name: str) -> bool:
        if self.shares is None:
            return False
        try:
            return await self.shares.elsewhere(name)
        except Exception as error:
            log.warning("mqtt cluster: %r kept, members unknown: %s", name, error)
            return True

    def hold_will(self, client_id: str, will: bytes | None) -> None:
        if self.wills is not None:
            self.wills.hold(client_id, will)

    def on_orphaned_will(self, publish: OrphanedWillPublisher | None) -> None:
        self._publish_orphan = publish

    def adopt_orphans(self) -> None:
        """This node took shards over (issue 23): take the wills of dead nodes (those whose
        lease is gone) and hand them to the gateway to publish, and remove those nodes from
        the ``$share`` groups; in the background. Without a gateway hook the wills are left for
        another node."""
        if self.wills is not None and self._publish_orphan is not None:
            self._spawn(self._adopt_orphans(self.wills), "a dead node's wills")
        if self.shares is not None:
            self._spawn(self.shares.forget_dead(), "a dead node's $share entries")

    async def _adopt_orphans(self, wills: WillBook) -> None:
        taken = await wills.take_orphaned()
        for client_id, will in taken.items():
            publish = self._publish_orphan
            if publish is None:
                log.warning("mqtt cluster: will of %r lost: the gateway closed", client_id)
                continue
            try:
                publish(client_id, will)
            except Exception:
                log.exception("mqtt cluster: will of %r not published", client_id)

    async def _close_session(self, client_id: str, gen: int, new_node: int) -> bool:
        close = self._close_to
        if close is None:
            return False  # no gateway here: no connection to close
        return await close(client_id, gen, new_node)

    # -- lifecycle -----------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=f"braid-mqtt-cluster {what}")
        self._pending.add(task)
        task.add_done_callback(lambda done: self._done(done, what))

    def _done(self, task: asyncio.Task[Any], what: str) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("mqtt cluster: %s failed: %s", what, task.exception())

    async def aclose(self) -> None:
        """Let the route writes and releases asked for finish (bounded), then stop the
        fan-out. The route table, registry and clients stay the caller's."""
        pending = list(self._pending)
        if pending:
            await asyncio.wait(pending, timeout=2.0)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.wills is not None:
            await self.wills.aclose()
        if self.shares is not None:
            try:
                async with asyncio.timeout(2.0):
                    await self.shares.leave_all()
            except Exception as error:
                log.warning("mqtt cluster: $share entries of this node kept: %r", error)
        await self.sender.aclose(grace_s=1.0)


class RetainedAdminCalls:
    """The owner's side of retained messages across nodes: the ``Admin`` calls
    :data:`ADMIN_RETAINED_PUT` and :data:`ADMIN_RETAINED_MATCH` over the broker this node
    serves now (:meth:`register` once on the node's service, :meth:`attach` each broker);
    with them, persistent sessions' queues and states (core/cluster/mqtt_sessions.py)."""

    def __init__(self) -> None:
        self._node: Node | None = None
        self.sessions = SessionAdminCalls()

    def attach(self, node: Node | None) -> None:
        self._node = node
        self.sessions.attach(node)

    def register(self, service: NodeService) -> None:
        service.register(ADMIN_RETAINED_PUT, self._put)
        service.register(ADMIN_RETAINED_MATCH, self._match)
        self.sessions.register(service)

    async def _put(self, args: JsonObject) -> JsonObject:
        node = self._node
        if node is None:
            raise RuntimeError("this node serves no broker now")
        topic = str(args["topic"])
        shard = node.shards.local(node.shards.placements.place(PLACE_RETAINED, topic))
        if shard is None:
            raise RuntimeError(f"this node does not serve the retained slot of {topic!r}")
        value = args.get("value")
        shard.retained().put(topic, None if value is None else str(value).encode("latin-1"))
        return {}

    async def _match(self, args: JsonObject) -> JsonObject:
        node = self._node
        if node is None:
            return {"found": []}
        wanted = {int(n) for n in args.get("shards", ())}
        found = [
            [topic, value.decode("latin-1")]
            for topic, value in local_retained_matching(node.shards, str(args["filter"]))
            if node.shards.placements.place(PLACE_RETAINED, topic) in wanted
        ]
        return {"found": found}


class RetainedOverRpc:
    """``core.api.sessions.RemoteRetained`` over ``client`` and the shard ownership table:
    puts go to the slot's owner one at a time, in the order asked (a set then a clear of one
    topic end cleared); a match asks each owner of the shards once, in parallel. ``sessions``:
    persistent sessions' queues and states in other nodes' shards, over the same client."""

    def __init__(self, client: RpcClient, owners: ShardOwners) -> None:
        self._client = client
        self._owners = owners
        self.sessions = SessionsOverRpc(client, owners)
        self._puts: asyncio.Queue[tuple[int, str, bytes | None]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    def put(self, shard: int, topic_name: str, value: bytes | None) -> None:
        self._puts.put_nowait((shard, topic_name, value))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="braid-mqtt-cluster retained puts"
            )

    async def _write(self) -> None:
        while True:
            shard, topic, value = await self._puts.get()
            args: JsonObject = {
                "topic": topic,
                "value": None if value is None else value.decode("latin-1"),
            }
            try:
                address = await self._address(shard)
                if address is None:
                    raise RuntimeError(f"shard {shard} has no live owner")
                await self._client.admin(address, ADMIN_RETAINED_PUT, args)
            except Exception as error:  # logged: a retained message is not acknowledged
                log.warning(
                    "mqtt cluster: retained %r not stored in shard %d: %s", topic, shard, error
                )
            finally:
                self._puts.task_done()

    async def _address(self, shard: int) -> str | None:
        owner = self._owners.owner_of(shard) or await self._owners.refresh(shard)
        return None if owner is None else owner.rpc_address

    async def matching(self, topic_filter: str, shards: list[int]) -> list[tuple[str, bytes]]:
        by_address: dict[str, list[int]] = {}
        for shard in shards:
            address = await self._address(shard)
            if address is not None:
                by_address.setdefault(address, []).append(shard)
        answers = await asyncio.gather(
            *(
                self._client.admin(
                    address, ADMIN_RETAINED_MATCH, {"filter": topic_filter, "shards": numbers}
                )
                for address, numbers in by_address.items()
            ),
            return_exceptions=True,
        )
        found: list[tuple[str, bytes]] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                log.warning("mqtt cluster: retained match of %r failed: %s", topic_filter, answer)
                continue
            found += [(str(t), str(v).encode("latin-1")) for t, v in answer.get("found", ())]
        return found

    async def aclose(self) -> None:
        """Stop the writers once the puts asked for are sent (bounded)."""
        await self.sessions.aclose()
        writer, self._writer = self._writer, None
        if writer is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._puts.join()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writer
