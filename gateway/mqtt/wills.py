"""A will as the cluster writes it down (``mqtt:wills:<node>``, docs/cluster.md section 4): what
another node needs to publish it should this node die (issue 23). JSON: ``topic``, ``payload``
and ``properties`` (the Will Properties as MQTT 5 encodes them, with their length prefix) in
base64, ``qos``, ``retain``, and ``delay_s`` (the will delay, bounded by the session expiry as
here).
"""

from __future__ import annotations

import base64
import json

from gateway.mqtt._wire import Reader
from gateway.mqtt.packets import Will
from gateway.mqtt.properties import WILL_PROPERTIES, decode_properties, encode_property_block


def will_record(will: Will, session_expiry_s: int) -> bytes:
    """``will`` of a connection whose session expires ``session_expiry_s`` after it ends."""
    delay = will.properties.will_delay_interval or 0
    return json.dumps(
        {
            "topic": will.topic,
            "payload": base64.b64encode(will.payload).decode(),
            "qos": will.qos,
            "retain": will.retain,
            "delay_s": min(delay, session_expiry_s),
            "properties": base64.b64encode(encode_property_block(will.properties)).decode(),
        }
    ).encode()


def will_from_record(record: bytes) -> tuple[Will, int]:
    """The will of a :func:`will_record` and its delay in seconds (a dead node's, issue 23).
    Raises ValueError (or the decoder's error) for a record this code did not write."""
    fields = json.loads(record)
    properties = base64.b64decode(fields["properties"])
    will = Will(
        str(fields["topic"]),
        base64.b64decode(fields["payload"]),
        int(fields["qos"]),
        bool(fields["retain"]),
        decode_properties(Reader(properties, 0, len(properties)), WILL_PROPERTIES),
    )
    return will, int(fields["delay_s"])
