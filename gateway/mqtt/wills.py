"""A will as the cluster writes it down (``mqtt:wills:<node>``, docs/cluster.md section 4): what
another node needs to publish it should this node die (issue 23). JSON: ``topic``, ``payload``
and ``properties`` (the Will Properties as MQTT 5 encodes them, with their length prefix) in
base64, ``qos``, ``retain``, and ``delay_s`` (the will delay, bounded by the session expiry as
here).
"""

from __future__ import annotations

import base64
import json

from gateway.mqtt.packets import Will
from gateway.mqtt.properties import encode_property_block


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
