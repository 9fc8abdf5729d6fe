"""Settings of the MQTT gateway (``MqttOptions``, the ``[mqtt]`` section of ``braid serve``'s
config file: docs/configuration.md) and the rules that apply them at CONNECT: the keep alive a
client is granted (``grant_keep_alive``).

Each default names its precedent (Mosquitto 2.0, EMQX 5, the MQTT 5.0 spec). Plain data: no
I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.mqtt.decoder import DEFAULT_MAX_PACKET_SIZE
from gateway.mqtt.packet_types import MQTT_5

# Mosquitto's max_queued_messages is 1000 and EMQX's max_mqueue_len 1000; a broker in front of a
# log can afford more in memory per clean session before it drops.
DEFAULT_MAX_QUEUED_MESSAGES: Final = 10_000
# Topic aliases a client may use towards us (CONNACK Topic Alias Maximum); Mosquitto's default
# max_topic_alias is 10, EMQX's 65535.
DEFAULT_TOPIC_ALIAS_MAXIMUM: Final = 1024
# QoS 1/2 publishes a client may have unacknowledged (CONNACK Receive Maximum): the spec's
# default, so not sent (5.0 §3.2.2.3.3). Mosquitto announces and enforces 20 (its
# max_inflight_messages), EMQX 32 (max_inflight); a log that acknowledges once durable gains
# from a client keeping many publishes in flight, so BraidMQ does not ask for fewer.
DEFAULT_RECEIVE_MAXIMUM: Final = 65_535
# The largest Keep Alive a client may ask for (two bytes), Mosquitto's max_keepalive default.
MAX_KEEP_ALIVE: Final = 65_535
# A connection that sends no CONNECT within this many seconds is closed (EMQX idle_timeout 15s).
DEFAULT_CONNECT_TIMEOUT_S: Final = 10.0
# Seconds between updates of the $SYS/broker/... topics (gateway/mqtt/sys.py): Mosquitto's
# sys_interval default; 0 turns the tree off.
DEFAULT_SYS_INTERVAL_S: Final = 10.0

# How a $share group picks the member a message goes to: EMQX's shared_subscription_strategy
# names (docs/mqtt.md, "Shared subscriptions"). Round robin is Mosquitto's only behaviour and
# EMQX's default.
ROUND_ROBIN: Final = "round_robin"
RANDOM: Final = "random"
STICKY: Final = "sticky"
HASH_CLIENTID: Final = "hash_clientid"
SHARED_SUBSCRIPTION_STRATEGIES: Final = (ROUND_ROBIN, RANDOM, STICKY, HASH_CLIENTID)


@dataclass
class MqttOptions:
    """Settings of the MQTT gateway (the defaults behave as Mosquitto's and EMQX's)."""

    # Logins are the broker's one user store ([auth]: anonymous clients, loopback-only users);
    # on MQTTS / WSS with client certificates, the certificate's common name is the user name
    # instead of CONNECT's user name and password (Mosquitto's use_identity_as_username).
    use_identity_as_username: bool = False
    max_packet_size: int = DEFAULT_MAX_PACKET_SIZE
    receive_maximum: int = DEFAULT_RECEIVE_MAXIMUM
    topic_alias_maximum: int = DEFAULT_TOPIC_ALIAS_MAXIMUM
    # Keep Alive granted at most, seconds (Mosquitto's max_keepalive): see grant_keep_alive.
    # 0: whatever the client asks, no keep alive included.
    max_keepalive: int = MAX_KEEP_ALIVE
    # Session Expiry Interval granted at most (seconds); None: as asked (3.1.1: never).
    max_session_expiry: int | None = None
    max_queued_messages: int = DEFAULT_MAX_QUEUED_MESSAGES
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    # RabbitMQ MQTT plugin compatibility: MQTT publishes are also routed through this AMQP
    # topic exchange (``amq.topic``) with the topic name as routing key (``/`` <-> ``.``), and
    # AMQP publishes to it reach MQTT subscribers. None: BrokerConfig.mqtt_exchange.
    amqp_exchange: str | None = None
    # One of SHARED_SUBSCRIPTION_STRATEGIES (EMQX's setting of the same name).
    shared_subscription_strategy: str = ROUND_ROBIN
    # $SYS/broker/... every this many seconds (Mosquitto's sys_interval); 0: no $SYS tree.
    sys_interval: float = DEFAULT_SYS_INTERVAL_S

    def __post_init__(self) -> None:
        if self.shared_subscription_strategy not in SHARED_SUBSCRIPTION_STRATEGIES:
            raise ValueError(
                f"shared_subscription_strategy {self.shared_subscription_strategy!r}: one of "
                f"{', '.join(SHARED_SUBSCRIPTION_STRATEGIES)}"
            )
        if self.sys_interval < 0:
            raise ValueError(f"sys_interval {self.sys_interval}: 0 or more seconds")
        if not 0 <= self.max_keepalive <= MAX_KEEP_ALIVE:
            raise ValueError(f"max_keepalive {self.max_keepalive}: 0..{MAX_KEEP_ALIVE}")
        if not 1 <= self.receive_maximum <= DEFAULT_RECEIVE_MAXIMUM:
            raise ValueError(
                f"receive_maximum {self.receive_maximum}: 1..{DEFAULT_RECEIVE_MAXIMUM}"
            )


# What grant_keep_alive decides: (keep alive to enforce, Server Keep Alive to announce or None,
# whether the CONNECT is refused).
KeepAliveGrant = tuple[int, int | None, bool]


def grant_keep_alive(asked: int, max_keepalive: int, version: int) -> KeepAliveGrant:
    """The keep alive a client asking for ``asked`` seconds gets, as Mosquitto 2.0.14 and later
    decide it (handle_connect.c):

    - ``max_keepalive`` 0: as asked;
    - MQTT 5.0 asking for more than ``max_keepalive``, or for none (0): ``max_keepalive``,
      announced as Server Keep Alive in CONNACK [MQTT-3.2.2-21];
    - MQTT 3.1.1 asking for more: refused with CONNACK 0x02 (Identifier rejected), there being
      no way to tell such a client; asking for none (0): refused too when ``max_keepalive`` is
      set below the largest keep alive (65535), else let in. Mosquitto 2.0.12-2.0.15 refused
      those clients at its then default of 65535 and broke many that never send PINGREQ
      (mosquitto issues 2309, 2361); 2.0.16 made its default 0 to let them in again. At our
      default the same clients connect, and a 5.0 client is told the limit."""
    if not max_keepalive or (asked and asked <= max_keepalive):
        return asked, None, False
    if version == MQTT_5:
        return max_keepalive, max_keepalive, False
    if asked == 0 and max_keepalive >= MAX_KEEP_ALIVE:
        return 0, None, False
    return asked, None, True
