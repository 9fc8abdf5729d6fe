"""The MQTT session registry: which node holds each client id's connection (docs/cluster.md
sections 4 and 8).

Key, under the cluster's ``braid:<cluster_id>:`` prefix (core/cluster/redis_metadata.py):

  ``mqtt:session``  hash: client id -> JSON ``{"node": n, "incarnation": i, "gen": g}``, for
                    clean sessions too (a client id is connected on one node at a time,
                    whatever its session kind)

Every CONNECT :meth:`SessionRegistry.register`\\ s its client id with one script: it reads the
record, writes this node's with ``gen`` one above the old one (1 for a new client id) and
returns the new ``gen`` with the record it replaced. So two nodes connecting the same client id
at once get distinct generations, the later one the higher, and each learns whom it took the
client from: the caller then asks that node to close its connection
(core/cluster/rpc/takeover.py). A connection's ``gen`` is its identity in the cluster: the old
node closes only a connection older than the one taking over, and a clean disconnect removes
the record only if it is still its own (:meth:`SessionRegistry.release`). A registration
whose takeover failed (the old node lives but did not give the connection up) is undone by
:meth:`SessionRegistry.restore`, so the client's retry finds the old connection again; if
another node registered meanwhile the record stays its, and that node's takeover asks the
failed registrant, which holds nothing: the old connection then lives on until it ends by
itself (a narrow race of three CONNECTs, left as is).

``incarnation`` is written as a JSON integer by string formatting in the script: Lua's numbers
(and cjson) are doubles, which would round a 63-bit incarnation.

Persistent sessions whose shard another node owns (docs/cluster.md section 8): a session's queue
``__mqtt.session.<cid>`` and its saved state stay in their shards, whichever node the client
connects to. The owner's side is :class:`SessionAdminCalls` (three ``Admin`` calls: declare or
discard the queue, read a state, write one); the connecting node's side is
:class:`SessionsOverRpc` (``core.api.sessions.RemoteSessions``): writes of states go to their
owners one at a time in the order asked, and :meth:`SessionsOverRpc.written` waits for them (a
takeover answers only once the old node's last state is in its shard, so the new node reads
that one). The queue itself is consumed through ``Consume`` (core/cluster/remote_queues.py).

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from core.broker.node import Node
from core.broker.remote import ShardOwners
from core.cluster.placement import PLACE_SESSION
from core.cluster.redis_metadata import _Keys
from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.server import NodeService
from core.errors import ShardUnavailable

log = logging.getLogger(__name__)

# {"name": queue, "empty": bool, "discard": bool} -> {"created": bool}: declare a session
# queue of a shard the called node serves (``empty``: drop its backlog), or discard it.
ADMIN_SESSION_QUEUE: Final = "mqtt_session_queue"
# {"client_id": c} -> {"state": latin-1 text or None}: the session state saved in its shard.
ADMIN_SESSION_STATE_GET: Final = "mqtt_session_state_get"
# {"client_id": c, "state": latin-1 text or None} -> {}: save (None: delete) the state.
ADMIN_SESSION_STATE_PUT: Final = "mqtt_session_state_put"

# KEYS[1] mqtt:session; ARGV[1] client id, ARGV[2] node, ARGV[3] incarnation (decimal digits).
# Returns {new gen, the replaced record or ""}.
REGISTER: Final = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
local gen = 1
if old then gen = tonumber(cjson.decode(old)['gen']) + 1 end
redis.call('HSET', KEYS[1], ARGV[1],
  string.format('{"node":%d,"incarnation":%s,"gen":%d}', tonumber(ARGV[2]), ARGV[3], gen))
return {gen, old or ''}
"""

# KEYS[1] mqtt:session; ARGV[1] client id, ARGV[2] gen. Removes the record only if it still
# has that gen (a later connection elsewhere has replaced it otherwise). Returns 1 if removed.
RELEASE: Final = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current and tonumber(cjson.decode(current)['gen']) == tonumber(ARGV[2]) then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

# KEYS[1] mqtt:session; ARGV[1] client id, ARGV[2] gen, ARGV[3] the record to put back ("":
# none). Undoes a registration whose takeover failed, if nobody registered since. Returns 1 if
# undone.
RESTORE: Final = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current or tonumber(cjson.decode(current)['gen']) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1])
else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
return 1
"""


@dataclass(frozen=True, slots=True)
class SessionOwner:
    """Where a client id is (or was last) connected: the node, that node's incarnation when
    it registered the connection, and the connection's generation."""

    node: int
    incarnation: int
    gen: int


@dataclass(frozen=True, slots=True)
class Registration:
    """A CONNECT's registration: its ``gen``, and the connection it replaced (None: the client
    id was not connected anywhere, or released)."""

    gen: int
    previous: SessionOwner | None


class SessionRegistry:
    """``mqtt:session`` of one cluster. ``redis`` is a client the caller owns."""

    def __init__(self, redis: Redis, cluster_id: str) -> None:
        self._redis = redis
        self._key = _Keys(cluster_id).prefix + "mqtt:session"
        self._register = redis.register_script(REGISTER)
        self._release = redis.register_script(RELEASE)
        self._restore = redis.register_script(RESTORE)

    async def register(self, client_id: str, node: int, incarnation: int) -> Registration:
        """Record ``client_id`` as connected to ``node`` (of ``incarnation``), one generation
        above the record it replaces."""
        if node < 0 or incarnation < 0:
            raise ValueError("node ids and incarnations are not negative")
        gen, old = await self._register(keys=[self._key], args=[client_id, node, incarnation])
        return Registration(int(gen), _parse(old) if old else None)

    async def owner(self, client_id: str) -> SessionOwner | None:
        """The recorded connection of ``client_id``, if any."""
        record = await self._redis.hget(self._key, client_id)
        return None if record is None else _parse(record)

    async def holds(self, client_id: str, gen: int) -> bool:
        """Whether the connection of generation ``gen`` is still the recorded one (not taken
        over since)."""
        current = await self.owner(client_id)
        return current is not None and current.gen == gen

    async def release(self, client_id: str, gen: int) -> bool:
        """Remove the record at a clean disconnect, if it is still the connection of ``gen``.
        True if removed."""
        return bool(await self._release(keys=[self._key], args=[client_id, gen]))

    async def restore(self, client_id: str, gen: int, previous: SessionOwner | None) -> bool:
        """Put ``previous`` back in place of the registration ``gen`` whose takeover failed
        (the old connection still runs there, and the client's retry must find it), unless
        another connection registered since. True if restored."""
        record = "" if previous is None else _format(previous)
        return bool(await self._restore(keys=[self._key], args=[client_id, gen, record]))


def _format(owner: SessionOwner) -> str:
    return json.dumps(
        {"node": owner.node, "incarnation": owner.incarnation, "gen": owner.gen},
        separators=(",", ":"),
    )


def _parse(record: bytes | str) -> SessionOwner:
    fields = json.loads(record)
    return SessionOwner(int(fields["node"]), int(fields["incarnation"]), int(fields["gen"]))


# -- persistent sessions in other nodes' shards -------------------------------------------------


class SessionAdminCalls:
    """The owner's side of sessions whose client connects elsewhere (module docstring):
    :meth:`register` once on the node's service, :meth:`attach` each broker served."""

    def __init__(self) -> None:
        self._node: Node | None = None

    def attach(self, node: Node | None) -> None:
        self._node = node

    def register(self, service: NodeService) -> None:
        service.register(ADMIN_SESSION_QUEUE, self._queue)
        service.register(ADMIN_SESSION_STATE_GET, self._get)
        service.register(ADMIN_SESSION_STATE_PUT, self._put)

    def _serving(self) -> Node:
        node = self._node
        if node is None:
            raise RuntimeError("this node serves no broker now")
        return node

    async def _queue(self, args: JsonObject) -> JsonObject:
        node = self._serving()
        name = str(args["name"])
        if not node.queue_is_local(name):
            raise RuntimeError(f"this node does not serve the shard of {name!r}")
        if args.get("discard"):
            return {"created": False, "discarded": await node.discard_ack_queue(name) is not None}
        queue, created = await node.declare_ack_queue(name, 0)
        if created or args.get("empty"):
            queue.purge()
        return {"created": created}

    def _states(self, client_id: str) -> Node:
        node = self._serving()
        if node.shards.local(node.shards.placements.place(PLACE_SESSION, client_id)) is None:
            raise RuntimeError(f"this node does not serve the session shard of {client_id!r}")
        return node

    async def _get(self, args: JsonObject) -> JsonObject:
        client_id = str(args["client_id"])
        node = self._states(client_id)
        state = node.shards.for_session(client_id).session_states().table.get(client_id)
        return {"state": None if state is None else state.decode("latin-1")}

    async def _put(self, args: JsonObject) -> JsonObject:
        client_id = str(args["client_id"])
        states = self._states(client_id).shards.for_session(client_id).session_states()
        state = args.get("state")
        if state is None:
            states.delete(client_id)
        else:
            states.save(client_id, str(state).encode("latin-1"))
        return {}


class SessionsOverRpc:
    """``core.api.sessions.RemoteSessions`` over ``client`` and the shard ownership table
    (module docstring). A shard without a live owner, or an owner that does not answer, is
    :class:`ShardUnavailable`; a state write that fails is logged."""

    def __init__(self, client: RpcClient, owners: ShardOwners) -> None:
        self._client = client
        self._owners = owners
        self._puts: asyncio.Queue[tuple[int, str, bytes | None]] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    async def _admin(self, shard: int, name: str, args: JsonObject) -> JsonObject:
        owner = self._owners.owner_of(shard) or await self._owners.refresh(shard)
        if owner is None:
            raise ShardUnavailable(shard, reason="no live owner")
        try:
            return await self._client.admin(owner.rpc_address, name, args)
        except PeerUnavailable as error:
            await self._owners.refresh(shard)
            raise ShardUnavailable(shard, owner.node, str(error)) from error
        except Exception as error:  # the owner refused (a stale table: it lost the shard)
            await self._owners.refresh(shard)
            raise ShardUnavailable(shard, owner.node, str(error)) from error

    async def declare_queue(self, shard: int, name: str, *, empty: bool) -> bool:
        answer = await self._admin(shard, ADMIN_SESSION_QUEUE, {"name": name, "empty": empty})
        return bool(answer.get("created"))

    async def discard_queue(self, shard: int, name: str) -> bool:
        answer = await self._admin(shard, ADMIN_SESSION_QUEUE, {"name": name, "discard": True})
        return bool(answer.get("discarded"))

    async def load_state(self, shard: int, client_id: str) -> bytes | None:
        await self.written()  # this node's own last write of it first
        answer = await self._admin(shard, ADMIN_SESSION_STATE_GET, {"client_id": client_id})
        state = answer.get("state")
        return None if state is None else str(state).encode("latin-1")

    def save_state(self, shard: int, client_id: str, state: bytes | None) -> None:
        self._puts.put_nowait((shard, client_id, state))
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="braid-mqtt-cluster session states"
            )

    async def _write(self) -> None:
        while True:
            shard, client_id, state = await self._puts.get()
            args: JsonObject = {
                "client_id": client_id,
                "state": None if state is None else state.decode("latin-1"),
            }
            try:
                await self._admin(shard, ADMIN_SESSION_STATE_PUT, args)
            except Exception as error:  # logged: the next save writes the whole state again
                log.warning(
                    "mqtt cluster: state of session %r not saved in shard %d: %s",
                    client_id,
                    shard,
                    error,
                )
            finally:
                self._puts.task_done()

    async def written(self) -> None:
        """Returns once every state write asked for so far was answered (or failed)."""
        if self._writer is not None:
            await self._puts.join()

    async def aclose(self) -> None:
        """Stop the writer once the writes asked for are sent (bounded)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._puts.join()
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writer
