"""Throughput of the AMQP codec's hot paths, on one core.

    python -m bench codec amqp [body_size]

* ``bench_publish_decode``: Basic.Publish + content header + body triples, built with pamqp as a
  client would send them, fed to ``AmqpDecoder`` in 64 KiB reads (so frames straddle reads as
  they do on a socket); triples decoded per second.
* ``bench_deliver_encode``: ``encode_deliver`` calls per second with the properties a typical
  client publishes.

Time is this process's CPU time (``time.process_time``), so the figures are per core even when
other processes share the CPU, and each is the best of ``repeat`` runs (the least disturbed).
Targets (100-byte bodies): 300k triples/s decoded, 500k delivers/s encoded.
"""

from __future__ import annotations

import sys
import time

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from gateway.amqp.codec import AmqpDecoder, encode_deliver
from gateway.amqp.constants import DEFAULT_FRAME_MAX
from gateway.amqp.events import Publish
from gateway.amqp.properties import encode_properties

READ_SIZE = 65536  # asyncio's default read size for a socket transport (selector_events)

# What pika/aio-pika put on a typical persistent JSON message.
TYPICAL_PROPERTIES = {"content_type": "application/json", "delivery_mode": 2}


def publish_stream(triples: int, body_size: int = 100, channel: int = 1) -> bytes:
    """``triples`` publish + header + body frame triples, as pamqp marshals them."""
    properties = commands.Basic.Properties(content_type="application/json", delivery_mode=2)
    one = b"".join(
        (
            pamqp_frame.marshal(
                commands.Basic.Publish(exchange="amq.topic", routing_key="sensors.room1.temp"),
                channel,
            ),
            pamqp_frame.marshal(pamqp_header.ContentHeader(0, body_size, properties), channel),
            # an empty body has no body frame (pika and RabbitMQ send none; one would be a 505)
            pamqp_frame.marshal(pamqp_body.ContentBody(b"x" * body_size), channel)
            if body_size
            else b"",
        )
    )
    return one * triples


def bench_publish_decode(body_size: int = 100, triples: int = 100_000, repeat: int = 5) -> float:
    """Publish triples decoded per second (best of ``repeat`` runs)."""
    stream = publish_stream(triples, body_size)
    reads = [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]
    best = float("inf")
    for _ in range(repeat):
        decoder = AmqpDecoder(frame_max=DEFAULT_FRAME_MAX, expect_protocol_header=False)
        count = 0
        started = time.process_time()
        for data in reads:
            count += len(decoder.feed(data))
        best = min(best, time.process_time() - started)
        if count != triples:
            raise AssertionError(f"decoded {count} events from {triples} triples")
    return triples / best


def bench_deliver_encode(body_size: int = 100, delivers: int = 100_000, repeat: int = 5) -> float:
    """``encode_deliver`` calls per second (best of ``repeat`` runs)."""
    properties_raw = encode_properties(TYPICAL_PROPERTIES)
    body = b"x" * body_size
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for tag in range(1, delivers + 1):
            encode_deliver(
                1, "amq.ctag-1", tag, False, "amq.topic", "sensors.room1.temp", properties_raw, body
            )
        best = min(best, time.process_time() - started)
    return delivers / best


def check_stream_decodes() -> Publish:
    """One triple of the benchmark stream decodes to the expected event (a sanity check)."""
    events = AmqpDecoder(expect_protocol_header=False).feed(publish_stream(1))
    event = events[0]
    if not isinstance(event, Publish) or event.properties != TYPICAL_PROPERTIES:
        raise AssertionError(f"unexpected {events!r}")
    return event


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    body_size = int(args[0]) if args else 100
    check_stream_decodes()
    decode_rate = bench_publish_decode(body_size)
    encode_rate = bench_deliver_encode(body_size)
    print(f"body {body_size} B: decode {decode_rate:,.0f} publish triples/s (target 300,000)")
    print(f"body {body_size} B: encode {encode_rate:,.0f} delivers/s (target 500,000)")


if __name__ == "__main__":
    main()
