"""A second, independent codec: pika's frame encoder feeds our decoder, pika decodes our frames."""

from __future__ import annotations

import pika.frame
import pika.spec
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.amqp.codec import encode_ack, encode_deliver, encode_get_ok
from gateway.amqp.events import Ack, Nack, Publish, Reject
from gateway.amqp.fieldtable import Timestamp
from tests.amqp.wire import decoder, feed_chunks

FRAME_MAX = 4096

# pika encodes str, bytes, bool, int, Decimal, datetime, dict, list and None (no floats)
header_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=20),
        st.binary(max_size=20),
    ),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)
short = st.text(max_size=20)
pika_properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": short,
        "headers": st.dictionaries(st.text(max_size=8), header_values, max_size=4),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": short,
        "reply_to": short,
        "expiration": st.integers(0, 10**6).map(str),
        "message_id": short,
        "timestamp": st.integers(0, 2**40),
        "type": short,
        "user_id": short,
        "app_id": short,
    },
)


def expected(properties: dict[str, object]) -> dict[str, object]:
    out = dict(properties)
    if "timestamp" in out:
        out["timestamp"] = Timestamp(out["timestamp"])  # type: ignore[call-overload]
    return out


@settings(max_examples=150)
@given(
    channel=st.integers(1, 65535),
    exchange=st.text(max_size=30),
    routing_key=st.text(max_size=30),
    mandatory=st.booleans(),
    properties=pika_properties,
    body=st.binary(max_size=12_000),
    tag=st.integers(0, 2**64 - 1),
    cuts=st.lists(st.integers(0, 15_000), max_size=6),
)
def test_pika_client_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    properties: dict[str, object],
    body: bytes,
    tag: int,
    cuts: list[int],
) -> None:
    props = pika.spec.BasicProperties(**properties)  # type: ignore[arg-type]
    step = FRAME_MAX - 8
    wire = b"".join(
        [
            pika.frame.Method(
                channel,
                pika.spec.Basic.Publish(
                    exchange=exchange, routing_key=routing_key, mandatory=mandatory
                ),
            ).marshal(),
            pika.frame.Header(channel, len(body), props).marshal(),
            *[
                pika.frame.Body(channel, body[i : i + step]).marshal()
                for i in range(0, len(body), step)
            ],
            pika.frame.Method(
                channel, pika.spec.Basic.Ack(delivery_tag=tag, multiple=True)
            ).marshal(),
            pika.frame.Method(
                channel, pika.spec.Basic.Nack(delivery_tag=tag, multiple=False, requeue=True)
            ).marshal(),
            pika.frame.Method(
                channel, pika.spec.Basic.Reject(delivery_tag=tag, requeue=False)
            ).marshal(),
        ]
    )
    events = feed_chunks(decoder(frame_max=FRAME_MAX), wire, cuts)
    assert len(events) == 4, events
    publish = events[0]
    assert isinstance(publish, Publish)
    assert (publish.channel, publish.exchange, publish.routing_key) == (
        channel,
        exchange,
        routing_key,
    )
    assert (publish.mandatory, publish.immediate, publish.body) == (mandatory, False, body)
    assert publish.properties == expected(properties)
    assert events[1:] == [
        Ack(channel, tag, True),
        Nack(channel, tag, False, True),
        Reject(channel, tag, False),
    ]


def _pika_frames(data: bytes) -> list[object]:
    out = []
    while data:
        used, value = pika.frame.decode_frame(data)
        assert used
        out.append(value)
        data = data[used:]
    return out


@settings(max_examples=150)
@given(
    channel=st.integers(1, 65535),
    consumer_tag=st.text(max_size=30),
    tag=st.integers(0, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=st.text(max_size=30),
    routing_key=st.text(max_size=30),
    properties=pika_properties,
    body=st.binary(max_size=12_000),
)
def test_pika_decodes_our_deliver_and_get_ok(
    channel: int,
    consumer_tag: str,
    tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    properties: dict[str, object],
    body: bytes,
) -> None:
    props = pika.spec.BasicProperties(**properties)  # type: ignore[arg-type]
    props_raw = b"".join(props.encode())
    for out, method_type in (
        (
            encode_deliver(
                channel,
                consumer_tag,
                tag,
                redelivered,
                exchange,
                routing_key,
                props_raw,
                body,
                FRAME_MAX,
            ),
            pika.spec.Basic.Deliver,
        ),
        (
            encode_get_ok(
                channel, tag, redelivered, exchange, routing_key, 7, props_raw, body, FRAME_MAX
            ),
            pika.spec.Basic.GetOk,
        ),
    ):
        frames = _pika_frames(out)
        method = frames[0].method  # type: ignore[attr-defined]
        assert isinstance(method, method_type)
        assert (method.delivery_tag, method.redelivered) == (tag, redelivered)
        assert (method.exchange, method.routing_key) == (exchange, routing_key)
        header = frames[1]
        assert header.body_size == len(body)  # type: ignore[attr-defined]
        assert vars(header.properties) == vars(props)  # type: ignore[attr-defined]
        assert b"".join(f.fragment for f in frames[2:]) == body  # type: ignore[attr-defined]
        assert all(len(f.fragment) <= FRAME_MAX - 8 for f in frames[2:])  # type: ignore[attr-defined]
    deliver = _pika_frames(out)[0]
    assert deliver.channel_number == channel  # type: ignore[attr-defined]


def test_pika_decodes_our_ack() -> None:
    [frame] = _pika_frames(encode_ack(3, 2**64 - 1, True))
    assert isinstance(frame.method, pika.spec.Basic.Ack)  # type: ignore[attr-defined]
    assert frame.method.delivery_tag == 2**64 - 1  # type: ignore[attr-defined]
