"""The sans-IO MQTT 3.1.1 / 5.0 codec: the public names of its modules, in one place.

No I/O and no asyncio: bytes in, packets out (``MqttDecoder``); packets in, bytes out
(``encode``, and the broker's hot-path ``encode_publish`` / ``encode_puback``).

=================  ====================================================================
``packets``        the packet dataclasses
``properties``     5.0 properties: table, ``Properties``, property block codec
``decoder``        ``MqttDecoder``
``encoder``        ``encode`` and the fast paths
``reason_codes``   ``ReasonCode`` and the codes allowed per packet
``errors``         ``MqttProtocolError`` (peer's fault, carries a reason code), ``MqttEncodeError``
``packet_types``   fixed-header constants, flag bits, limits
``_wire``          §1.5 data representations; ``_frozen``: fast frozen-dataclass construction
=================  ====================================================================
"""

from __future__ import annotations

from gateway.mqtt.decoder import DEFAULT_MAX_PACKET_SIZE, MqttDecoder
from gateway.mqtt.encoder import encode, encode_ack, encode_puback, encode_publish
from gateway.mqtt.errors import MqttEncodeError, MqttError, MqttProtocolError
from gateway.mqtt.packet_types import MQTT_3_1_1, MQTT_5, PacketType
from gateway.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Payload,
    Pingreq,
    Pingresp,
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
from gateway.mqtt.properties import (
    NO_PROPERTIES,
    WILL_PROPERTIES,
    Properties,
    PropertyId,
    PropertyType,
    encode_properties,
    encode_subscription_identifier,
)
from gateway.mqtt.reason_codes import ReasonCode, connack_return_code_v3

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "MQTT_3_1_1",
    "MQTT_5",
    "NO_PROPERTIES",
    "WILL_PROPERTIES",
    "Auth",
    "Connack",
    "Connect",
    "Disconnect",
    "MqttDecoder",
    "MqttEncodeError",
    "MqttError",
    "MqttProtocolError",
    "Packet",
    "PacketType",
    "Payload",
    "Pingreq",
    "Pingresp",
    "Properties",
    "PropertyId",
    "PropertyType",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "ReasonCode",
    "Suback",
    "Subscribe",
    "Subscription",
    "Unsuback",
    "Unsubscribe",
    "Will",
    "connack_return_code_v3",
    "encode",
    "encode_ack",
    "encode_properties",
    "encode_puback",
    "encode_publish",
    "encode_subscription_identifier",
]
