"""The record frame: round trips, verification, corruption detection on byte strings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.log import record as rec

names = st.text(min_size=0, max_size=30)
short_bytes = st.binary(max_size=300)


@given(
    topic=names,
    queue=st.integers(0, 2**32 - 1),
    body=st.one_of(st.none(), short_bytes),
    key=st.one_of(st.none(), short_bytes),
    headers=st.lists(st.tuples(names, short_bytes), max_size=5),
    tags=st.lists(st.text(max_size=20), max_size=4),
    subject=names,
    client=names,
    address=names,
    destinations=st.lists(st.tuples(names, st.integers(0, 1000)), max_size=4),
    protocol=st.sampled_from(list(rec.PROTOCOL_NAMES)),
    times=st.tuples(st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62)),
)
def test_frame_round_trip(
    topic, queue, body, key, headers, tags, subject, client, address, destinations, protocol, times
):
    store_ms, born_ms, deliver_at_ms = times
    frame = rec.encode_record(
        topic.encode(),
        queue,
        body,
        store_ms=store_ms,
        key=key,
        headers=rec.encode_headers(headers),
        tags=rec.encode_tags(tags),
        subject=subject.encode(),
        client=client.encode(),
        address=address.encode(),
        destinations=rec.encode_destinations(destinations),
        protocol=protocol,
        born_ms=born_ms,
        deliver_at_ms=deliver_at_ms,
    )
    padded = b"\xaa" * 7 + frame + b"\x00" * 5
    assert rec.verify_frame(memoryview(padded), 7, len(padded)) == len(frame)
    decoded = rec.decode_record(padded, 7, position=1234)
    assert decoded.position == 1234
    assert decoded.size == len(frame)
    assert (decoded.topic, decoded.queue, decoded.subject) == (topic, queue, subject)
    assert decoded.body == body
    assert decoded.key == key
    assert decoded.headers == headers
    assert decoded.tags == tags
    assert (decoded.client, decoded.address) == (client, address)
    assert decoded.destinations == destinations
    assert decoded.protocol == protocol
    assert decoded.store_ms == store_ms
    assert decoded.born_ms == (born_ms or store_ms)
    assert decoded.deliver_at_ms == deliver_at_ms
    assert bytes(rec.body_slice(memoryview(padded), 7)) == (body or b"")
    assert rec.tags_slice(memoryview(padded), 7) == tags


@given(st.binary(min_size=1, max_size=200), st.data())
def test_any_flipped_byte_is_detected(body, data):
    frame = bytearray(rec.encode_record(b"t", 0, body, store_ms=1, key=b"k"))
    index = data.draw(st.integers(0, len(frame) - 1))
    flip = data.draw(st.integers(1, 255))
    frame[index] ^= flip
    with pytest.raises(rec.CorruptRecordError):
        rec.verify_frame(memoryview(frame), 0, len(frame))


def test_truncated_frame_is_detected():
    frame = rec.encode_record(b"t", 0, b"x" * 100, store_ms=1)
    for cut in (0, 4, 12, 71, len(frame) - 1):
        with pytest.raises(rec.CorruptRecordError):
            rec.verify_frame(memoryview(frame[:cut]), 0, cut)


def test_blank_frame_verifies_as_its_size():
    blank = rec.blank_frame(50)
    assert rec.verify_frame(memoryview(blank), 0, 50) == 50


def test_link_body_round_trip():
    targets = [(2**40 + 3, 777), (5, 80)]
    assert rec.decode_link_body(rec.encode_link_body(targets)) == targets


def test_null_key_and_body_flags():
    frame = rec.encode_record(b"t", 0, None, store_ms=5, key=None)
    decoded = rec.decode_record(frame, 0)
    assert decoded.key is None
    assert decoded.body is None
    assert decoded.flags & rec.FLAG_NULL_KEY
    assert decoded.flags & rec.FLAG_NULL_BODY
