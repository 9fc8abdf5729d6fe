"""MQTT gauges on ``/metrics`` (issue 19 item 2): what the MQTT hub holds now. The listeners'
counters are ``braid_mqtt_<name>_total`` already (``braid/server.py``); these are the levels a
dashboard plots beside them:

- ``braid_mqtt_clients_connected``: MQTT clients connected (TCP and WebSocket together);
- ``braid_mqtt_sessions``: sessions the broker holds, connected or persistent and offline;
- ``braid_mqtt_subscriptions``: subscriptions of every session;
- ``braid_mqtt_retained_messages``: retained messages.

The same numbers as ``$SYS/broker/clients/connected``, ``clients/total``, ``subscriptions/count``
and ``retained messages/count`` (``gateway/mqtt/sys.py:session_gauges``). Nothing when no MQTT
listener runs. Computed on each scrape: one walk over the sessions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from braid import metrics

# The slots of braid/server.py whose listener may hold the hub (they share one).
MQTT_LISTENERS: Final = ("mqtt", "mqtt-ws", "mqtts", "mqtt-wss")


def _hub(listeners: Mapping[str, Any]) -> Any:
    for name in MQTT_LISTENERS:
        listener = listeners.get(name)
        try:
            hub = getattr(listener, "hub", None)
        except RuntimeError:  # a listener not started (or closed): no hub
            continue
        if hub is not None and not getattr(hub, "closed", True):
            return hub
    return None


def mqtt_families(listeners: Mapping[str, Any]) -> list[metrics.Family]:
    """The MQTT gauges, from the started listeners (``ManagementSources.listeners``)."""
    hub = _hub(listeners)
    if hub is None:
        return []
    from gateway.mqtt.sys import session_gauges  # only when MQTT runs

    gauges = session_gauges(hub)
    return [
        metrics.Family(
            "braid_mqtt_clients_connected",
            metrics.GAUGE,
            "MQTT clients connected (TCP and WebSocket)",
            gauges.connected,
        ),
        metrics.Family(
            "braid_mqtt_sessions",
            metrics.GAUGE,
            "MQTT sessions held: connected, and persistent ones offline",
            gauges.sessions,
        ),
        metrics.Family(
            "braid_mqtt_subscriptions",
            metrics.GAUGE,
            "MQTT subscriptions of every session",
            gauges.subscriptions,
        ),
        metrics.Family(
            "braid_mqtt_retained_messages",
            metrics.GAUGE,
            "MQTT retained messages",
            gauges.retained,
        ),
    ]
