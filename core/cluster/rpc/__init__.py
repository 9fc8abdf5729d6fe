"""gRPC between the nodes of a cluster (docs/cluster.md section 7): the generated
``braid.cluster.v1`` code (``cluster_pb2*``, from proto/ by scripts/gen-proto), the server a node
answers on and the client it calls its peers with."""

from core.cluster.rpc.client import PeerUnavailable, RpcClient
from core.cluster.rpc.options import JsonObject, RpcSettings
from core.cluster.rpc.server import AdminHandler, NodeService, RpcServer

__all__ = [
    "AdminHandler",
    "JsonObject",
    "NodeService",
    "PeerUnavailable",
    "RpcClient",
    "RpcServer",
    "RpcSettings",
]
