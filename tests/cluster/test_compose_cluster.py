"""compose/cluster.yml (docs/cluster.md section 9): three nodes of one root, Redis with two
replicas and three Sentinels. Docker is not here, so the file is checked for what the nodes and
Sentinels will be given, and the Sentinels' own start-up command runs for real against a real
redis-server (hostnames swapped for loopback), so a config line Sentinel refuses fails here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import redis
import yaml

from core.cluster.redis_metadata import parse_sentinel_url
from tests.cluster.redis_server import free_port, redis_processes, until

REPO = Path(__file__).resolve().parents[2]
CLUSTER_YML = REPO / "compose" / "cluster.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(CLUSTER_YML.read_text())


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_three_nodes_share_one_root_and_the_sentinels(compose: dict) -> None:
    services = compose["services"]
    nodes = [services[f"node-{n}"] for n in (1, 2, 3)]
    sentinels = {name for name in services if name.startswith("sentinel-")}
    assert len(sentinels) == 3
    assert {"redis-primary", "redis-replica-1", "redis-replica-2", "init"} <= set(services)
    init = services["init"]["command"]
    assert init[:3] == ["cluster", "init", "/data"]
    shards = int(_flag(init, "--shards"))
    node_ids = set()
    host_ports: list[str] = []
    for node in nodes:
        command = node["command"]
        assert command[0] == "serve"
        assert _flag(command, "--data-dir") == "/data"
        assert "braid-root:/data" in node["volumes"]
        assert int(_flag(command, "--expect-nodes")) == len(nodes)
        node_ids.add(_flag(command, "--node-id"))
        target = parse_sentinel_url(_flag(command, "--cluster"))
        assert {host for host, _ in target.sentinels} == sentinels
        assert target.service == "braid"
        # Kafka clients connect to the advertised port: it is the one published on the host.
        kafka = _flag(command, "--kafka-port")
        assert f"{kafka}:{kafka}" in node["ports"]
        host_ports += [port.split(":")[0] for port in node["ports"]]
        assert node["depends_on"]["init"]["condition"] == "service_completed_successfully"
    assert len(node_ids) == 3
    assert shards % len(nodes) == 0, "every node should own as many shards as the others"
    assert len(host_ports) == len(set(host_ports)), "host ports must not clash"
    for n in (1, 2):
        replica = services[f"redis-replica-{n}"]["command"]
        assert _flag(replica, "--replicaof") == "redis-primary"
    assert "braid-root:/data:ro" in services["jobs"]["volumes"]


def test_the_sentinel_command_monitors_the_primary(compose: dict, tmp_path: Path) -> None:
    shell = compose["services"]["sentinel-1"]["command"]
    assert shell[:2] == ["sh", "-c"]
    script = shell[2]
    with redis_processes(tmp_path / "redis") as processes:
        primary = processes.redis(tcp=True)
        port = free_port()
        local = (
            script.replace("redis-primary 6379", f"127.0.0.1 {primary.port}")
            .replace("port 26379", f"port {port}")
            .replace("/tmp/sentinel.conf", str(tmp_path / "sentinel.conf"))
            .replace("exec redis-sentinel", "exec redis-server")
            + " --sentinel --bind 127.0.0.1"
        )
        process = subprocess.Popen(
            ["sh", "-c", local], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        try:
            client = redis.Redis(
                host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True
            )

            def master() -> tuple[str, int] | None:
                return client.sentinel_get_master_addr_by_name("braid")  # type: ignore[no-any-return]

            host, master_port = until(master, 15.0, "the sentinel to name the primary")
            assert (host, int(master_port)) == ("127.0.0.1", primary.port)
            client.close()
        finally:
            process.kill()
            process.wait(timeout=10)
