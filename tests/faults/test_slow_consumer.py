"""Issue 21 item 4: a slow consumer must not stop everyone. Two raw-socket MQTT 3.1.1 subscribers
on ``#`` (clean session, QoS 0 and QoS 1) that never read stall while paho QoS 1 publishers and a
confluent-kafka producer run. On b9bacd9 MQTT publishers fell from 60k/s to 521/s (every publisher
was paused until the subscriber's socket drained) and memory grew 90 MB/s (Kafka records were
written to the stalled socket's buffer without bound).

Here, in one ``braid serve`` with a small ``[limits] max_outgoing_buffer_bytes``: the healthy
clients' acknowledged counts over a window with the stalled subscribers are at least
``MQTT_MIN_RATIO`` and ``KAFKA_MIN_RATIO`` of those over a window without them (each window
starting once every client has been acknowledged once), the broker's anonymous memory does not
grow beyond a bound derived from the settings and the load's allocator noise, both subscribers are
disconnected after ``stalled_client_timeout_s`` with a log line, and memory is back once they are
gone.

CI runs 2.5 s windows and a 7 s stall timeout; ``BRAID_LONG=1`` runs 4 s windows and 10 s."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from confluent_kafka import KafkaError, Message, Producer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.faults.volume import metrics, wait_for

MIB = 1024 * 1024
MAX_OUTGOING = 256 * 1024  # [limits] max_outgoing_buffer_bytes
LONG = os.environ.get("BRAID_LONG") == "1"
# [limits] stalled_client_timeout_s: longer than one window and its clients' first
# acknowledgements, so the subscribers stall through the whole window with them.
STALL_TIMEOUT_S = 10.0 if LONG else 7.0
WINDOW_S = 4.0 if LONG else 2.5  # each load runs this long; the two windows' counts are compared
MQTT_PUBLISHERS = 2
MQTT_OUTSTANDING = 200  # unacknowledged QoS 1 publishes a paho publisher keeps at most
MQTT_PAYLOAD = b"m" * 200
KAFKA_VALUE = b"k" * 1024  # large, so records buffered for a stalled subscriber would show
# The healthy clients' acknowledged counts with the stalled subscribers, over those without.
# On b9bacd9 the MQTT publishers' was 0.009 (60k/s -> 521/s), the Kafka producers' 0.23 (474k/s ->
# 108k/s, with memory growing 90 MB/s). Not 1 here: the windows without the subscribers skip
# every per-record step for MQTT, while with them each record (some 100k/s from the Kafka
# producer) is matched and offered to the two subscribers on '#', then dropped, on a 2-core
# machine the clients share: measured 0.16-0.39 for MQTT (the Kafka producer takes most of the
# broker) and 0.40-0.49 for Kafka, beside other jobs.
MQTT_MIN_RATIO = 0.1
KAFKA_MIN_RATIO = 0.3
# What the broker's anonymous memory may grow by while the subscribers stall: each stalled
# connection's bound (the transport buffer and the last loop iteration's writes past it) and the
# allocator's noise under the load: the per-record work for the subscribers raised the sampled
# peak by 16-49 MiB over the baseline window's, and the allocator keeps most of it after the
# load (so "memory back" is measured against the same slack). On b9bacd9 memory grew 90 MB/s
# without bound, some 360 MB in one window.
RSS_SLACK = 96 * MIB
RSS_BOUND = 2 * 2 * MAX_OUTGOING + RSS_SLACK


def rss_anon(braid: BraidProcess) -> int:
    """The broker's anonymous resident memory (the mapped log does not count)."""
    assert braid.process is not None
    status = Path(f"/proc/{braid.process.pid}/status").read_text()
    found = re.search(r"^RssAnon:\s+(\d+) kB$", status, re.M)
    assert found is not None
    return int(found.group(1)) * 1024


def stalled_subscriber(braid: BraidProcess, client_id: str, qos: int) -> socket.socket:
    """An MQTT 3.1.1 clean-session client subscribed to ``#`` that reads CONNACK and SUBACK and
    then nothing more (a small receive window, so the broker's buffer is what fills)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", braid.mqtt_port))
    name = client_id.encode()
    # CONNECT: protocol "MQTT" level 4, Clean Session, Keep Alive 0 (no keep-alive timeout).
    variable = b"\x00\x04MQTT\x04\x02\x00\x00" + len(name).to_bytes(2, "big") + name
    sock.sendall(bytes([0x10, len(variable)]) + variable)
    assert recv_exactly(sock, 4) == b"\x20\x02\x00\x00"  # CONNACK accepted
    subscribe = b"\x00\x01" + b"\x00\x01#" + bytes([qos])
    sock.sendall(bytes([0x82, len(subscribe)]) + subscribe)
    assert recv_exactly(sock, 5) == b"\x90\x03\x00\x01" + bytes([qos])  # SUBACK granted
    return sock


def disconnect_times(braid: BraidProcess) -> list[datetime]:
    """When the broker logged each stalled client's disconnection (its log's local time)."""
    return [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in braid.stderr().splitlines()
        if "stalled_client_timeout_s" in line
    ]


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


def closed_by_broker(sock: socket.socket) -> bool:
    """Read what the broker managed to send until the end: True at EOF or a reset."""
    sock.settimeout(0.2)
    try:
        while sock.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


class Load:
    """Healthy clients for one window: paho QoS 1 publishers and a confluent-kafka producer,
    counting what the broker acknowledged. The window starts only once every client has had a
    first acknowledgement (connections, the producer's metadata and the topic's creation are not
    in it: they took longer than a window on a loaded 2-core machine)."""

    def __init__(self, braid: BraidProcess, window: int) -> None:
        self.braid = braid
        self.window = window
        # Acknowledged so far, one counter per client (the MQTT publishers, then the producer).
        self.acked = [0] * (MQTT_PUBLISHERS + 1)
        self.mqtt_acked = 0  # within the window
        self.kafka_acked = 0
        self.kafka_errors: list[KafkaError] = []
        self.stop = threading.Event()

    def run(self, samples: Callable[[], None]) -> None:
        threads = [
            threading.Thread(target=self.mqtt_publisher, args=(number,))
            for number in range(MQTT_PUBLISHERS)
        ]
        threads.append(threading.Thread(target=self.kafka_producer))
        for thread in threads:
            thread.start()
        try:
            try:
                wait_for(
                    lambda: min(self.acked) > 0 or self.kafka_errors,
                    f"a first acknowledgement for every client in window {self.window}",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}; acknowledged {self.acked}") from None
            assert not self.kafka_errors, self.kafka_errors[:3]
            at_start = list(self.acked)
            deadline = time.monotonic() + WINDOW_S
            while time.monotonic() < deadline:
                samples()
                time.sleep(0.1)
            at_end = list(self.acked)
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert not self.kafka_errors, self.kafka_errors[:3]
        in_window = [end - start for start, end in zip(at_start, at_end, strict=True)]
        self.mqtt_acked = sum(in_window[:MQTT_PUBLISHERS])
        self.kafka_acked = in_window[MQTT_PUBLISHERS]

    def mqtt_publisher(self, number: int) -> None:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"pub-{self.window}-{number}",
            protocol=mqtt.MQTTv311,
        )
        client.max_inflight_messages_set(MQTT_OUTSTANDING)
        acked = threading.Semaphore(0)

        def on_publish(*_args: Any) -> None:
            self.acked[number] += 1
            acked.release()

        client.on_publish = on_publish
        client.connect("127.0.0.1", self.braid.mqtt_port, keepalive=60)
        client.loop_start()
        try:
            sent = 0
            while not self.stop.is_set():
                if sent - self.acked[number] >= MQTT_OUTSTANDING:
                    acked.acquire(timeout=0.1)
                    continue
                client.publish(f"load/{number}", MQTT_PAYLOAD, qos=1)
                sent += 1
        finally:
            client.disconnect()
            client.loop_stop()

    def kafka_producer(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.braid.kafka_bootstrap, "linger.ms": 5, "log_level": 0}
        )

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is None:
                self.acked[MQTT_PUBLISHERS] += 1
            else:
                self.kafka_errors.append(error)

        while not self.stop.is_set():
            try:
                producer.produce("kafka-load", KAFKA_VALUE, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.flush(30)


def test_a_stalled_subscriber_does_not_stop_publishers_and_is_disconnected(
    tmp_path: Path,
) -> None:
    config = tmp_path / "braid.toml"
    config.write_text(
        f"[limits]\nmax_outgoing_buffer_bytes = {MAX_OUTGOING}\n"
        f"stalled_client_timeout_s = {STALL_TIMEOUT_S}\n"
    )
    with BraidProcess(
        tmp_path, listeners=("mqtt", "kafka", "http"), extra_args=("--config", str(config))
    ) as braid:
        peaks = [0, 0]

        def sampler(window: int) -> Callable[[], None]:
            def sample() -> None:
                peaks[window] = max(peaks[window], rss_anon(braid))

            return sample

        # A first window warms the broker up (topics created, allocator grown); the second
        # is the baseline without the stalled subscribers.
        Load(braid, 0).run(sampler(0))
        baseline = Load(braid, 1)
        peaks[0] = 0
        baseline.run(sampler(0))

        stalled_at = datetime.now()
        stalled = [stalled_subscriber(braid, "stalled-qos0", 0)]
        stalled.append(stalled_subscriber(braid, "stalled-qos1", 1))
        try:
            with_stalled = Load(braid, 2)
            with_stalled.run(sampler(1))
            ratios = (
                with_stalled.mqtt_acked / baseline.mqtt_acked,
                with_stalled.kafka_acked / baseline.kafka_acked,
            )
            counts = (
                baseline.mqtt_acked,
                with_stalled.mqtt_acked,
                baseline.kafka_acked,
                with_stalled.kafka_acked,
            )
            assert ratios[0] >= MQTT_MIN_RATIO, (ratios, counts)
            assert ratios[1] >= KAFKA_MIN_RATIO, (ratios, counts)
            assert peaks[1] <= peaks[0] + RSS_BOUND, (peaks, RSS_BOUND)
            dropped = re.search(
                r"^braid_mqtt_messages_dropped_total (\d+)", metrics(braid.http_port), re.M
            )
            assert dropped is not None
            assert int(dropped.group(1)) > 0

            # Both are disconnected once they have stayed stalled for the timeout.
            wait_for(
                lambda: braid.stderr().count("stalled_client_timeout_s") == 2,
                "the stalled subscribers to be disconnected",
                deadline_s=STALL_TIMEOUT_S * 6,
            )
            for when in disconnect_times(braid):
                assert when >= stalled_at + timedelta(seconds=STALL_TIMEOUT_S), (when, stalled_at)
            for sock in stalled:
                wait_for(partial(closed_by_broker, sock), "the socket to be closed")
        finally:
            for sock in stalled:
                sock.close()
        # What was buffered for them is freed: memory is back to the baseline's.
        wait_for(
            lambda: rss_anon(braid) <= peaks[0] + RSS_SLACK,
            f"anonymous memory back under {peaks[0] + RSS_SLACK} (peak {peaks[1]})",
        )
