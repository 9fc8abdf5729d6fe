"""Kafka's inter-broker ``WriteTxnMarkers`` between the nodes (docs/cluster.md sections 8, 10).

A Kafka transaction's coordinator (the node the transactional id is placed on) ends the
transaction in every partition the producer wrote to. The partitions its own shards hold get
their markers straight from the coordinator (``BrokerAPI.write_transaction_marker``); for each
other shard :class:`TxnMarkerClient` sends one ``WriteTxnMarkers`` call to the shard's owner,
and :class:`TxnMarkerReceiver` (the owner's side) writes a COMMIT or ABORT control batch in each
named partition, as Kafka's leader does, then answers once they are durable. The marker ends the
producer's open transaction there: the last stable offset moves on, an ABORT joins the
partition's aborted transactions (``core/transactions/partitions.py``).

A leader that does not answer (down, moving) is asked again until it does: the coordinator keeps
the transaction in PrepareCommit/PrepareAbort meanwhile, as Kafka's does. A marker is written
only where the producer's transaction is open, so a call repeated after a lost answer writes
nothing twice.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Sequence
from typing import Final

from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatchBuilder,
)
from crc32c import crc32c
from grpc import aio

from core.broker.node import Node
from core.broker.remote import OwnerAddress, ShardOwners
from core.broker.shard import Shard
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.errors import ShardUnavailable
from core.log.store import now_ms

log = logging.getLogger(__name__)

# How long a coordinator waits before asking a leader that did not answer again.
RETRY_S: Final = 0.2
# Kafka's control batch (``MemoryRecords.withEndTransactionMarker``): magic 2, the control bit
# in the attributes, one control record whose key is (version 0, type) and whose value is
# (version 0, coordinator epoch). The CRC-32C covers the batch from the attributes on.
_MAGIC: Final = 2
_CRC_AT: Final = 17
_ATTRIBUTES_AT: Final = 21
_ATTR_CONTROL: Final = 0x20
_CONTROL_KEY: Final = struct.Struct(">hh")
_MARKER_VALUE: Final = struct.Struct(">hi")
_ABORT: Final = 0
_COMMIT: Final = 1
_NO_SEQUENCE: Final = -1


def control_batch(commit: bool, producer_id: int, epoch: int, timestamp_ms: int) -> bytes:
    """The COMMIT (``commit``) or ABORT marker of ``producer_id``/``epoch``, byte for byte as
    a Kafka broker writes it (coordinator epoch 0)."""
    builder = DefaultRecordBatchBuilder(_MAGIC, 0, 1, producer_id, epoch, _NO_SEQUENCE, 2**31 - 1)
    builder.append(
        0,
        timestamp_ms,
        _CONTROL_KEY.pack(0, _COMMIT if commit else _ABORT),
        _MARKER_VALUE.pack(0, 0),
        [],
    )
    built = bytearray(builder.build())
    (attributes,) = struct.unpack_from(">h", built, _ATTRIBUTES_AT)
    struct.pack_into(">h", built, _ATTRIBUTES_AT, attributes | _ATTR_CONTROL)
    struct.pack_into(">I", built, _CRC_AT, crc32c(bytes(built[_ATTRIBUTES_AT:])))
    return bytes(built)


class TxnMarkerReceiver:
    """The leader's side: ``NodeService.write_txn_markers`` over the broker this node serves
    (``broker``: read at each call, a fenced node serves again on a new one)."""

    def __init__(self, broker: Callable[[], Node | None]) -> None:
        self._broker = broker

    async def __call__(
        self, request: pb.TxnMarkers, context: aio.ServicerContext
    ) -> pb.AppendResult:
        node = self._broker()
        if node is None:
            return pb.AppendResult(status=pb.AppendResult.UNAVAILABLE)
        shards = node.shards
        stamp = now_ms()
        marker = control_batch(request.commit, request.producer_id, request.epoch, stamp)
        served: list[tuple[Shard, str, int]] = []
        for dest in request.partitions:
            number = shards.queue_number(dest.topic, dest.queue)
            shard = shards.local(number)
            if shard is None:
                return pb.AppendResult(status=pb.AppendResult.NOT_OWNER)
            served.append((shard, dest.topic, dest.queue))
        durable: list[tuple[Shard, int]] = []
        for shard, topic, partition in served:
            transactions = shard.partition_transactions
            if not transactions.is_open(topic, partition, request.producer_id):
                continue  # ended already (a repeated call), or nothing was produced there
            appended = transactions.append_marker(topic, partition, marker, born_ms=stamp)
            durable.append((shard, appended.end))
        for shard, end in durable:
            await shard.store.wait_durable(end)
        return pb.AppendResult(status=pb.AppendResult.OK)


class TxnMarkerClient:
    """The coordinator's side (``core.api``'s ``TxnMarkerSender``): one ``WriteTxnMarkers``
    call per shard to its owner, asked again until it answers OK."""

    def __init__(self, client: RpcClient, owners: ShardOwners, retry_s: float = RETRY_S) -> None:
        self._client = client
        self._owners = owners
        self._retry_s = retry_s

    async def write_markers(
        self,
        shard: int,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        partitions: Sequence[tuple[str, int]],
    ) -> None:
        request = pb.TxnMarkers(
            txn_id=transactional_id,
            producer_id=producer_id,
            epoch=epoch,
            commit=commit,
            partitions=[pb.Dest(topic=topic, queue=queue) for topic, queue in partitions],
        )
        owner: OwnerAddress | None = self._owners.owner_of(shard)
        attempt = 0
        while True:
            if owner is not None:
                reason = await self._send(owner, request)
                if reason is None:
                    return
            else:
                reason = str(ShardUnavailable(shard, reason="no live owner"))
            attempt += 1
            if attempt == 1 or attempt % 50 == 0:
                log.warning(
                    "kafka: markers of transaction %r in shard %d not written yet (%s): retrying",
                    transactional_id,
                    shard,
                    reason,
                )
            await asyncio.sleep(self._retry_s)
            owner = await self._owners.refresh(shard)

    async def _send(self, owner: OwnerAddress, request: pb.TxnMarkers) -> str | None:
        """None once the owner wrote the markers, else why not."""
        try:
            result = await self._client.unary(
                owner.rpc_address, lambda stub: stub.WriteTxnMarkers(request)
            )
        except PeerUnavailable as error:
            return str(error)
        except aio.AioRpcError as error:
            return f"{error.code().name}: {error.details()}"
        if result.status == pb.AppendResult.OK:
            return None
        return f"node {owner.node} answered {pb.AppendResult.Status.Name(result.status)}"
