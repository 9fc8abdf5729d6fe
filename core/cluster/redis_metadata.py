"""RedisMetadata: the cluster's :class:`~core.cluster.metadata.MetadataStore` in Redis, with the
node registry, leases, shard claims and producer-id blocks (docs/cluster.md sections 4 and 5).

Keys, all under ``braid:<cluster_id>:`` (section 4's table):

  ``cluster``         hash: ``format``, ``shards``, ``created_ms``; checked by :func:`connect`
  ``version``         the metadata version, ``INCR``ed by each apply that changes something
  ``changes``         stream, one entry per changed key: id ``<version>-<i>`` (i counts the
                      apply's changes from 0), fields ``kind``, ``key``, ``op`` (set/del),
                      ``value``, ``tx`` (the apply's random token); ``MAXLEN ~ stream_maxlen``
  ``changed``         pub/sub channel: the new version, a doorbell only
  ``kinds``           set: every kind that ever had a key (what a full reload reads)
  ``def:<kind>``      hash: key -> value, for every definition kind
  ``place:<kind>``    hash: name -> shard number; written as the kind ``place:<kind>``
  ``node:<id>``       hash: ``incarnation``, ``started_ms`` and what the node registers
  ``lease:<id>``      the holder's incarnation, ``SET NX PX``
  ``shard:<n>``       hash: ``owner``, ``incarnation``, ``epoch``, ``since_ms`` (claim script)
  ``claimed``         pub/sub channel: ``<shard> <epoch> <owner>`` after each claim
  ``kafka:producer_id``  the next free producer id (``INCRBY`` a block)

Every write goes through a Lua script of core/cluster/redis_scripts.py. Reads (:meth:`get`,
:meth:`items`, :attr:`version`) come from a cache of every ``def:``/``place:`` hash, built at
connect and kept current by one task: subscribed to ``changed``, it reads ``changes`` from its
version + 1 on each doorbell, on reconnect and every ``heartbeat_ms``, and reloads everything
when the stream no longer holds what it needs. The entries carry values, so a reader never sees
a value from a later version than the change it applies (section 4 had ``kind, key, op`` only).

A failover that loses acknowledged-but-unreplicated changes (no ``WAIT``, or it timed out) can
give a version number twice. The ``tx`` token tells them apart: the cache checks, on each read,
that Redis still holds its last version with the same token, and reloads if not; every open
:meth:`watch` then raises :class:`MetadataGap`, since what it yielded may not have happened.

Not thread-safe: one event loop, like the rest of the core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff

from core.cluster import redis_scripts
from core.cluster.metadata import (
    Change,
    Expectation,
    MetadataConflict,
    MetadataGap,
    Versioned,
)

log = logging.getLogger(__name__)

# The schema of the keys above. A node refuses a cluster recorded with another one; a new
# format comes with a migration (`braid cluster upgrade`, section 4).
FORMAT: Final = 1
PLACE_PREFIX: Final = "place:"
SENTINEL_PORT: Final = 26379  # Redis Sentinel's default port
# Defaults of docs/cluster.md section 13.
METADATA_WAIT_MS: Final = 15000  # RabbitMQ channel_operation_timeout
HEARTBEAT_MS: Final = 2000  # Kafka KRaft broker.heartbeat.interval.ms
STREAM_MAXLEN: Final = 100000  # section 4: about 100k changes to catch up from
PRODUCER_ID_BLOCK: Final = 1000  # Kafka's ProducerIdManager block (KIP-730)
# Changes kept in memory for watch(); a watcher further behind reads the stream from Redis.
WATCH_BACKLOG: Final = 1024
READ_BATCH: Final = 1000  # stream entries per XRANGE while catching up
RECONNECT_DELAY_S: Final = (0.05, 1.0)  # the watcher's first and longest retry delay
CONNECT_TIMEOUT_S: Final = 5.0
# A command's retries on a lost connection: about 4 s in all before it fails (a failover takes
# Sentinel's down-after-milliseconds and an election), each delay at most RETRY_CAP_S.
RETRY_CAP_S: Final = 0.1
RETRIES: Final = 40

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # cluster and node ids
_KIND: Final = re.compile(r"(place:)?[a-z][a-z0-9_]*\Z")
# Errors after which the watcher reconnects (a restarted Redis, a failover, a dropped socket).
_CONNECTION_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


class MetadataNotReplicated(TimeoutError):
    """A change was applied on the Redis master but no replica acknowledged it within
    ``metadata_wait_ms``: a failover now could lose it. Answer the client with a retriable
    timeout (section 4: Kafka REQUEST_TIMED_OUT, AMQP 541, HTTP 503); declares are idempotent."""

    def __init__(self, version: int, wait_ms: int) -> None:
        super().__init__(
            f"metadata version {version} not replicated: no Redis replica acknowledged it "
            f"within {wait_ms} ms"
        )
        self.version = version


class MetadataCapExceeded(Exception):
    """An :meth:`RedisMetadata.apply` refused because a kind would hold more keys than its
    cap (``max_topics``, ``max_queues``): nothing was applied."""

    def __init__(self, kind: str, cap: int) -> None:
        super().__init__(f"metadata {kind}: at most {cap} allowed")
        self.kind = kind
        self.cap = cap


class ClusterMismatch(Exception):
    """The Redis holds this cluster id with another format or shard count."""


class LeaseHeld(Exception):
    """Another incarnation holds the node's lease and it did not expire in time."""

    def __init__(self, node_id: str, holder: int | None) -> None:
        super().__init__(f"node {node_id}'s lease is held by incarnation {holder}")
        self.node_id = node_id
        self.holder = holder


class ClaimRefused(Exception):
    """:meth:`RedisMetadata.claim_shard` refused; ``reason`` is one of the ``REFUSED_*``."""

    def __init__(self, shard: int, reason: str, *, owner: str | None = None, epoch: int = 0):
        super().__init__(f"claim of shard {shard} refused: {reason}")
        self.shard = shard
        self.reason = reason
        self.owner = owner  # REFUSED_OWNED: the live owner
        self.epoch = epoch  # REFUSED_EPOCH: the recorded epoch


REFUSED_LEASE: Final = "my lease does not hold my incarnation"
REFUSED_OWNED: Final = "another node owns it and its lease lives"
REFUSED_EPOCH: Final = "the epoch changed since it was read"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    incarnation: int  # the live lease's
    fields: dict[str, str]  # node:<id> as registered
    lease_left_ms: int | None = None  # the lease's PTTL when read (None: no expiry set)


@dataclass(frozen=True, slots=True)
class ShardOwner:
    owner: str | None
    incarnation: int | None
    epoch: int
    since_ms: int | None


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


class _Keys:
    """The names of section 4's keys and channels for one cluster."""

    def __init__(self, cluster_id: str) -> None:
        self.prefix = f"braid:{cluster_id}:"
        self.cluster = self.prefix + "cluster"
        self.version = self.prefix + "version"
        self.changes = self.prefix + "changes"
        self.changed = self.prefix + "changed"
        self.kinds = self.prefix + "kinds"
        self.claimed = self.prefix + "claimed"
        self.producer_id = self.prefix + "kafka:producer_id"

    def hash_of(self, kind: str) -> str:
        return self.prefix + (kind if kind.startswith(PLACE_PREFIX) else "def:" + kind)

    def node(self, node_id: str) -> str:
        return f"{self.prefix}node:{node_id}"

    def lease(self, node_id: str) -> str:
        return f"{self.prefix}lease:{node_id}"

    def shard(self, shard: int) -> str:
        return f"{self.prefix}shard:{shard}"


@dataclass(slots=True)
class _Entry:
    """One stream entry: a change and the apply (version, tx) it belongs to."""

    version: int
    tx: str
    change: Change


@dataclass(slots=True)
class _Closers:
    callbacks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def run(self) -> None:
        for callback in self.callbacks:
            try:
                await callback()
            except Exception:
                log.debug("closing a Redis client failed", exc_info=True)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """``redis+sentinel://[user:pass@]host1:26379,host2:26379/<service>[/db]`` (redis-py has
    no Sentinel URL; section 4). The credentials are the Redis master's; the sentinels' own
    go in ``connect(sentinel_kwargs=...)``."""
    scheme, sep, rest = url.partition("://")
    if scheme != "redis+sentinel" or not sep:
        raise ValueError(f"not a redis+sentinel:// URL: {url!r}")
    if "?" in rest or "#" in rest:
        raise ValueError(f"a redis+sentinel:// URL takes no query or fragment: {url!r}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = [_host_port(part, url) for part in hosts.split(",")]
    parts = path.split("/")
    if not parts[0] or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"want redis+sentinel://hosts/<service>[/db]: {url!r}")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelTarget(sentinels, unquote(parts[0]), db, username, password)


def _host_port(part: str, url: str) -> tuple[str, int]:
    if part.startswith("["):  # [IPv6]:port
        host, bracket, tail = part[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"bad sentinel address {part!r} in {url!r}")
        port_text = tail[1:]
    else:
        host, _, port_text = part.partition(":")
    if not host or (port_text and not port_text.isdigit()):
        raise ValueError(f"bad sentinel address {part!r} in {url!r}")
    port = int(port_text) if port_text else SENTINEL_PORT
    if not 0 < port < 65536:
        raise ValueError(f"bad sentinel port in {part!r} of {url!r}")
    return host, port


class _SentinelConnection(SentinelManagedConnection):
    """A connection to the master that asks Sentinel where it is on every connect. redis-py's
    own reconnects a retried command to the address it had (redis/redis-py#3874, open in 8.1):
    after a failover, to the dead master until the retries run out."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(check_health, retry_socket_connect)


def _client(
    url: str, metadata_wait_ms: int, sentinel_kwargs: Mapping[str, Any] | None
) -> tuple[Redis, _Closers]:
    """A client of the Redis at ``url`` and what closes it."""
    closers = _Closers()
    # A WAIT may block a command for metadata_wait_ms: the socket timeout leaves room for it.
    # The retry policy is given explicitly because Sentinel's connections otherwise get none and
    # fail at the first command after a failover. Its delays stay short (RETRY_CAP_S) so that a
    # lease renewal waiting out a failover reaches the new master soon after Sentinel names it:
    # with redis-py's default 1 s cap it came up to a second late, past lease_ms (a fence).
    options: dict[str, Any] = {
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": metadata_wait_ms / 1000 + 10,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.01, cap=RETRY_CAP_S), retries=RETRIES),
    }
    client: Redis
    if url.startswith("redis+sentinel://"):
        target = parse_sentinel_url(url)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels,
            sentinel_kwargs=dict(sentinel_kwargs or options),
            **options,
        )
        for sentinel_client in sentinel.sentinels:
            closers.callbacks.append(sentinel_client.aclose)
        client = sentinel.master_for(
            target.service,
            connection_class=_SentinelConnection,
            db=target.db,
            username=target.username,
            password=target.password,
        )
    elif url.startswith(("redis://", "rediss://", "unix://")):
        client = Redis.from_url(url, **options)
    else:
        raise ValueError(f"want a redis://, rediss://, unix:// or redis+sentinel:// URL: {url!r}")
    closers.callbacks.insert(0, client.aclose)
    return client, closers


async def connect(
    url: str,
    cluster_id: str,
    *,
    shards: int,
    metadata_wait_ms: int = METADATA_WAIT_MS,
    heartbeat_ms: int = HEARTBEAT_MS,
    stream_maxlen: int = STREAM_MAXLEN,
    sentinel_kwargs: Mapping[str, Any] | None = None,
) -> RedisMetadata:
    """Open the metadata of cluster ``cluster_id`` at ``url`` (``redis://``, ``rediss://``,
    ``unix://`` or ``redis+sentinel://``): records ``format`` and ``shards`` if the cluster is
    new, refuses (:class:`ClusterMismatch`) if they differ, loads the cache and starts
    watching."""
    client, closers = _client(url, metadata_wait_ms, sentinel_kwargs)
    try:
        return await RedisMetadata.open(
            client,
            cluster_id,
            shards=shards,
            metadata_wait_ms=metadata_wait_ms,
            heartbeat_ms=heartbeat_ms,
            stream_maxlen=stream_maxlen,
            closers=closers,
        )
    except BaseException:
        await closers.run()
        raise


async def find_clusters(
    url: str, *, sentinel_kwargs: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Every cluster the Redis at ``url`` holds (its ``braid:<id>:cluster`` hash), id -> shard
    count; reads only, so a caller can check a cluster exists before :func:`connect`, which
    would record a new one."""
    client, closers = _client(url, METADATA_WAIT_MS, sentinel_kwargs)
    try:
        found: dict[str, int] = {}
        async for raw in client.scan_iter(match="braid:*:cluster", count=1000):
            key = raw.decode()
            cluster_id = key[len("braid:") : -len(":cluster")]
            if not _NAME.match(cluster_id):  # e.g. braid:<id>:node:cluster
                continue
            shards = await client.hget(key, "shards")
            if shards is not None:
                found[cluster_id] = int(shards)
        return dict(sorted(found.items()))
    finally:
        await closers.run()


class RedisMetadata:
    """Use :func:`connect` (or :meth:`open` over a client you own)."""

    def __init__(
        self,
        client: Redis,
        cluster_id: str,
        *,
        shards: int,
        metadata_wait_ms: int,
        heartbeat_ms: int,
        stream_maxlen: int,
        closers: _Closers,
    ) -> None:
        if not _NAME.match(cluster_id):
            raise ValueError(f"bad cluster id {cluster_id!r}")
        if shards < 1:
            raise ValueError("a cluster has at least one shard")
        self.cluster_id = cluster_id
        self.shards = shards
        self.metadata_wait_ms = metadata_wait_ms
        self.heartbeat_ms = heartbeat_ms
        self.stream_maxlen = stream_maxlen
        self._redis = client
        self._keys = _Keys(cluster_id)
        self._closers = closers
        self._scripts = {
            name: client.register_script(getattr(redis_scripts, name))
            for name in (
                "CHANGE",
                "SNAPSHOT",
                "CLUSTER",
                "ACQUIRE_LEASE",
                "RENEW_LEASE",
                "RELEASE_LEASE",
                "CLAIM",
                "SET_EPOCH_AT_LEAST",
            )
        }
        self._cache: dict[str, dict[str, bytes]] = {}
        self._version = 0
        self._tail_tx = ""  # the tx of the cache's version ("": unknown, not checked)
        self._backlog: deque[_Entry] = deque()  # the newest whole versions, for watch()
        self._rewinds = 0  # reloads that found another history than the cache's
        self._own_txs: set[str] = set()  # the tokens of this instance's applies in flight
        self._own_versions: set[int] = set()  # versions in the backlog that those applied
        self._waiters: list[asyncio.Future[None]] = []
        self._lock = asyncio.Lock()  # one reader of the stream into the cache at a time
        self._replicas = 0  # connected replicas by INFO replication: 0 skips WAIT
        self._replicated_through = 0  # every version up to it acknowledged by a replica
        self._unreplicated: set[int] = set()  # versions whose WAIT timed out
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        client: Redis,
        cluster_id: str,
        *,
        shards: int,
        metadata_wait_ms: int = METADATA_WAIT_MS,
        heartbeat_ms: int = HEARTBEAT_MS,
        stream_maxlen: int = STREAM_MAXLEN,
        closers: _Closers | None = None,
    ) -> RedisMetadata:
        self = cls(
            client,
            cluster_id,
            shards=shards,
            metadata_wait_ms=metadata_wait_ms,
            heartbeat_ms=heartbeat_ms,
            stream_maxlen=stream_maxlen,
            closers=closers or _Closers(),
        )
        recorded = await self._scripts["CLUSTER"](keys=[self._keys.cluster], args=[FORMAT, shards])
        fmt, recorded_shards = (None if v is None else v.decode() for v in recorded)
        if fmt != str(FORMAT):
            raise ClusterMismatch(
                f"cluster {cluster_id} in Redis has format {fmt}; this node knows {FORMAT}"
            )
        if recorded_shards != str(shards):
            raise ClusterMismatch(
                f"cluster {cluster_id} in Redis has {recorded_shards} shards, not {shards}"
            )
        async with self._lock:
            await self._reload(rewound=False)
        await self._refresh_replicas()
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch_redis(), name=f"braid-metadata-{cluster_id}"
        )
        return self

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Cancel until it ends: on Python 3.11, asyncio.wait_for (redis-py's socket writes with a
        # socket_timeout) drops a cancellation that arrives as the write completes (gh-86296).
        while self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
            await asyncio.wait([self._watcher], timeout=0.1)
        if self._watcher is not None and not self._watcher.cancelled():
            with contextlib.suppress(Exception):
                self._watcher.result()
        self._wake()
        await self._closers.run()

    # -- MetadataStore: reading ------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def get(self, kind: str, key: str) -> bytes | None:
        _check_kind(kind)
        return self._cache.get(kind, {}).get(key)

    def items(self, kind: str) -> Iterator[tuple[str, bytes]]:
        _check_kind(kind)
        return iter(list(self._cache.get(kind, {}).items()))

    async def wait_version(self, version: int) -> None:
        """Return once the cache has applied ``version`` (section 4's version fence; bound it
        with ``asyncio.timeout``). Reads Redis at once rather than waiting for the doorbell."""
        if self._version < version:
            async with self._lock:
                await self._catch_up()
        while self._version < version and not self._closed:
            await self._next_version()

    # -- MetadataStore: changes ------------------------------------------------------------

    async def apply(
        self,
        changes: Sequence[Change],
        *,
        expect: Expectation | None = None,
        caps: Mapping[str, int] | None = None,
    ) -> int:
        """Apply ``changes`` in order, all or none; returns the new version, and the cache
        holds it on return. ``caps`` (kind -> the most keys it may hold): a change that would
        add keys past a cap raises :class:`MetadataCapExceeded`, checked in the script so two
        nodes cannot both take the last slot. Placements are changes of kind
        ``place:<kind>`` whose value is the shard number in ASCII."""
        for change in changes:
            _check_kind(change.kind)
            if change.kind.startswith(PLACE_PREFIX) and change.value is not None:
                shard = change.value.decode("ascii", "replace")
                if not shard.isdigit() or int(shard) >= self.shards:
                    raise ValueError(f"placement {change.key!r}: no shard {shard!r}")
        hashes: dict[str, int] = {}  # hash key -> its index among the script's KEYS

        def slot(kind: str) -> int:
            return hashes.setdefault(self._keys.hash_of(kind), len(hashes) + 1)

        args: list[str | bytes | int] = []
        for (kind, key), wanted in (expect or {}).items():
            _check_kind(kind)
            args += [slot(kind), key, 0 if wanted is None else 1, wanted or b""]
        for change in changes:
            op = "del" if change.value is None else "set"
            args += [slot(change.kind), change.kind, change.key, op, change.value or b""]
        for kind, cap in (caps or {}).items():
            _check_kind(kind)
            args += [slot(kind), cap]
        tx = secrets.token_hex(8)
        head: list[str | bytes | int] = [
            self._keys.changed,
            self.stream_maxlen,
            tx,
            len(expect or {}),
            len(changes),
            len(caps or {}),
        ]
        keys = [self._keys.version, self._keys.changes, self._keys.kinds, *hashes]
        # Known before the script runs: the watcher may install this version before the reply
        # is read, and made_here() must still name it this instance's.
        self._own_txs.add(tx)
        try:
            return await self._apply_script(changes, expect, caps, keys, head + args, tx)
        finally:
            self._own_txs.discard(tx)  # installed by now (or never applied)

    async def _apply_script(
        self,
        changes: Sequence[Change],
        expect: Expectation | None,
        caps: Mapping[str, int] | None,
        keys: list[str],
        args: list[str | bytes | int],
        tx: str,
    ) -> int:
        replicas = self._replicas
        async with self._redis.pipeline(transaction=False) as pipe:
            # One connection: WAIT counts the writes of the connection it is sent on.
            await self._scripts["CHANGE"](keys=keys, args=args, client=pipe)
            if replicas:
                pipe.wait(1, self.metadata_wait_ms)
            replies = await pipe.execute()
        reply = replies[0]
        if reply[0] == -1:
            kind, key = list(expect or {})[reply[1] - 1]
            raise MetadataConflict(kind, key)
        if reply[0] == -2:
            kind, cap = list((caps or {}).items())[reply[1] - 1]
            raise MetadataCapExceeded(kind, cap)
        version = int(reply[0])
        if len(reply) == 1:
            return version  # nothing changed
        if replicas:
            await self._record_wait(version, int(replies[1]))
        prev_tx = reply[1].decode()
        applied = [_Entry(version, tx, changes[i - 1]) for i in reply[2:]]
        async with self._lock:
            if self._version == version - 1 and self._tail_tx in ("", prev_tx):
                self._install(applied)
            elif self._version >= version:
                if not self._saw(version, tx):
                    await self._reload(rewound=True)
            else:
                await self._catch_up()
        return version

    async def wait_durable(self, version: int) -> None:
        """With replicas: return once one acknowledged ``version`` (the apply's ``WAIT 1``),
        else :class:`MetadataNotReplicated`. A lone Redis returns at once."""
        if version <= self._replicated_through or self._replicas == 0:
            return
        if version in self._unreplicated:
            raise MetadataNotReplicated(version, self.metadata_wait_ms)
        # A version this instance did not apply: wait for a write of this connection that
        # follows it (the doorbell again, harmless), hence for everything before it.
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.publish(self._keys.changed, self._version)
            pipe.wait(1, self.metadata_wait_ms)
            _, acks = await pipe.execute()
        await self._record_wait(version, int(acks))
        if version in self._unreplicated:
            raise MetadataNotReplicated(version, self.metadata_wait_ms)

    async def _record_wait(self, version: int, acks: int) -> None:
        if acks < 1:
            await self._refresh_replicas()
            if self._replicas:
                log.warning(
                    "metadata version %d: no Redis replica acknowledged it in %d ms",
                    version,
                    self.metadata_wait_ms,
                )
                self._unreplicated.add(version)
                return
        self._replicated_through = max(self._replicated_through, version)
        self._unreplicated = {v for v in self._unreplicated if v > self._replicated_through}

    def made_here(self, version: int) -> bool:
        """Whether ``version`` was applied by this instance's :meth:`apply` (False when it is
        older than the in-memory backlog, or the cache reloaded since: cannot tell)."""
        return version in self._own_versions

    async def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        seen = from_version
        rewinds = self._rewinds
        while not self._closed:
            if self._rewinds != rewinds:
                raise MetadataGap("Redis lost changes this watch may have yielded (failover)")
            if seen >= self._version:
                await self._next_version()
                continue
            if self._backlog and self._backlog[0].version <= seen + 1:
                pending = [e for e in self._backlog if e.version > seen]
            else:
                pending = await self._read_from_redis(seen, self._version)
            for entry in pending:
                if self._rewinds != rewinds:
                    break
                seen = entry.version
                yield Versioned(entry.version, entry.change)

    async def _read_from_redis(self, seen: int, upto: int) -> list[_Entry]:
        """The next whole versions after ``seen`` (up to ``upto``, a page at a time) that the
        stream still holds, else :class:`MetadataGap`."""
        raw = await self._redis.xrange(
            self._keys.changes, str(seen + 1), str(upto), count=READ_BATCH
        )
        entries = _parse_entries(raw)
        if not entries or entries[0].version != seen + 1:
            raise MetadataGap(f"changes after version {seen} are no longer kept")
        return await self._whole_versions(entries)

    async def _whole_versions(self, entries: list[_Entry]) -> list[_Entry]:
        """``entries`` without the last version when a full page may have cut it short (read
        whole if it is the only one)."""
        if len(entries) < READ_BATCH:
            return entries
        last = entries[-1].version
        whole = [e for e in entries if e.version < last]
        if whole:
            return whole
        return _parse_entries(await self._redis.xrange(self._keys.changes, str(last), str(last)))

    # -- the cache -------------------------------------------------------------------------

    async def _watch_redis(self) -> None:
        """Subscribe to the doorbell, catch up, and again on each ring and heartbeat;
        reconnect after any error."""
        delay = RECONNECT_DELAY_S[0]
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(self._keys.changed)
                    async with self._lock:
                        await self._catch_up()  # after subscribing: no ring is missed
                    await self._refresh_replicas()
                    delay = RECONNECT_DELAY_S[0]
                    while True:
                        message = await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=self.heartbeat_ms / 1000
                        )
                        if message is None:  # the heartbeat: a safety net for lost rings
                            await self._refresh_replicas()
                        elif int(message["data"]) <= self._version:
                            continue
                        async with self._lock:
                            await self._catch_up()
            except asyncio.CancelledError:
                raise
            except _CONNECTION_ERRORS as exc:
                log.info("metadata watcher: %s; reconnecting in %.2f s", exc, delay)
            except Exception:
                log.exception("metadata watcher failed; restarting in %.2f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_S[1])

    async def _catch_up(self) -> None:
        """Read the stream from the cache's version + 1 into the cache (the caller holds the
        lock); reload everything if the stream no longer has it or holds another history."""
        while True:
            version = self._version
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.get(self._keys.version)
                pipe.xrange(self._keys.changes, str(version), str(version), count=1)
                pipe.xrange(self._keys.changes, str(version + 1), "+", count=READ_BATCH)
                current_raw, tail, raw = await pipe.execute()
            current = int(current_raw or 0)
            if current < version:
                await self._reload(rewound=True)
                return
            if tail and self._tail_tx and _parse_entry(*tail[0]).tx != self._tail_tx:
                await self._reload(rewound=True)
                return
            entries = _parse_entries(raw)
            if current > version and (not entries or entries[0].version != version + 1):
                await self._reload(rewound=False)  # trimmed past the cache's version
                return
            self._install(await self._whole_versions(entries))
            if len(entries) < READ_BATCH:
                return

    def _install(self, entries: list[_Entry]) -> None:
        """Apply whole versions, in order, to the cache and the backlog."""
        if not entries:
            return
        for entry in entries:
            change = entry.change
            values = self._cache.setdefault(change.kind, {})
            if change.value is None:
                values.pop(change.key, None)
            else:
                values[change.key] = change.value
            self._backlog.append(entry)
            if entry.tx in self._own_txs:
                self._own_versions.add(entry.version)
        self._version = entries[-1].version
        self._tail_tx = entries[-1].tx
        while len(self._backlog) > WATCH_BACKLOG:
            dropped = self._backlog.popleft().version
            while self._backlog and self._backlog[0].version == dropped:
                self._backlog.popleft()
            self._own_versions.discard(dropped)
        self._wake()

    def _saw(self, version: int, tx: str) -> bool:
        """Whether the cache applied ``version`` as the apply with token ``tx`` (True when it
        is too old to tell)."""
        if not self._backlog or self._backlog[0].version > version:
            return True
        return any(e.version == version and e.tx == tx for e in self._backlog)

    async def _reload(self, *, rewound: bool) -> None:
        """Replace the cache with every hash at one version (the caller holds the lock)."""
        reply = await self._scripts["SNAPSHOT"](
            keys=[self._keys.version, self._keys.changes, self._keys.kinds],
            args=[self._keys.prefix],
        )
        version, tx = int(reply[0]), reply[1].decode()
        cache: dict[str, dict[str, bytes]] = {}
        for i in range(2, len(reply), 2):
            flat = reply[i + 1]
            cache[reply[i].decode()] = {
                flat[j].decode(): flat[j + 1] for j in range(0, len(flat), 2)
            }
        if version < self._version:
            rewound = True
        if rewound:
            log.warning(
                "metadata: Redis no longer holds version %d as this node saw it (a failover "
                "lost changes?); reloaded at version %d",
                self._version,
                version,
            )
            self._rewinds += 1
        self._cache, self._version, self._tail_tx = cache, version, tx
        self._backlog.clear()
        self._own_versions.clear()
        self._wake()

    async def _refresh_replicas(self) -> None:
        info = await self._redis.info("replication")
        self._replicas = int(info.get("connected_slaves", 0))

    async def _next_version(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- nodes and leases ------------------------------------------------------------------

    async def register_node(self, node_id: str, fields: Mapping[str, str]) -> int:
        """Record ``node:<id>`` (replacing a previous incarnation's) with a fresh random
        incarnation, returned; take the lease with it next (:meth:`acquire_lease`)."""
        _check_name(node_id)
        incarnation = secrets.randbits(63)
        now_ms = await self._now_ms()
        record = {**fields, "incarnation": str(incarnation), "started_ms": str(now_ms)}
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._keys.node(node_id))
            pipe.hset(self._keys.node(node_id), items=[x for pair in record.items() for x in pair])
            await pipe.execute()
        return incarnation

    async def acquire_lease(
        self, node_id: str, incarnation: int, lease_ms: int, *, wait_ms: int
    ) -> None:
        """Take ``lease:<id>`` for ``incarnation`` (``SET NX PX``), waiting up to ``wait_ms``
        for another holder's lease to expire (two processes never serve as one node), else
        :class:`LeaseHeld`."""
        _check_name(node_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        key = self._keys.lease(node_id)
        while True:
            left_ms = int(
                await self._scripts["ACQUIRE_LEASE"](keys=[key], args=[incarnation, lease_ms])
            )
            if left_ms == 0:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LeaseHeld(node_id, await self.lease_holder(node_id))
            # Poll when it should expire (PTTL), or soon when it has none or just expired.
            pause = left_ms / 1000 + 0.005 if left_ms > 0 else 0.05
            await asyncio.sleep(min(pause, remaining))

    async def renew_lease(self, node_id: str, incarnation: int, lease_ms: int) -> bool:
        """Extend the lease if it still holds ``incarnation``; False: it expired or another
        incarnation took it, and the node must fence itself (section 11)."""
        renewed = await self._scripts["RENEW_LEASE"](
            keys=[self._keys.lease(node_id)], args=[incarnation, lease_ms]
        )
        return bool(renewed)

    async def release_lease(self, node_id: str, incarnation: int) -> bool:
        """Drop the lease if it still holds ``incarnation`` (a clean stop: the next process
        of this node need not wait for it to expire)."""
        released = await self._scripts["RELEASE_LEASE"](
            keys=[self._keys.lease(node_id)], args=[incarnation]
        )
        return bool(released)

    async def lease_holder(self, node_id: str) -> int | None:
        holder = await self._redis.get(self._keys.lease(node_id))
        return None if holder is None else int(holder)

    async def live_nodes(self) -> dict[str, NodeInfo]:
        """Every node whose lease exists, by id, sorted, with what it registered."""
        lease_prefix = self._keys.lease("")
        ids = sorted(
            [
                key.decode()[len(lease_prefix) :]
                async for key in self._redis.scan_iter(match=lease_prefix + "*", count=1000)
            ]
        )
        async with self._redis.pipeline(transaction=False) as pipe:
            for node_id in ids:
                pipe.get(self._keys.lease(node_id))
                pipe.hgetall(self._keys.node(node_id))
                pipe.pttl(self._keys.lease(node_id))
            replies = await pipe.execute()
        nodes: dict[str, NodeInfo] = {}
        for i, node_id in enumerate(ids):
            holder, record, left_ms = replies[3 * i : 3 * i + 3]
            if holder is not None:  # not expired between the SCAN and the GET
                fields = {k.decode(): v.decode() for k, v in record.items()}
                left = int(left_ms) if int(left_ms) >= 0 else None
                nodes[node_id] = NodeInfo(node_id, int(holder), fields, left)
        return nodes

    # -- shards ----------------------------------------------------------------------------

    async def claim_shard(
        self, shard: int, node_id: str, incarnation: int, expected_epoch: int
    ) -> int:
        """Claim ``shard`` for this node (claim.lua, section 4); returns the new epoch, to be
        made real by its epoch file (section 5.2), or raises :class:`ClaimRefused`."""
        self._check_shard(shard)
        reply = await self._scripts["CLAIM"](
            keys=[self._keys.shard(shard), self._keys.lease(node_id)],
            args=[
                self._keys.prefix,
                node_id,
                incarnation,
                expected_epoch,
                self._keys.claimed,
                shard,
            ],
        )
        code = int(reply[0])
        if code == -1:
            raise ClaimRefused(shard, REFUSED_LEASE)
        if code == -2:
            raise ClaimRefused(shard, REFUSED_OWNED, owner=reply[1].decode())
        if code == -3:
            raise ClaimRefused(shard, REFUSED_EPOCH, epoch=int(reply[1]))
        return code

    async def set_epoch_at_least(self, shard: int, epoch: int) -> int:
        """Raise ``shard:<n>``'s epoch to ``epoch`` if lower (section 5.2: an epoch file on disk
        is ahead of Redis); returns the recorded epoch."""
        self._check_shard(shard)
        recorded = await self._scripts["SET_EPOCH_AT_LEAST"](
            keys=[self._keys.shard(shard)], args=[epoch]
        )
        return int(recorded)

    async def shard_owners(self) -> dict[int, ShardOwner]:
        """Every shard with a record (claimed once, or its epoch raised)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(self.shards):
                pipe.hgetall(self._keys.shard(shard))
            replies = await pipe.execute()
        owners: dict[int, ShardOwner] = {}
        for shard, raw in enumerate(replies):
            if raw:
                record = {k.decode(): v.decode() for k, v in raw.items()}
                owners[shard] = ShardOwner(
                    owner=record.get("owner"),
                    incarnation=_int_or_none(record.get("incarnation")),
                    epoch=int(record.get("epoch", 0)),
                    since_ms=_int_or_none(record.get("since_ms")),
                )
        return owners

    def _check_shard(self, shard: int) -> None:
        if not 0 <= shard < self.shards:
            raise ValueError(f"no shard {shard} in a cluster of {self.shards}")

    # -- ids -------------------------------------------------------------------------------

    async def next_ids(self, block: int = PRODUCER_ID_BLOCK) -> range:
        """A block of producer ids no other caller gets (``INCRBY kafka:producer_id``)."""
        if block < 1:
            raise ValueError("a block holds at least one id")
        end = int(await self._redis.incrby(self._keys.producer_id, block))
        return range(end - block, end)

    async def _now_ms(self) -> int:
        seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000


def _parse_entries(raw: Any) -> list[_Entry]:
    """XRANGE's reply: ``[(id, {field: value}), ...]``."""
    return [_parse_entry(entry_id, fields) for entry_id, fields in raw]


def _parse_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> _Entry:
    version = int(entry_id.split(b"-", 1)[0])
    value = None if fields[b"op"] == b"del" else fields[b"value"]
    change = Change(fields[b"kind"].decode(), fields[b"key"].decode(), value)
    return _Entry(version, fields[b"tx"].decode(), change)


def _check_kind(kind: str) -> None:
    if not _KIND.match(kind):
        raise ValueError(f"bad metadata kind {kind!r}")


def _check_name(node_id: str) -> None:
    if not _NAME.match(node_id):
        raise ValueError(f"bad node id {node_id!r}")


def _int_or_none(text: str | None) -> int | None:
    return None if text is None else int(text)
