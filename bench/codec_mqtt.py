"""Throughput of the MQTT codec on one core: PUBLISH decode and encode, PUBACK encode.

    python -m bench codec mqtt          # prints packets/s per case

``measure()`` returns the rates (packets per second, best of ``repeats`` runs) so a caller can
record them; nothing here asserts a speed. Cases, each with a 100-byte payload by default:

- ``decode_64k_*``: ``MqttDecoder`` fed ``batch`` packets in 64 KiB reads (about 450 packets in
  each), the way a transport delivers a busy connection's bytes; all packets of a read are
  decoded by the one ``feed()`` call that takes it.
- ``decode_one_buffer_*``: the same ``batch`` packets in one buffer and one call. Slower per
  packet than 64 KiB reads: the 20,000 live packet objects make the garbage collector's
  generations grow, which a transport handling packets read by read does not see.
- ``encode_publish_*``: the broker's delivery path, ``encode_publish`` with fields.
- ``encode_packet_*``: the general ``encode(Publish(...))``, which also validates.
- ``mqtt5_*``: the Rust ``mqtt5`` wheel (5.0 only), if installed, as a reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.mqtt.decoder import MqttDecoder
from gateway.mqtt.encoder import encode, encode_puback, encode_publish
from gateway.mqtt.packet_types import MQTT_3_1_1, MQTT_5
from gateway.mqtt.packets import Publish

TOPIC = "sensors/building-7/floor-3/temperature"
READ_SIZE = 64 * 1024  # a typical socket read (asyncio's default max read is 256 KiB)


def _best_rate(run: Callable[[], object], count: int, repeats: int) -> float:
    """Packets per second of the fastest of ``repeats`` calls of ``run`` (``count`` each).

    Timed with the thread's CPU clock, so time spent descheduled on a shared machine does not
    count (cache and SMT contention from other processes still do)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        run()
        best = min(best, time.thread_time() - start)
    return count / best


def _decode_all(data: bytes, version: int) -> Callable[[], object]:
    def run() -> object:
        decoder = MqttDecoder(version)
        return decoder.feed(data)

    return run


def _decode_in_reads(data: bytes, version: int) -> Callable[[], object]:
    reads = [data[i : i + READ_SIZE] for i in range(0, len(data), READ_SIZE)]

    def run() -> object:
        decoder = MqttDecoder(version)
        count = 0
        for chunk in reads:
            count += len(decoder.feed(chunk))
        return count

    return run


def _encode_publish_loop(payload: bytes, qos: int, version: int, n: int) -> Callable[[], object]:
    packet_id = 1 if qos else None

    def run() -> object:
        # The bytes are dropped at once, as after ``transport.write``.
        for _ in range(n):
            encode_publish(TOPIC, payload, qos, packet_id, False, False, b"", version)
        return None

    return run


def _encode_packet_loop(packet: Publish, version: int, n: int) -> Callable[[], object]:
    def run() -> object:
        for _ in range(n):
            encode(packet, version)
        return None

    return run


def _encode_puback_loop(version: int, n: int) -> Callable[[], object]:
    def run() -> object:
        for packet_id in range(1, n + 1):
            encode_puback(packet_id & 0xFFFF or 1, 0, version)
        return None

    return run


def _mqtt5_cases(payload: bytes, batch: int, repeats: int) -> dict[str, float]:
    try:
        import mqtt5  # type: ignore[import-not-found]
    except ImportError:
        return {}
    rates: dict[str, float] = {}
    for qos in (0, 1):
        kwargs: dict[str, Any] = {"qos": mqtt5.QoS(qos)}
        if qos:
            kwargs["packet_id"] = 1
        packet = mqtt5.PublishPacket(TOPIC, payload, **kwargs)
        data = packet.write() * batch

        def decode(data: bytes = data) -> object:
            view = memoryview(data)
            out: list[Any] = []
            offset = 0
            while offset < len(data):
                decoded, used = mqtt5.read(view[offset:])
                out.append(decoded)
                offset += used
            return out

        def encode_loop(packet: Any = packet) -> object:
            for _ in range(batch):
                packet.write()
            return None

        def build_and_encode(kwargs: dict[str, Any] = kwargs) -> object:
            for _ in range(batch):
                mqtt5.PublishPacket(TOPIC, payload, **kwargs).write()
            return None

        rates[f"mqtt5_decode_qos{qos}_v5"] = _best_rate(decode, batch, repeats)
        rates[f"mqtt5_encode_qos{qos}_v5"] = _best_rate(encode_loop, batch, repeats)
        rates[f"mqtt5_build_encode_qos{qos}_v5"] = _best_rate(build_and_encode, batch, repeats)
    return rates


def measure(
    payload_size: int = 100, batch: int = 20_000, repeats: int = 15, reference: bool = True
) -> dict[str, float]:
    """Packets per second for each case (see the module docstring)."""
    payload = bytes(range(256)) * (payload_size // 256) + bytes(payload_size % 256)
    rates: dict[str, float] = {}
    for version, tag in ((MQTT_3_1_1, "v311"), (MQTT_5, "v5")):
        for qos in (0, 1):
            packet = Publish(TOPIC, payload, qos, packet_id=1 if qos else None)
            data = encode(packet, version) * batch
            case = f"qos{qos}_{tag}"
            rates[f"decode_64k_{case}"] = _best_rate(
                _decode_in_reads(data, version), batch, repeats
            )
            rates[f"decode_one_buffer_{case}"] = _best_rate(
                _decode_all(data, version), batch, repeats
            )
            rates[f"encode_publish_{case}"] = _best_rate(
                _encode_publish_loop(payload, qos, version, batch), batch, repeats
            )
            rates[f"encode_packet_{case}"] = _best_rate(
                _encode_packet_loop(packet, version, batch), batch, repeats
            )
        rates[f"encode_puback_{tag}"] = _best_rate(
            _encode_puback_loop(version, batch), batch, repeats
        )
    if reference:
        rates.update(_mqtt5_cases(payload, batch, repeats))
    return rates


def main(argv: list[str] | None = None) -> None:
    publish = Publish(TOPIC, bytes(100), 1, packet_id=1)
    print(f"PUBLISH with 100-byte payload: {len(encode(publish, MQTT_5))} bytes on the wire (5.0)")
    for case, rate in measure().items():
        print(f"{case:32s} {rate / 1e6:6.2f} M packets/s")


if __name__ == "__main__":
    main()
