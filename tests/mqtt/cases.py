"""(packet, bytes) pairs, one table per protocol version, written out by hand from the
specifications (byte counts in the comments), used by the tests in both directions."""

from __future__ import annotations

from gateway.mqtt.codec import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)


def h(text: str) -> bytes:
    """Hex with spaces and '…' quoted ASCII: h("00 03 'a/b'") == b"\\x00\\x03a/b"."""
    out = bytearray()
    for i, part in enumerate(text.split("'")):
        out += part.encode() if i % 2 else bytes.fromhex(part)
    return bytes(out)


Case = tuple[str, Packet, bytes]

V311_CASES: list[Case] = [
    (
        "connect-minimal",
        Connect("c", 4, clean_start=True, keep_alive=60),
        # remaining 13: name 6, level 1, flags 1, keep alive 2, client id 3
        h("10 0D 00 04 'MQTT' 04 02 00 3C 00 01 'c'"),
    ),
    (
        "connect-will-username-password",
        Connect(
            "id",
            4,
            clean_start=False,
            keep_alive=10,
            username="u",
            password=b"pw",
            will=Will("w", b"bye", qos=1, retain=True),
        ),
        # flags 0xEC: user name 0x80, password 0x40, will retain 0x20, will QoS 1 0x08, will 0x04
        h("10 1D 00 04 'MQTT' 04 EC 00 0A 00 02 'id' 00 01 'w' 00 03 'bye' 00 01 'u' 00 02 'pw'"),
    ),
    ("connack-session-present", Connack(True, 0), h("20 02 01 00")),
    ("connack-not-authorized", Connack(False, 5), h("20 02 00 05")),
    ("publish-qos0", Publish("a/b", b"hi"), h("30 07 00 03 'a/b' 'hi'")),
    (
        "publish-qos1-retain-dup",
        Publish("a/b", b"hi", 1, retain=True, dup=True, packet_id=10),
        h("3B 09 00 03 'a/b' 00 0A 'hi'"),
    ),
    (
        "publish-qos2-empty-payload",
        Publish("t", b"", 2, packet_id=0xFFFF),
        h("34 05 00 01 't' FF FF"),
    ),
    (
        "publish-two-byte-length",
        Publish("t", b"x" * 200),
        # remaining length 203 = 0xCB: 0x4B | 0x80, 0x01
        h("30 CB 01 00 01 't'") + b"x" * 200,
    ),
    ("puback", Puback(7), h("40 02 00 07")),
    ("pubrec", Pubrec(7), h("50 02 00 07")),
    ("pubrel", Pubrel(7), h("62 02 00 07")),
    ("pubcomp", Pubcomp(7), h("70 02 00 07")),
    (
        "subscribe",
        Subscribe(1, (Subscription("a/#", 1), Subscription("b", 0))),
        h("82 0C 00 01 00 03 'a/#' 01 00 01 'b' 00"),
    ),
    ("suback", Suback(1, (1, 0x80)), h("90 04 00 01 01 80")),
    ("unsubscribe", Unsubscribe(2, ("a/#",)), h("A2 07 00 02 00 03 'a/#'")),
    ("unsuback", Unsuback(2), h("B0 02 00 02")),
    ("pingreq", Pingreq(), h("C0 00")),
    ("pingresp", Pingresp(), h("D0 00")),
    ("disconnect", Disconnect(), h("E0 00")),
]

V5_CASES: list[Case] = [
    (
        "connect-minimal",
        Connect("c", 5, keep_alive=60),
        # remaining 14: name 6, level 1, flags 1, keep alive 2, property length 1, client id 3
        h("10 0E 00 04 'MQTT' 05 02 00 3C 00 00 01 'c'"),
    ),
    (
        "connect-full",
        Connect(
            "id",
            5,
            clean_start=True,
            keep_alive=30,
            username="u",
            password=b"p",
            will=Will(
                "w",
                b"x",
                qos=2,
                properties=Properties(payload_format_indicator=1, will_delay_interval=5),
            ),
            properties=Properties(
                session_expiry_interval=3600, receive_maximum=20, user_properties=(("k", "v"),)
            ),
        ),
        # flags 0xD6: user name, password, will QoS 2 (0x10), will, clean start
        # properties (15): session expiry 0x11, receive maximum 0x21, user property 0x26
        # will properties (7): payload format 0x01, will delay 0x18
        h("10 32 00 04 'MQTT' 05 D6 00 1E")
        + h("0F 11 00 00 0E 10 21 00 14 26 00 01 'k' 00 01 'v'")
        + h("00 02 'id' 07 01 01 18 00 00 00 05 00 01 'w' 00 01 'x' 00 01 'u' 00 01 'p'"),
    ),
    (
        "connack-properties",
        Connack(
            False,
            0,
            Properties(assigned_client_identifier="gen", topic_alias_maximum=10, maximum_qos=1),
        ),
        h("20 0E 00 00 0B 12 00 03 'gen' 22 00 0A 24 01"),
    ),
    ("connack-refused", Connack(False, 0x87), h("20 03 00 87 00")),
    ("publish-qos0", Publish("a/b", b"hi"), h("30 08 00 03 'a/b' 00 'hi'")),
    (
        "publish-qos1-all-message-properties",
        Publish(
            "a/b",
            b"hi",
            1,
            packet_id=5,
            properties=Properties(
                payload_format_indicator=1,
                message_expiry_interval=60,
                content_type="t",
                response_topic="r",
                correlation_data=b"\x01",
                subscription_identifiers=(1, 300),
                topic_alias=2,
                user_properties=(("a", "1"), ("a", "2")),
            ),
        ),
        # 41 bytes of properties; subscription identifier 300 = AC 02; user properties in order
        h("32 33 00 03 'a/b' 00 05 29")
        + h("01 01 02 00 00 00 3C 03 00 01 't' 08 00 01 'r' 09 00 01 01 0B 01 0B AC 02 23 00 02")
        + h("26 00 01 'a' 00 01 '1' 26 00 01 'a' 00 01 '2' 'hi'"),
    ),
    (
        "publish-topic-alias-only",
        Publish("", b"z", properties=Properties(topic_alias=7)),
        h("30 07 00 00 03 23 00 07 'z'"),
    ),
    ("puback-success", Puback(7), h("40 02 00 07")),
    ("puback-reason", Puback(7, 0x10), h("40 03 00 07 10")),
    (
        "puback-reason-string",
        Puback(7, 0x80, Properties(reason_string="no")),
        h("40 09 00 07 80 05 1F 00 02 'no'"),
    ),
    ("pubrec-reason", Pubrec(8, 0x10), h("50 03 00 08 10")),
    ("pubrel-not-found", Pubrel(8, 0x92), h("62 03 00 08 92")),
    ("pubcomp", Pubcomp(8), h("70 02 00 08")),
    (
        "subscribe-options",
        Subscribe(
            3,
            (Subscription("a/+", 2, no_local=True, retain_as_published=True, retain_handling=2),),
            Properties(subscription_identifiers=(42,), user_properties=(("x", "y"),)),
        ),
        # options 0x2E: retain handling 2 (0x20), retain as published 0x08, no local 0x04, QoS 2
        h("82 12 00 03 09 0B 2A 26 00 01 'x' 00 01 'y' 00 03 'a/+' 2E"),
    ),
    (
        "suback",
        Suback(3, (2, 0x8F), Properties(reason_string="bad")),
        h("90 0B 00 03 06 1F 00 03 'bad' 02 8F"),
    ),
    ("unsubscribe", Unsubscribe(4, ("a/+", "b")), h("A2 0B 00 04 00 00 03 'a/+' 00 01 'b'")),
    ("unsuback", Unsuback(4, (0x00, 0x11)), h("B0 05 00 04 00 00 11")),
    ("pingreq", Pingreq(), h("C0 00")),
    ("pingresp", Pingresp(), h("D0 00")),
    ("disconnect", Disconnect(), h("E0 00")),
    ("disconnect-with-will", Disconnect(0x04), h("E0 01 04")),
    (
        "disconnect-properties",
        Disconnect(0x8E, Properties(session_expiry_interval=0, reason_string="x")),
        h("E0 0B 8E 09 11 00 00 00 00 1F 00 01 'x'"),
    ),
    ("auth-success", Auth(), h("F0 00")),
    (
        "auth-continue",
        Auth(0x18, Properties(authentication_method="SCRAM", authentication_data=b"\x00\x01")),
        h("F0 0F 18 0D 15 00 05 'SCRAM' 16 00 02 00 01"),
    ),
]

TABLES = {4: V311_CASES, 5: V5_CASES}
