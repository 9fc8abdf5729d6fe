"""Issue 21 item 3: file descriptors. The broker runs under ``ulimit -n 256`` (soft and hard);
one MQTT client publishes to thousands of topics (each a queue with its own index file: about
2 descriptors each before the fix, so the broker ran out near 120), then a second client still
connects and is served, checkpoints go on, and a restart is not stuck."""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from tests.braid_process import BraidProcess
from tests.faults.volume import metrics, wait_for

FD_LIMIT = 256
TOPICS = 2000  # queues, each with an index file: far more than 256 descriptors' worth
CONNECTIONS = 300  # more than the limit: refused ones first, then accept() itself fails


class LimitedBraid(BraidProcess):
    """``braid serve`` under ``prlimit --nofile=256:256`` (what ``ulimit -n 256`` sets)."""

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", *super().command()]


def connected_client(braid: BraidProcess, client_id: str) -> Any:
    """A paho client once the broker accepted it: a refusal (Server unavailable, while the
    broker still holds the descriptors of connections just closed) is retried, as a client
    with a reconnect delay would."""
    accepted: list[Any] = []

    def attempt() -> bool:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        answered = threading.Event()
        codes: list[Any] = []

        def on_connect(_c: Any, _u: Any, _flags: Any, reason: Any, _props: Any) -> None:
            codes.append(reason)
            answered.set()

        client.on_connect = on_connect
        client.connect("127.0.0.1", braid.mqtt_port, keepalive=60)
        client.loop_start()
        if answered.wait(30) and not codes[0].is_failure:
            accepted.append(client)
            return True
        client.disconnect()
        client.loop_stop()
        return False

    wait_for(attempt, f"{client_id} accepted")
    return accepted[0]


def checkpoints(braid: BraidProcess) -> int:
    found = re.search(r"^braid_log_checkpoints_total (\d+)$", metrics(braid.http_port), re.M)
    assert found is not None
    return int(found.group(1))


def open_fds(braid: BraidProcess) -> int:
    assert braid.process is not None
    return len(list(Path(f"/proc/{braid.process.pid}/fd").iterdir()))


def publish_to_many_topics(braid: BraidProcess) -> None:
    client = connected_client(braid, "many-topics")
    acked: set[int] = set()
    client.on_publish = lambda _c, _u, mid, _reason, _props: acked.add(mid)
    sent = [client.publish(f"t{number}/x", b"v", qos=1).mid for number in range(TOPICS)]
    wait_for(lambda: acked >= set(sent), f"PUBACKs for {TOPICS} topics", deadline_s=300)
    client.disconnect()
    client.loop_stop()


def second_client_round_trip(braid: BraidProcess, payload: bytes) -> None:
    client = connected_client(braid, "second")
    received = threading.Event()
    subscribed = threading.Event()
    client.on_message = lambda _c, _u, message: message.payload == payload and received.set()
    client.on_subscribe = lambda *_args: subscribed.set()
    client.subscribe("after/#", qos=1)
    assert subscribed.wait(60)
    client.publish("after/one", payload, qos=1)
    assert received.wait(60)
    client.disconnect()
    client.loop_stop()


def mqtt_connect_packet(client_id: str) -> bytes:
    """An MQTT 3.1.1 CONNECT, clean session, keep alive 60."""
    name = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(name).to_bytes(2, "big") + name
    return bytes([0x10, len(body)]) + body


def connack_code(sock: socket.socket) -> int | None:
    """The CONNACK return code, or None when the broker closed the connection instead."""
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            return None
        data += chunk
    assert data[0] == 0x20
    return data[3]


def flood(braid: BraidProcess) -> tuple[list[int | None], int]:
    """CONNECTIONS sockets, each sending a CONNECT: their CONNACK codes (None: closed), and how
    many could not even connect (the broker's accept failing, or its backlog full)."""
    sockets: list[socket.socket] = []
    codes: list[int | None] = []
    unconnected = 0
    try:
        for number in range(CONNECTIONS):
            sock = socket.socket()
            sock.settimeout(30)
            sockets.append(sock)
            try:
                sock.connect(("127.0.0.1", braid.mqtt_port))
                sock.sendall(mqtt_connect_packet(f"flood-{number}"))
            except OSError:
                unconnected += 1
        for sock in sockets:
            try:
                codes.append(connack_code(sock))
            except OSError:  # reset, or no answer: accept() never took it
                codes.append(None)
    finally:
        for sock in sockets:
            sock.close()
    return codes, unconnected


def test_thousands_of_topics_under_256_descriptors(tmp_path: Path) -> None:
    braid = LimitedBraid(tmp_path, listeners=("mqtt", "http"))
    with braid:
        publish_to_many_topics(braid)
        assert open_fds(braid) < FD_LIMIT
        # ``before`` is read first: a checkpoint is written only when something changed, and
        # the round trip's records may be checkpointed before it returns (a CI run's did).
        before = checkpoints(braid)
        second_client_round_trip(braid, b"still served")
        wait_for(lambda: checkpoints(braid) > before, "a checkpoint after the load")
        assert "Too many open files" not in braid.stderr()
        # A flood of connections past the limit: the first are accepted (0), those near the
        # limit refused cleanly (3: Server unavailable, 3.1.1's CONNACK for 0x89 Server busy),
        # and past the limit accept() fails; the listener lives on once they are gone.
        codes, _unconnected = flood(braid)
        assert 0 in codes
        assert 3 in codes
        before = checkpoints(braid)
        second_client_round_trip(braid, b"served after the flood")
        wait_for(lambda: checkpoints(braid) > before, "a checkpoint after the flood")
        braid.restart()  # READY_TIMEOUT_S bounds it: not stuck
        second_client_round_trip(braid, b"served after a restart")
        assert open_fds(braid) < FD_LIMIT
    assert "Too many open files" not in braid.stderr()
