"""Issue 21 item 6 for MQTT: one flipped byte in a sealed segment. A persistent session's
delivery must not stop at the damaged record: the session's queue skips it with an ERROR line
naming the damaged record and delivers every other one (it passed when written: the ack queue's
skip of issue 21 covers MQTT sessions, which read through the same queues as AMQP). Two offline
sessions -- a 3.1.1 one (Clean Session 0) and a 5.0 one (Session Expiry Interval) -- subscribed
at QoS 1 to the topic the messages are published to; the broker is stopped, a byte is flipped in
a record of a sealed segment, the clean-shutdown marker removed (so the background verification
runs too), the broker restarted, and the sessions reconnect."""

from __future__ import annotations

import queue
import re
import time
from pathlib import Path

from tests.braid_process import BraidProcess
from tests.faults.test_corrupt_segment import flip_byte_of
from tests.mqtt.clients import Paho

SEGMENT_BYTES = 64 * 1024  # tests/faults/test_corrupt_segment.py's size: it flips with it
RECORDS = 2000  # over three sealed segments
TOPIC = "corrupt-m"  # the MQTT topic, also the log topic the records are in
DAMAGED = 700  # the offset of the record that gets a flipped byte (in a sealed segment)
DEADLINE_S = 60.0  # a delivery that does not come within this fails the test
SESSION_EXPIRY_S = 3600


def publish_all(braid: BraidProcess) -> None:
    publisher = Paho(braid.mqtt_port, version=4)
    publisher.client.max_inflight_messages_set(200)
    publisher.connect()
    infos = [publisher.client.publish(TOPIC, b"m-%d" % n, qos=1) for n in range(RECORDS)]
    for info in infos:
        info.wait_for_publish(DEADLINE_S)
        assert info.is_published()
    publisher.close()


def receive(client: Paho, count: int) -> list[bytes]:
    """Payloads until ``count`` came (or the deadline passed: then what came, for the assert)."""
    payloads: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(payloads) < count and time.monotonic() < deadline:
        try:
            payloads.append(bytes(client.get(timeout=0.5).payload))
        except queue.Empty:  # look at the deadline again
            continue
    return payloads


def test_a_flipped_byte_costs_a_persistent_session_one_message(tmp_path: Path) -> None:
    config = tmp_path / "braid.toml"
    config.write_text(f"[log]\nsegment_size = {SEGMENT_BYTES}\n")
    braid = BraidProcess(tmp_path, listeners=("mqtt",), extra_args=("--config", str(config)))
    clients = {
        "v311": Paho(braid.mqtt_port, client_id="corrupt-v311", version=4, clean=False),
        "v5": Paho(braid.mqtt_port, client_id="corrupt-v5", version=5, clean=False),
    }
    with braid:
        for name, client in clients.items():
            client.connect(expiry=SESSION_EXPIRY_S if name == "v5" else None)
            client.subscribe(TOPIC, qos=1)
            client.close()
        publish_all(braid)
    flip_byte_of(braid.data_dir, TOPIC, DAMAGED)
    # A start without the clean-shutdown marker, as in test_corrupt_segment.py: the sealed
    # segments are verified in the background while the sessions read them.
    (braid.data_dir / "clean_shutdown").unlink()
    expected = [b"m-%d" % n for n in range(RECORDS) if n != DAMAGED]
    with braid:
        for name, client in clients.items():
            again = Paho(
                braid.mqtt_port, client_id=client.client_id, version=client.version, clean=False
            )
            _, present, _ = again.connect(expiry=SESSION_EXPIRY_S if name == "v5" else None)
            assert present, name
            payloads = receive(again, len(expected))
            again.close()
            assert payloads == expected, (name, len(payloads))
    # The damaged record named, for each session's queue.
    log = braid.stderr()
    for client in clients.values():
        line = (
            rf"ERROR .*session\.{client.client_id}/0: records (\d+)\.\.\1 skipped: corrupt record"
        )
        assert re.search(line, log), log[-3000:]
