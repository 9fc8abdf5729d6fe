"""Random client streams built with pamqp, cut at random places: the decoder sees what was sent."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.common import FieldTable

from bench import codec_amqp as bench_codec
from gateway.amqp.codec import AmqpDecoder
from gateway.amqp.constants import PROTOCOL_HEADER
from gateway.amqp.events import HEARTBEAT, Ack, Method, Nack, ProtocolHeader, Publish, Reject
from tests.amqp.wire import feed_chunks, marshal, normalized

FRAME_MAX = 4096
names = st.text(alphabet=string.ascii_letters + string.digits + "-_.:", max_size=30)
channels = st.integers(1, 5)
tags = st.integers(0, 2**63 - 1)  # pamqp reads a longlong as signed


@st.composite
def publish(draw: st.DrawFn) -> tuple[bytes, object]:
    channel = draw(channels)
    exchange, routing_key = draw(names), draw(st.text(max_size=30))
    mandatory = draw(st.booleans())
    body = draw(st.binary(max_size=10_000))
    choices: list[FieldTable | None] = [None, {"a": 1}, {"x-death": [{"count": 1}]}]
    headers = draw(st.sampled_from(choices))
    props = commands.Basic.Properties(
        content_type=draw(st.sampled_from([None, "text/plain"])),
        delivery_mode=draw(st.sampled_from([None, 1, 2])),
        headers=headers,
    )
    step = FRAME_MAX - 8
    wire = marshal(
        channel,
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        pamqp_header.ContentHeader(0, len(body), props),
        *[pamqp_body.ContentBody(body[i : i + step]) for i in range(0, len(body), step)],
    )
    event = Publish(channel, exchange, routing_key, mandatory, False, props.marshal(), body)
    return wire, event


@st.composite
def ack(draw: st.DrawFn) -> tuple[bytes, object]:
    channel, tag, multiple = draw(channels), draw(tags), draw(st.booleans())
    return marshal(channel, commands.Basic.Ack(tag, multiple)), Ack(channel, tag, multiple)


@st.composite
def nack(draw: st.DrawFn) -> tuple[bytes, object]:
    channel, tag = draw(channels), draw(tags)
    multiple, requeue = draw(st.booleans()), draw(st.booleans())
    wire = marshal(channel, commands.Basic.Nack(tag, multiple, requeue))
    return wire, Nack(channel, tag, multiple, requeue)


@st.composite
def reject(draw: st.DrawFn) -> tuple[bytes, object]:
    channel, tag, requeue = draw(channels), draw(tags), draw(st.booleans())
    return marshal(channel, commands.Basic.Reject(tag, requeue)), Reject(channel, tag, requeue)


@st.composite
def control(draw: st.DrawFn) -> tuple[bytes, object]:
    channel = draw(channels)
    method = draw(
        st.sampled_from(
            [
                commands.Basic.Qos(prefetch_count=10),
                commands.Queue.Declare(queue="q", arguments={"x-max-length": 5}),
                commands.Basic.Consume(queue="q", consumer_tag="c"),
                commands.Confirm.Select(),
                commands.Channel.Flow(active=True),
            ]
        )
    )
    return marshal(channel, method), Method(channel, method)


def heartbeat() -> st.SearchStrategy[tuple[bytes, object]]:
    return st.just((marshal(0, pamqp_heartbeat.Heartbeat()), HEARTBEAT))


frames = st.one_of(publish(), ack(), nack(), reject(), control(), heartbeat())


@given(
    st.lists(frames, max_size=12),
    st.lists(st.integers(0, 60_000), max_size=20),
)
def test_random_stream_random_cuts(items: list[tuple[bytes, object]], cuts: list[int]) -> None:
    wire = PROTOCOL_HEADER + b"".join(w for w, _ in items)
    decoder = AmqpDecoder(frame_max=FRAME_MAX)
    events = feed_chunks(decoder, wire, cuts)
    assert normalized(events) == normalized(
        [ProtocolHeader(PROTOCOL_HEADER)] + [e for _, e in items]
    )
    assert decoder.buffered == 0
    assert not decoder.closing


def test_bench_functions_run() -> None:
    """Smoke-run the benchmark (no timing asserts: the figures are reported, not tested)."""
    assert bench_codec.check_stream_decodes().body == b"x" * 100
    assert bench_codec.bench_publish_decode(triples=200, repeat=1) > 0
    assert bench_codec.bench_deliver_encode(delivers=200, repeat=1) > 0
