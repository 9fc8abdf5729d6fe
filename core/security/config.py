"""SecurityConfig: the ``[auth]`` settings of ``braid serve`` (docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from core.security.scram import DEFAULT_ITERATIONS, check_iterations

ANONYMOUS_LOOPBACK: Final = "loopback"
ANONYMOUS_NEVER: Final = "never"
ANONYMOUS_ALWAYS: Final = "always"
ANONYMOUS_MODES: Final = (ANONYMOUS_LOOPBACK, ANONYMOUS_NEVER, ANONYMOUS_ALWAYS)
# What an MQTT 3.1.1 PUBLISH without permission gets: acknowledged and dropped (Mosquitto) or
# the connection closed (RabbitMQ's MQTT plugin). MQTT 5 answers PUBACK 0x87 either way.
MQTT_DENIED_ACKNOWLEDGE: Final = "acknowledge"
MQTT_DENIED_DISCONNECT: Final = "disconnect"
MQTT_DENIED_PUBLISH_MODES: Final = (MQTT_DENIED_ACKNOWLEDGE, MQTT_DENIED_DISCONNECT)


@dataclass(frozen=True)
class SecurityConfig:
    # Clients that present no credentials (MQTT without a user name, Kafka without SASL):
    # "loopback" admits them only from loopback addresses (Mosquitto 2's default spirit),
    # "never", or "always".
    anonymous: str = ANONYMOUS_LOOPBACK
    # Whose vhost permissions and tags an anonymous client acts with (RabbitMQ's MQTT
    # default_user); "" gives anonymous clients no vhost permission (Kafka ACLs for
    # User:ANONYMOUS still apply).
    anonymous_user: str = "guest"
    # Users that may log in only from loopback addresses (RabbitMQ's loopback_users).
    loopback_users: tuple[str, ...] = ("guest",)
    # Login slow-down (core/security/throttle.py).
    login_failures_before_delay: int = 3
    login_first_delay_ms: int = 100
    login_max_delay_ms: int = 5000
    login_failure_memory_ms: int = 60_000
    # SCRAM iterations of the credentials made when a password is set (Kafka: 4096..16384).
    scram_iterations: int = DEFAULT_ITERATIONS
    # MQTT 3.1.1 PUBLISH without permission: "acknowledge" (and drop) or "disconnect".
    mqtt_denied_publish: str = MQTT_DENIED_ACKNOWLEDGE
    # One audit line per repeated denial per this interval (core/security/audit.py).
    audit_repeat_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        if self.anonymous not in ANONYMOUS_MODES:
            raise ValueError(
                f"anonymous must be one of {', '.join(ANONYMOUS_MODES)}, not {self.anonymous!r}"
            )
        if self.mqtt_denied_publish not in MQTT_DENIED_PUBLISH_MODES:
            raise ValueError(
                "mqtt_denied_publish must be one of "
                f"{', '.join(MQTT_DENIED_PUBLISH_MODES)}, not {self.mqtt_denied_publish!r}"
            )
        check_iterations(self.scram_iterations)
        if self.login_max_delay_ms < self.login_first_delay_ms:
            raise ValueError("login_max_delay_ms must not be below login_first_delay_ms")
