"""MQTT across the nodes of a cluster (docs/cluster.md section 8): the
:class:`~core.broker.remote.MqttCluster` the Broker API uses, over the pieces that exist on
their own:

- the route table of clean-session subscriptions (core/cluster/mqtt_routes.py): a route is
  written on this node's first live subscriber of a filter and removed on its last;
- the ``Deliver`` fan-out (core/cluster/rpc/fanout.py): a publish this node delivers live goes
  to each other node with matching routes once; a received Fanout goes to the Broker API's
  dispatch (the local subscribers, as a local publish);
- the session registry and ``TakeOverSession`` (core/cluster/mqtt_sessions.py,
  core/cluster/rpc/takeover.py): a CONNECT registers its client id and has the connection on
  another node closed by that node's gateway.

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
from typing import Any

from core.broker.remote import FanoutDispatch, SessionCloser, ShardOwners
from core.cluster.mqtt_routes import RouteTable
from core.cluster.mqtt_sessions import SessionRegistry
from core.cluster.rpc.fanout import FanoutReceiver, FanoutSender
from core.cluster.rpc.server import NodeService
from core.cluster.rpc.takeover import SessionTakeover, TakeOverHandler

log = logging.getLogger(__name__)

# Builds the node's SessionTakeover once the closer (this object's) is known.
TakeoverFactory = Callable[[SessionCloser], SessionTakeover]


class NodeMqttCluster:
    """One node's MQTT cluster side (see the module docstring). ``owners``: the shard
    ownership table (the forwarder's), None on a node that owns every shard."""

    def __init__(
        self,
        node: int,
        routes: RouteTable,
        sender: FanoutSender,
        registry: SessionRegistry,
        takeover: TakeoverFactory,
        owners: ShardOwners | None = None,
    ) -> None:
        self._node = node
        self.routes = routes
        self.sender = sender
        self.registry = registry
        self.takeover = takeover(self._close_session)
        self._owners = owners
        self.receiver = FanoutReceiver(self._dispatch)
        self.handler = TakeOverHandler(self._close_session)
        self._dispatch_to: FanoutDispatch | None = None
        self._close_to: SessionCloser | None = None
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
        await self.sender.aclose(grace_s=1.0)
