"""Errors of the MQTT codec, split by who is at fault (h11's Local/RemoteProtocolError).

- ``MqttProtocolError``: the peer sent bytes that break the protocol. It carries the 5.0 reason
  code to send back (in CONNACK before the session exists, in DISCONNECT after; a 3.1.1 peer just
  gets its connection closed, or a CONNACK return code via ``connack_return_code_v3``).
- ``MqttEncodeError``: we were asked to encode a packet that is not valid. A bug on our side.
"""

from __future__ import annotations

from gateway.mqtt.reason_codes import ReasonCode


class MqttError(Exception):
    """Base class of the codec's errors."""


class MqttProtocolError(MqttError):
    """The peer broke the protocol; ``reason_code`` is what goes back on the wire."""

    def __init__(self, reason_code: int, message: str) -> None:
        super().__init__(reason_code, message)
        self.reason_code = reason_code
        self.message = message

    def __str__(self) -> str:
        try:
            name = ReasonCode(self.reason_code).name
        except ValueError:
            name = "UNKNOWN"
        return f"{self.message} (reason code 0x{self.reason_code:02X} {name})"


class MqttEncodeError(MqttError, ValueError):
    """A packet handed to the encoder cannot be represented on the wire."""


def malformed(message: str) -> MqttProtocolError:
    """0x81: the bytes cannot be parsed as the specification says (5.0 §4.13)."""
    return MqttProtocolError(ReasonCode.MALFORMED_PACKET, message)


def protocol_error(message: str) -> MqttProtocolError:
    """0x82: the packet parses but holds something the protocol forbids (5.0 §4.13)."""
    return MqttProtocolError(ReasonCode.PROTOCOL_ERROR, message)
