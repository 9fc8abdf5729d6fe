"""``$SYS/broker/...``: the broker's state as MQTT topics, under Mosquitto's names and in its
payload forms (docs/mqtt.md, "$SYS topics"), every ``[mqtt] sys_interval`` seconds.

Mosquitto's behaviour, kept here (mosquitto.conf(5), sys_tree.c):

- the values are retained QoS 0 messages: a client subscribing to ``$SYS/#`` is sent the last
  value of each topic at once, then the changes;
- ``$SYS/broker/uptime`` is published at every interval, every other topic only when its value
  changed; ``$SYS/broker/version`` once (static);
- ``sys_interval = 0`` disables the tree: nothing is published or kept;
- a filter whose first level is a wildcard (``#``, ``+/broker/uptime``) never matches a topic
  starting with ``$`` [MQTT-4.7.2-1], so only filters starting with ``$SYS`` get them;
- a client's PUBLISH to ``$SYS/...`` is refused (5.0 PUBACK 0x87, 3.1.1 acknowledged and
  dropped: Mosquitto's test 03-publish-dollar-v5), so nobody can forge a value.

The values live in this process's memory only, never in the log: they describe this broker
process now, and a restart begins from zero as Mosquitto's do. They reach subscribers without
the broker's routing: the hub keeps its sessions' subscriptions whose first level is ``$SYS``
(:attr:`MqttHub.sys_subscriptions`, clean and persistent sessions alike) and this module offers
each value to the connected ones whose filter matches; at SUBSCRIBE the hub's retained path
asks :meth:`SysTopics.matching` for the current values. An offline persistent session gets
nothing (QoS 0, as Mosquitto without ``queue_qos0_messages``).

Who may read them is the permission table's answer for SUBSCRIBE (docs/security.md): read
permission on the resource (exchange) ``$SYS`` of the client's vhost, with the filter's levels
after ``$SYS`` as the routing-key pattern, checked when the client subscribes.

Counters come from the MQTT listeners (their per-listener dicts: bytes, packets, publishes),
registered with the hub when a client of that listener connects; gauges from the hub itself.
Computing them walks the sessions once, so it is done only while someone is subscribed, or when a
new subscriber needs fresh values.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
from functools import cache
from typing import TYPE_CHECKING, Final, NamedTuple

from core.api import LEVEL_SEPARATOR, filter_levels_match
from gateway.mqtt.messages import OutMessage
from gateway.mqtt.properties import NO_PROPERTIES
from gateway.mqtt.subscriptions import combine

if TYPE_CHECKING:
    from gateway.mqtt.client_session import Session
    from gateway.mqtt.hub import MqttHub
    from gateway.mqtt.subscriptions import Sub

log = logging.getLogger(__name__)

# The first level of every topic of the tree; a client may not publish below it.
SYS_LEVEL: Final = "$SYS"
SYS_PREFIX: Final = SYS_LEVEL + LEVEL_SEPARATOR
# Mosquitto publishes the tree at QoS 0 (SYS_TREE_QOS) and retains each value.
SYS_QOS: Final = 0

VERSION: Final = "$SYS/broker/version"
UPTIME: Final = "$SYS/broker/uptime"
CLIENTS_CONNECTED: Final = "$SYS/broker/clients/connected"
CLIENTS_DISCONNECTED: Final = "$SYS/broker/clients/disconnected"
CLIENTS_TOTAL: Final = "$SYS/broker/clients/total"
CLIENTS_MAXIMUM: Final = "$SYS/broker/clients/maximum"
MESSAGES_RECEIVED: Final = "$SYS/broker/messages/received"
MESSAGES_SENT: Final = "$SYS/broker/messages/sent"
PUBLISH_RECEIVED: Final = "$SYS/broker/publish/messages/received"
PUBLISH_SENT: Final = "$SYS/broker/publish/messages/sent"
PUBLISH_DROPPED: Final = "$SYS/broker/publish/messages/dropped"
BYTES_RECEIVED: Final = "$SYS/broker/bytes/received"
BYTES_SENT: Final = "$SYS/broker/bytes/sent"
SUBSCRIPTIONS_COUNT: Final = "$SYS/broker/subscriptions/count"
RETAINED_COUNT: Final = "$SYS/broker/retained messages/count"  # Mosquitto's name, with a space

# $SYS topic -> the listener counter (gateway/mqtt/server.py METRICS) summed over listeners.
# messages/received counts every packet received, as Mosquitto's; messages/sent counts the
# PUBLISH packets sent (Mosquitto counts every packet sent; the listeners do not count acks).
COUNTER_TOPICS: Final = (
    (MESSAGES_RECEIVED, "packets_received"),
    (MESSAGES_SENT, "publishes_sent"),
    (PUBLISH_RECEIVED, "publishes_received"),
    (PUBLISH_SENT, "publishes_sent"),
    (PUBLISH_DROPPED, "messages_dropped"),
    (BYTES_RECEIVED, "bytes_received"),
    (BYTES_SENT, "bytes_sent"),
)


@cache
def broker_version() -> str:
    """``$SYS/broker/version``'s payload, in Mosquitto's form ("mosquitto version 2.0.18")."""
    from importlib import metadata

    try:
        number = metadata.version("braidmq")
    except metadata.PackageNotFoundError:  # a source tree that is not pip-installed
        number = "0+unknown"
    return f"braidmq version {number}"


class SessionGauges(NamedTuple):
    """What the hub holds now: the ``$SYS`` clients topics and ``/metrics``' MQTT gauges."""

    connected: int  # sessions with a client connected
    sessions: int  # every session: connected, and persistent ones offline
    subscriptions: int  # of every session (shared ones included)
    retained: int  # retained messages


def session_gauges(hub: MqttHub) -> SessionGauges:
    """Walks the sessions once."""
    connected = 0
    subscriptions = 0
    for session in hub.sessions.values():
        if session.connection is not None:
            connected += 1
        subscriptions += len(session.subscriptions)
    return SessionGauges(connected, len(hub.sessions), subscriptions, len(hub.retained))


def is_sys_topic(topic: str) -> bool:
    """Whether ``topic`` (a name or a filter) is in the ``$SYS`` tree."""
    return topic == SYS_LEVEL or topic.startswith(SYS_PREFIX)


class SysTopics:
    """The ``$SYS`` tree of one hub: its current values, and the timer that refreshes them."""

    def __init__(self, hub: MqttHub, interval_s: float) -> None:
        self.hub = hub
        self.interval_s = interval_s
        self.loop = asyncio.get_running_loop()
        self.started_at = self.loop.time()
        # The listeners' counter dicts by identity (registered at each client's CONNECT).
        self.listener_counters: dict[int, dict[str, int]] = {}
        self.values: dict[str, OutMessage] = {}
        self.max_connected = 0
        self.last_refresh: float | None = None
        self.timer: asyncio.TimerHandle | None = self.loop.call_later(interval_s, self._tick)
        self.closed = False

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def add_listener_counters(self, counters: dict[str, int]) -> None:
        self.listener_counters[id(counters)] = counters

    # -- the values --------------------------------------------------------------------------

    def current(self) -> dict[str, str]:
        """Every topic of the tree and its payload now."""
        gauges = session_gauges(self.hub)
        self.max_connected = max(self.max_connected, gauges.connected)
        values = {
            VERSION: broker_version(),
            UPTIME: f"{int(self.loop.time() - self.started_at)} seconds",
            CLIENTS_CONNECTED: str(gauges.connected),
            CLIENTS_DISCONNECTED: str(gauges.sessions - gauges.connected),
            CLIENTS_TOTAL: str(gauges.sessions),
            CLIENTS_MAXIMUM: str(self.max_connected),
            SUBSCRIPTIONS_COUNT: str(gauges.subscriptions),
            RETAINED_COUNT: str(gauges.retained),
        }
        listeners = self.listener_counters.values()
        for topic, counter in COUNTER_TOPICS:
            values[topic] = str(sum(counters.get(counter, 0) for counters in listeners))
        return values

    def refresh(self, skip: Session | None = None) -> None:
        """Compute the values and publish those that changed (and the uptime, always);
        ``skip``: a session that is being sent them all as retained messages."""
        self.last_refresh = self.loop.time()
        for topic, payload in self.current().items():
            known = self.values.get(topic)
            if known is not None and topic != UPTIME and known.payload == payload.encode():
                continue
            message = OutMessage(topic, payload.encode(), SYS_QOS, True, "", 0, NO_PROPERTIES)
            self.values[topic] = message
            self._deliver(message, skip)

    def _tick(self) -> None:
        self.timer = None
        if self.closed:
            return
        try:
            if self.hub.sys_subscriptions:  # nobody to tell: skip the walk over the sessions
                self.refresh()
        except Exception:
            log.exception("mqtt: $SYS refresh failed")
        self.timer = self.loop.call_later(self.interval_s, self._tick)

    # -- delivery ----------------------------------------------------------------------------

    def _deliver(self, message: OutMessage, skip: Session | None = None) -> None:
        """Offer a new value to the connected sessions with a matching ``$SYS`` filter (one copy
        per session, however many of its filters match [MQTT-3.3.4-2])."""
        by_session: dict[Session, list[Sub]] = {}
        topic = message.topic
        for sub in self.hub.sys_subscriptions:
            session = sub.session
            if session is skip or session.connection is None:
                continue
            if not filter_levels_match(sub.levels, topic):
                continue
            if sub.tag_filter is not None:  # the tree carries no tags
                continue
            by_session.setdefault(session, []).append(sub)
        for session, matched in by_session.items():
            qos, retain, ids = combine(message, matched)
            session.offer(message, qos, retain, ids, None)

    def matching(self, session: Session, filter_levels: list[str]) -> list[OutMessage]:
        """The current values a new subscription of ``session`` with this filter is sent at
        once (the retained path); fresh ones if none were computed within the last interval
        (the timer skips its walk while nobody is subscribed)."""
        last = self.last_refresh
        if last is None or self.loop.time() - last >= self.interval_s:
            self.refresh(skip=session)
        return [
            message
            for topic, message in self.values.items()
            if filter_levels_match(filter_levels, topic)
        ]
