"""The "Connect your first client" snippet of docs/amqp.md, docs/mqtt.md and docs/kafka.md runs
as written against a real ``braid serve``, with the real client library: only the host and the
default port are swapped for the test broker's."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.braid_process import BraidProcess

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PORTS = {"amqp": 5672, "mqtt": 1883, "kafka": 9092}
EXPECTED = {
    "amqp": "received b'Hello, BraidMQ'",
    "mqtt": "received sensors/room1/temp b'21.5'",
    "kafka": "received b'order-1' b'Hello, BraidMQ'",
}


def first_client_snippet(doc: Path) -> str:
    text = doc.read_text()
    section = re.search(r"^## Connect your first client\n(.*?)(?=^## )", text, re.M | re.S)
    assert section is not None, f"{doc.name} has no 'Connect your first client' section"
    code = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert code is not None, f"{doc.name}: no Python snippet in the section"
    return code.group(1)


def test_each_protocol_page_starts_with_its_first_client() -> None:
    for protocol in DEFAULT_PORTS:
        text = (REPO / "docs" / f"{protocol}.md").read_text()
        headings = re.findall(r"^## (.+)$", text, re.M)
        assert headings[0] == "Connect your first client", (protocol, headings[:2])


@pytest.fixture(scope="module")
def braid(tmp_path_factory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("snippets")) as process:
        yield process


@pytest.mark.parametrize("protocol", sorted(DEFAULT_PORTS))
def test_the_first_client_snippet_runs(braid: BraidProcess, protocol: str, tmp_path: Path) -> None:
    port = {"amqp": braid.amqp_port, "mqtt": braid.mqtt_port, "kafka": braid.kafka_port}[protocol]
    code = first_client_snippet(REPO / "docs" / f"{protocol}.md")
    code = code.replace(str(DEFAULT_PORTS[protocol]), str(port)).replace("localhost", braid.host)
    script = tmp_path / f"first_{protocol}.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert EXPECTED[protocol] in done.stdout
