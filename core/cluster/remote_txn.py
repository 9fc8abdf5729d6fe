"""Half messages and ``braid.txn`` decisions of transactions kept in another node's shard
(docs/cluster.md section 10), both sides.

A transaction's half messages are kept, and its commit or rollback applied, in the shard its
id is placed in (``placement.PLACE_TXN``): a publish of either made on another node is handed
whole to that shard's owner, which publishes it as if its client were connected there.

- The owner's side: :class:`TxnPublishCalls` answers the ``Admin`` call
  :data:`ADMIN_TXN_PUBLISH` with the broker it serves now (:meth:`~TxnPublishCalls.attach`).
- The publisher's side: :class:`TxnPublishOverRpc`, the ``core.broker.remote.RemoteTransactions``
  a cluster node's broker is given (``Node.remote_txn``).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import base64
import logging
from typing import Final

from grpc import aio

from core.broker.node import Node
from core.broker.remote import ForwardResult, OwnerAddress, ShardOwners
from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.cluster.rpc.options import JsonObject
from core.cluster.rpc.server import NodeService
from core.errors import ShardUnavailable, TopicError
from core.log import record as rec
from core.transactions.service import RecordFields

log = logging.getLogger(__name__)

# {"shard": n, "topic": t, "queue": q, "body": b64 | null, "key": b64 | null,
#  "headers": [[name, b64], ...], "tags": [...], "subject", "client", "address", "protocol",
#  "born_ms"} -> {"offset": n, "refused": [[topic, queue], ...]}, or {"topic_error": [code,
#  message]}: refused as a publish there would be (TopicError, e.g. destinations in another
#  shard than the transaction's)
ADMIN_TXN_PUBLISH: Final = "txn_publish"


def _b64(data: bytes | memoryview | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: object) -> bytes | None:
    return None if text is None else base64.b64decode(str(text))


def encode_publish(
    shard: int, topic: str, queue: int, body: bytes | memoryview | None, fields: RecordFields
) -> JsonObject:
    """The arguments of :data:`ADMIN_TXN_PUBLISH` for one publish."""
    return {
        "shard": shard,
        "topic": topic,
        "queue": queue,
        "body": _b64(body),
        "key": _b64(fields.get("key")),
        "headers": [[name, _b64(value)] for name, value in fields.get("headers", ())],
        "tags": list(fields.get("tags", ())),
        "subject": fields.get("subject", ""),
        "client": fields.get("client", ""),
        "address": fields.get("address", ""),
        "protocol": fields.get("protocol", rec.PROTOCOL_INTERNAL),
        "born_ms": fields.get("born_ms", 0),
    }


class TxnPublishCalls:
    """The owner's side (module docstring): :meth:`register` once on the node's
    :class:`NodeService`, :meth:`attach` each broker served (None: calls fail, retriable at
    the caller as an unavailable shard)."""

    def __init__(self) -> None:
        self._node: Node | None = None

    def attach(self, node: Node | None) -> None:
        self._node = node

    def register(self, service: NodeService) -> None:
        service.register(ADMIN_TXN_PUBLISH, self._publish)

    async def _publish(self, args: JsonObject) -> JsonObject:
        node = self._node
        shard = int(args["shard"])
        if node is None or node.shards.local(shard) is None:
            raise RuntimeError(f"shard {shard} is not served by this node now")
        headers: rec.Headers = [
            (str(name), _unb64(value) or b"") for name, value in args.get("headers", [])
        ]
        try:
            result = await node.publish(
                str(args["topic"]),
                _unb64(args.get("body")),
                queue=int(args["queue"]),
                key=_unb64(args.get("key")),
                subject=str(args.get("subject", "")),
                headers=headers,
                tags=[str(tag) for tag in args.get("tags", [])],
                protocol=int(args.get("protocol", rec.PROTOCOL_INTERNAL)),
                client=str(args.get("client", "")),
                address=str(args.get("address", "")),
                born_ms=int(args.get("born_ms", 0)),
                create_topic=True,
            )
        except TopicError as error:
            return {"topic_error": [error.code, str(error)]}
        return {"offset": result.offset, "refused": [list(d) for d in result.refused]}


class TxnPublishOverRpc:
    """``core.broker.remote.RemoteTransactions`` over ``client`` and ``owners``."""

    def __init__(self, client: RpcClient, owners: ShardOwners) -> None:
        self._client = client
        self._owners = owners

    async def _owner(self, shard: int) -> OwnerAddress:
        owner = self._owners.owner_of(shard) or await self._owners.refresh(shard)
        if owner is None:
            raise ShardUnavailable(shard, reason="no live owner")
        return owner

    async def publish(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        fields: RecordFields,
    ) -> ForwardResult:
        owner = await self._owner(shard)
        args = encode_publish(shard, topic, queue, body, fields)
        try:
            answer = await self._client.admin(owner.rpc_address, ADMIN_TXN_PUBLISH, args)
        except (PeerUnavailable, aio.AioRpcError) as error:
            # (gone, or failing: not serving the shard now, a store error there)
            await self._owners.refresh(shard)
            log.warning(
                "transaction publish to %s not stored: shard %d's owner %s: %s",
                topic,
                shard,
                owner.node,
                error,
            )
            raise ShardUnavailable(shard, owner.node, str(error)) from error
        topic_error = answer.get("topic_error")
        if topic_error is not None:
            raise TopicError(str(topic_error[0]), str(topic_error[1]))
        refused = [(str(topic_), int(queue_)) for topic_, queue_ in answer.get("refused", [])]
        return ForwardResult(int(answer.get("offset", -1)), refused)
