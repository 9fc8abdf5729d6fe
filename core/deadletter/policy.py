"""What happens to a record its consumers give up on.

A record leaves an ack queue unconsumed when it is rejected without requeue, exceeds the delivery
limit, expires (TTL) or is dropped by max-length. Then, in this order:

1. Retry (RocketMQ): for rejections and delivery-limit overflows, while the record's retry count
   is below the length of ``retry_delays_ms``, it comes back to the same queue after the next
   back-off delay, as a delayed LINK (no body copy) carrying ``x-braid-retry-count``.
2. Dead letter: to ``dead_letter_topic`` (an AMQP dead-letter exchange, or ``%DLQ%<group>``),
   routed with ``dead_letter_subject`` or the record's own subject, as a LINK whose headers carry
   the reason, count and origin in AMQP's ``x-death`` shape (JSON).
3. Otherwise the record is dropped (RabbitMQ's behaviour without a dead-letter exchange).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

X_DEATH_HEADER = "x-death"  # JSON list, newest first, as RabbitMQ's x-death array of tables
RETRY_COUNT_HEADER = "x-braid-retry-count"
DEAD_LETTER_REASON_HEADER = "x-first-death-reason"
# Where the last dead-lettering sent the record: its topic (the dead-letter exchange) and
# subject (routing key), so readers in protocols that name records by address (MQTT) show it
# under the dead-letter topic rather than the one it was first published to.
DEAD_LETTER_TOPIC_HEADER = "x-braid-dead-letter-topic"
DEAD_LETTER_SUBJECT_HEADER = "x-braid-dead-letter-subject"
# RocketMQ's consumer retry schedule (messageDelayLevel 3..18): 10s 30s 1m 2m ... 10m 20m 30m 1h 2h.
ROCKETMQ_RETRY_DELAYS_MS: tuple[int, ...] = (
    10_000,
    30_000,
    60_000,
    120_000,
    180_000,
    240_000,
    300_000,
    360_000,
    420_000,
    480_000,
    540_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
    7_200_000,
)
DLQ_PREFIX = "%DLQ%"


def dlq_topic_for_group(group: str) -> str:
    """RocketMQ's dead-letter topic name for a consumer group."""
    return DLQ_PREFIX + group


@dataclass
class DeadLetterPolicy:
    dead_letter_topic: str | None = None  # x-dead-letter-exchange
    dead_letter_subject: str | None = None  # x-dead-letter-routing-key
    retry_delays_ms: tuple[int, ...] = ()  # empty: no retry stage

    def to_json(self) -> dict[str, Any]:
        return {
            "dead_letter_topic": self.dead_letter_topic,
            "dead_letter_subject": self.dead_letter_subject,
            "retry_delays_ms": list(self.retry_delays_ms),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> DeadLetterPolicy:
        raw = raw or {}
        return cls(
            raw.get("dead_letter_topic"),
            raw.get("dead_letter_subject"),
            tuple(raw.get("retry_delays_ms") or ()),
        )


def updated_x_death(
    previous: bytes | None,
    *,
    queue: str,
    reason: str,
    time_ms: int,
    exchange: str,
    routing_keys: list[str],
) -> bytes:
    """RabbitMQ's x-death rule: one entry per (queue, reason), its count incremented and moved to
    the front when the record dies there again."""
    entries: list[dict[str, Any]] = json.loads(previous) if previous else []
    count = 1
    for entry in entries:
        if entry.get("queue") == queue and entry.get("reason") == reason:
            count = int(entry.get("count", 0)) + 1
            entries.remove(entry)
            break
    entries.insert(
        0,
        {
            "queue": queue,
            "reason": reason,
            "count": count,
            "time": time_ms,
            "exchange": exchange,
            "routing-keys": routing_keys,
        },
    )
    return json.dumps(entries, separators=(",", ":")).encode()
