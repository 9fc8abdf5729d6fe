"""The committed gRPC code of core/cluster/rpc/ is what scripts/gen-proto makes from
proto/braid/cluster/v1/cluster.proto today, and docs/cluster.md section 7 shows that service."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from core.cluster.rpc import cluster_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "core" / "cluster" / "rpc"
NAMES = ("cluster_pb2.py", "cluster_pb2.pyi", "cluster_pb2_grpc.py", "cluster_pb2_grpc.pyi")
RPC = re.compile(r"^\s*rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\);", re.M)
MESSAGE = re.compile(r"^message (\w+)", re.M)


def regenerate(out: Path) -> Path:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto"), str(out)],
        check=True,
        env=env,
        capture_output=True,
        timeout=120,
    )
    return out / "core" / "cluster" / "rpc"


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    fresh = regenerate(tmp_path)
    made = sorted(path.name for path in fresh.iterdir())
    assert made == sorted(NAMES)
    drifted = [
        name for name in NAMES if (fresh / name).read_bytes() != (GENERATED / name).read_bytes()
    ]
    assert drifted == [], (
        f"{drifted} differ from what scripts/gen-proto makes now: run it and commit the result "
        f"(installed grpcio-tools {version('grpcio-tools')}, mypy-protobuf "
        f"{version('mypy-protobuf')})"
    )


def test_generated_code_imports_its_package_path() -> None:
    grpc_module = (GENERATED / "cluster_pb2_grpc.py").read_text()
    assert "from core.cluster.rpc import cluster_pb2 as" in grpc_module
    assert not re.search(r"^import cluster_pb2", grpc_module, re.M)
    # The wire names stay in the proto package, whatever the Python path.
    assert "'/braid.cluster.v1.Node/Admin'" in grpc_module


def test_section_7_shows_the_committed_service() -> None:
    doc = (ROOT / "docs" / "cluster.md").read_text()
    section = doc[doc.index("## 7. gRPC between nodes") : doc.index("## 8. ")]
    block = section[section.index("```proto") : section.index("```", section.index("```proto") + 3)]
    service = pb.DESCRIPTOR.services_by_name["Node"]
    methods = {
        (m.name, m.client_streaming, m.input_type.name, m.server_streaming, m.output_type.name)
        for m in service.methods
    }
    shown = {
        (name, bool(streams_in), request, bool(streams_out), reply)
        for name, streams_in, request, streams_out, reply in RPC.findall(block)
    }
    assert shown == methods
    assert set(MESSAGE.findall(block)) == set(pb.DESCRIPTOR.message_types_by_name)
