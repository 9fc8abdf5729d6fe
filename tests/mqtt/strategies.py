"""Hypothesis strategies for valid MQTT packets of either version."""

from __future__ import annotations

from hypothesis import strategies as st

from gateway.mqtt.codec import (
    NO_PROPERTIES,
    WILL_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    PropertyType,
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
from gateway.mqtt.properties import PROPERTY_SPECS
from gateway.mqtt.reason_codes import ALLOWED_REASON_CODES, V3_SUBACK_RETURN_CODES

# Any UTF-8 string MQTT allows: no U+0000, no surrogates [MQTT-1.5.4-1/2].
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
topic_names = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1, max_size=12
)
topic_filters = text.filter(bool)
packet_ids = st.integers(1, 0xFFFF)
short_binary = st.binary(max_size=16)

_ZERO_OR_ONE = {
    "payload_format_indicator",
    "request_problem_information",
    "request_response_information",
    "maximum_qos",
    "retain_available",
    "wildcard_subscription_available",
    "subscription_identifiers_available",
    "shared_subscription_available",
}
_NOT_ZERO = {"receive_maximum", "maximum_packet_size", "topic_alias"}


def _value(field: str, ptype: PropertyType, context: int) -> st.SearchStrategy:
    if ptype is PropertyType.BYTE:
        return st.integers(0, 1) if field in _ZERO_OR_ONE else st.integers(0, 0xFF)
    if ptype is PropertyType.TWO_BYTE_INT:
        return st.integers(1 if field in _NOT_ZERO else 0, 0xFFFF)
    if ptype is PropertyType.FOUR_BYTE_INT:
        return st.integers(1 if field in _NOT_ZERO else 0, 0xFFFF_FFFF)
    if ptype is PropertyType.VARINT:  # subscription identifiers
        many = 3 if context == PacketType.PUBLISH else 1
        return st.lists(st.integers(1, 268_435_455), min_size=1, max_size=many).map(tuple)
    if ptype is PropertyType.UTF8:
        return text
    if ptype is PropertyType.UTF8_PAIR:
        return st.lists(st.tuples(text, text), min_size=1, max_size=3).map(tuple)
    return short_binary


def properties(context: int) -> st.SearchStrategy[Properties]:
    """Any valid set of the properties allowed in ``context``."""
    allowed = [spec for spec in PROPERTY_SPECS if context in spec.packets]

    @st.composite
    def build(draw: st.DrawFn) -> Properties:
        values = {}
        for spec in allowed:
            if draw(st.integers(0, 3)) == 0:
                values[spec.field] = draw(_value(spec.field, spec.type, context))
        if "authentication_data" in values and "authentication_method" not in values:
            values["authentication_method"] = draw(text)
        return Properties(**values)

    return st.one_of(st.just(NO_PROPERTIES), build())


def _props(version: int, context: int) -> st.SearchStrategy[Properties]:
    return properties(context) if version == 5 else st.just(NO_PROPERTIES)


def _code(version: int, packet_type: PacketType) -> st.SearchStrategy[int]:
    if version != 5:
        return st.just(0)
    return st.sampled_from(sorted(ALLOWED_REASON_CODES[packet_type]))


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(short_binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_props(version, WILL_PROPERTIES)),
        )
    clean_start = draw(st.booleans())
    client_id = draw(text)
    if version == 4 and not client_id:
        clean_start = True  # [MQTT-3.1.3-8]
    username = draw(st.none() | text)
    password = draw(st.none() | short_binary)
    if version == 4 and username is None:
        password = None  # [MQTT-3.1.2-22]
    return Connect(
        client_id,
        version,
        clean_start,
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        draw(_props(version, PacketType.CONNECT)),
    )


@st.composite
def connacks(draw: st.DrawFn, version: int) -> Connack:
    code = draw(_code(5, PacketType.CONNACK)) if version == 5 else draw(st.integers(0, 5))
    session_present = draw(st.booleans()) if code == 0 else False
    return Connack(session_present, code, draw(_props(version, PacketType.CONNACK)))


@st.composite
def publishes(draw: st.DrawFn, version: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(_props(version, PacketType.PUBLISH))
    topic = draw(topic_names)
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""
    return Publish(
        topic,
        draw(st.binary(max_size=300)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


def acks(version: int, cls: type, packet_type: PacketType) -> st.SearchStrategy:
    return st.builds(cls, packet_ids, _code(version, packet_type), _props(version, packet_type))


@st.composite
def subscriptions(draw: st.DrawFn, version: int) -> Subscription:
    if version == 4:
        return Subscription(draw(topic_filters), draw(st.integers(0, 2)))
    topic_filter = draw(topic_filters)
    no_local = draw(st.booleans()) and not topic_filter.startswith("$share/")
    return Subscription(
        topic_filter,
        draw(st.integers(0, 2)),
        no_local,
        draw(st.booleans()),
        draw(st.integers(0, 2)),
    )


def subscribes(version: int) -> st.SearchStrategy[Subscribe]:
    return st.builds(
        Subscribe,
        packet_ids,
        st.lists(subscriptions(version), min_size=1, max_size=4).map(tuple),
        _props(version, PacketType.SUBSCRIBE),
    )


def subacks(version: int) -> st.SearchStrategy[Suback]:
    codes = (
        st.sampled_from(sorted(ALLOWED_REASON_CODES[PacketType.SUBACK]))
        if version == 5
        else st.sampled_from(sorted(V3_SUBACK_RETURN_CODES))
    )
    return st.builds(
        Suback,
        packet_ids,
        st.lists(codes, min_size=1, max_size=4).map(tuple),
        _props(version, PacketType.SUBACK),
    )


def unsubscribes(version: int) -> st.SearchStrategy[Unsubscribe]:
    return st.builds(
        Unsubscribe,
        packet_ids,
        st.lists(topic_filters, min_size=1, max_size=4).map(tuple),
        _props(version, PacketType.UNSUBSCRIBE),
    )


def unsubacks(version: int) -> st.SearchStrategy[Unsuback]:
    if version == 4:
        return st.builds(Unsuback, packet_ids)
    codes = st.sampled_from(sorted(ALLOWED_REASON_CODES[PacketType.UNSUBACK]))
    return st.builds(
        Unsuback,
        packet_ids,
        st.lists(codes, min_size=1, max_size=4).map(tuple),
        _props(5, PacketType.UNSUBACK),
    )


def packets(version: int) -> st.SearchStrategy:
    """Any packet but CONNECT (which fixes the version of a stream)."""
    choices = [
        connacks(version),
        publishes(version),
        acks(version, Puback, PacketType.PUBACK),
        acks(version, Pubrec, PacketType.PUBREC),
        acks(version, Pubrel, PacketType.PUBREL),
        acks(version, Pubcomp, PacketType.PUBCOMP),
        subscribes(version),
        subacks(version),
        unsubscribes(version),
        unsubacks(version),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(
            Disconnect,
            _code(version, PacketType.DISCONNECT),
            _props(version, PacketType.DISCONNECT),
        ),
    ]
    if version == 5:
        choices.append(st.builds(Auth, _code(5, PacketType.AUTH), properties(PacketType.AUTH)))
    return st.one_of(choices)
