"""messages.py without sockets: the record headers a publish stores, the properties a delivery
carries (byte-exact for AMQP records, built for MQTT/Kafka ones, x-death for dead letters)."""

from __future__ import annotations

import json

import pytest

from gateway.amqp.errors import AmqpChannelError
from gateway.amqp.fieldtable import Timestamp
from gateway.amqp.messages import PROPERTIES_HEADER, delivery_properties, publish_info
from gateway.amqp.properties import EMPTY_PROPERTIES, decode_properties, encode_properties
from gateway.amqp.vhost import exchange_name, queue_name


def test_no_properties_store_no_headers() -> None:
    info = publish_info(EMPTY_PROPERTIES)
    assert info.headers == []
    assert info.table is None
    assert not info.persistent


def test_properties_become_documented_record_headers() -> None:
    raw = encode_properties(
        content_type="text/plain",
        delivery_mode=2,
        correlation_id="c",
        reply_to="r",
        message_id="m",
        timestamp=Timestamp(1_700_000_000),
        priority=3,
        expiration="1500",
        headers={"x-delay": 250, "n": 1, "b": b"\x01", "t": True, "x-death": []},
    )
    info = publish_info(raw)
    assert info.headers[0] == (PROPERTIES_HEADER, raw)
    headers = dict(info.headers)
    assert headers["x-braid-content-type"] == b"text/plain"
    assert headers["x-braid-correlation-id"] == b"c"
    assert headers["x-braid-reply-to"] == b"r"
    assert headers["x-braid-message-id"] == b"m"
    assert headers["x-braid-timestamp"] == b"1700000000"
    assert headers["x-braid-priority"] == b"3"
    assert headers["n"] == b"1"
    assert headers["b"] == b"\x01"
    assert headers["t"] == b"true"
    assert "x-death" not in headers  # dead-letter history is the core's, not copied
    assert info.persistent
    assert info.expiration_ms == 1500
    assert info.delay_ms == 250
    assert info.reply_to == "r"
    assert publish_info(raw) is info  # cached per distinct octets


@pytest.mark.parametrize("expiration", ["soon", "-5"])
def test_invalid_expiration_is_a_406(expiration: str) -> None:
    with pytest.raises(AmqpChannelError) as error:
        publish_info(encode_properties(expiration=expiration))
    assert error.value.reply_code == 406


def test_amqp_records_are_delivered_byte_for_byte() -> None:
    raw = encode_properties(content_type="a", headers={"k": "v"})
    headers = [*publish_info(raw).headers, ("x-braid-expires-at", b"99")]
    assert delivery_properties(headers, True, exchange_name, queue_name) == raw
    assert delivery_properties([], True, exchange_name, queue_name) == EMPTY_PROPERTIES


def test_foreign_records_get_properties_from_headers() -> None:
    headers = [
        ("x-braid-content-type", b"application/json"),
        ("x-braid-timestamp", b"1700000000"),
        ("x-braid-priority", b"300"),  # out of range: dropped
        ("x-mqtt-qos", b"1"),
        ("user", "é".encode()),
        ("blob", b"\xff"),
        ("x-braid-expires-at", b"1"),
    ]
    properties = decode_properties(delivery_properties(headers, False, exchange_name, queue_name))
    assert properties == {
        "content_type": "application/json",
        "delivery_mode": 2,
        "timestamp": Timestamp(1_700_000_000),
        "headers": {"user": "é", "blob": b"\xff"},
    }


def test_dead_lettered_records_get_x_death() -> None:
    raw = encode_properties(expiration="10", headers={"keep": 1})
    death = [
        {
            "queue": "amq.queue.work",
            "reason": "expired",
            "count": 2,
            "time": 1_700_000_000_123,
            "exchange": "amq.queue.work",
            "routing-keys": ["work"],
        }
    ]
    headers = [
        (PROPERTIES_HEADER, raw),
        ("x-death", json.dumps(death).encode()),
        ("x-first-death-reason", b"expired"),
    ]
    properties = decode_properties(delivery_properties(headers, True, exchange_name, queue_name))
    assert "expiration" not in properties
    table = properties["headers"]
    assert table["keep"] == 1
    # The expiration it lost is kept in the first death's entry, as RabbitMQ does.
    assert table["x-death"] == [
        {
            "count": 2,
            "reason": "expired",
            "queue": "work",
            "time": Timestamp(1_700_000_000),
            "exchange": "",
            "routing-keys": ["work"],
            "original-expiration": "10",
        }
    ]
    assert table["x-first-death-reason"] == "expired"
    assert table["x-first-death-queue"] == "work"
    assert table["x-first-death-exchange"] == ""
