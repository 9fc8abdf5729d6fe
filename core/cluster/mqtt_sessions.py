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

Not thread-safe: one event loop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from core.cluster.redis_metadata import _Keys

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
