"""N real ``braid serve --cluster`` nodes on one data root (docs/cluster.md sections 6-9), for the
end-to-end tests of a cluster: a root made with ``braid cluster init --shards S``, one real
redis-server (the caller's: tests/cluster/redis_server.py), every listener of every node on a
free 127.0.0.1 port (tests/braid_process.py), short leases.

The nodes are started together (each waits for ``--expect-nodes N`` live nodes before the plan
gives each its shards, section 5.1) and their ready lines say which shards each one serves
(:meth:`Cluster.owner`). :meth:`Cluster.stop` stops every node still running (SIGTERM, then
SIGKILL for one that does not exit).

    with Cluster(tmp_path, redis_server.url, nodes=3, shards=12) as cluster:
        producer = KafkaProducer(bootstrap_servers=cluster[1].kafka_bootstrap)
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from core.cluster.placement import partition_shard
from tests.braid_process import BraidProcess
from tests.cluster.test_node import LEASE_MS, make_root

# Short waits (section 14's): a publish to a stopped node's shard is nacked after this.
UNAVAILABLE_WAIT_MS = 2000
PORT_ATTEMPTS = 3  # a node whose chosen port was taken before it bound it starts again
_SHARDS = re.compile(r"\bshards=([0-9,]+|none)\b")


def cluster_config(nodes: int, extra: str = "", *, takeover: bool = False) -> str:
    """The nodes' ``[cluster]``: short leases, ``expect_nodes``, ``unavailable_wait_ms`` and
    ``takeover`` (off by default here: the issue-22 tests expect a stopped node's shards to
    wait for it)."""
    return (
        f"[cluster]\nlease_ms = {LEASE_MS}\nheartbeat_ms = 500\nexpect_nodes = {nodes}\n"
        f"unavailable_wait_ms = {UNAVAILABLE_WAIT_MS}\n"
        f"takeover = {'true' if takeover else 'false'}\n{extra}"
    )


class Cluster:
    """``nodes`` nodes (ids 1..N) over a root of ``shards`` shards (module docstring)."""

    def __init__(
        self,
        tmp_path: Path,
        redis_url: str,
        *,
        nodes: int = 3,
        shards: int = 12,
        takeover: bool = False,
    ) -> None:
        """``takeover``: the nodes take a dead node's shards over (issue 23)."""
        self.shards = shards
        self.url = redis_url
        self.root = make_root(tmp_path / "root", shards=shards)
        self._tmp_path = tmp_path
        self._config = tmp_path / "braid.toml"
        self._config.write_text(cluster_config(nodes, takeover=takeover))
        self.nodes: dict[int, BraidProcess] = {}
        for node_id in range(1, nodes + 1):
            self.nodes[node_id] = self._node(node_id)

    def _node(self, node_id: int) -> BraidProcess:
        directory = self._tmp_path / f"n{node_id}"
        directory.mkdir(exist_ok=True)
        return BraidProcess(
            directory,
            listeners=("amqp", "mqtt", "kafka", "http"),
            data_dir=self.root,
            extra_args=(
                "--config",
                str(self._config),
                "--cluster",
                self.url,
                "--node-id",
                str(node_id),
                "--advertised-host",
                "127.0.0.1",
            ),
        )

    def add_node(self, node_id: int) -> BraidProcess:
        """Start one more node (after the others formed: it claims only shards nobody owns, so
        often none, a standby); stopped with the others."""
        process = self.nodes[node_id] = self._node(node_id)
        return process.start()

    def __getitem__(self, node_id: int) -> BraidProcess:
        return self.nodes[node_id]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Cluster:
        """Start every node at once and wait for each one's ready line."""
        errors: list[BaseException] = []

        def start(node_id: int) -> None:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self.nodes[node_id].start()
                    return
                except BaseException as error:
                    # A port chosen free was bound by someone else first (another node's
                    # cluster port, which the kernel picks at its start): again on new ports.
                    if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                        errors.append(error)
                        return
                    self.nodes[node_id].kill9()
                    self.nodes[node_id] = self._node(node_id)

        threads = [threading.Thread(target=start, args=(n,)) for n in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            self.stop()
            raise errors[0]
        return self

    def stop(self) -> None:
        for process in self.nodes.values():
            try:
                process.stop()
            except Exception:
                process.kill9()
            process.kill9()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # -- who serves what -------------------------------------------------------------------

    def served(self, node_id: int) -> set[int]:
        """The shards node ``node_id`` said it serves in its last ready line."""
        found = _SHARDS.search(self.nodes[node_id].ready_line)
        assert found is not None, self.nodes[node_id].ready_line
        return set() if found[1] == "none" else {int(n) for n in found[1].split(",")}

    def owner(self, shard: int) -> int:
        """The node serving ``shard`` (by the ready lines)."""
        for node_id in self.nodes:
            if shard in self.served(node_id):
                return node_id
        raise AssertionError(f"no node serves shard {shard}")

    def queue_owner(self, topic: str, queue: int = 0) -> int:
        """The node serving ``(topic, queue)``'s shard (its placement rule)."""
        return self.owner(partition_shard(topic, queue, self.shards))

    def name_owned_by(self, node_id: int, prefix: str, topic_prefix: str = "") -> str:
        """A name ``prefix<n>`` whose topic (``topic_prefix`` + name) node ``node_id`` owns."""
        for number in range(10_000):
            name = f"{prefix}{number}"
            if self.queue_owner(topic_prefix + name) == node_id:
                return name
        raise AssertionError(f"no name {prefix}N lands on node {node_id}")
