"""Retry with back-off and dead letters, shared by every protocol."""

from core.deadletter.policy import (
    DEAD_LETTER_REASON_HEADER,
    RETRY_COUNT_HEADER,
    ROCKETMQ_RETRY_DELAYS_MS,
    X_DEATH_HEADER,
    DeadLetterPolicy,
    dlq_topic_for_group,
    updated_x_death,
)

__all__ = [
    "DEAD_LETTER_REASON_HEADER",
    "RETRY_COUNT_HEADER",
    "ROCKETMQ_RETRY_DELAYS_MS",
    "X_DEATH_HEADER",
    "DeadLetterPolicy",
    "dlq_topic_for_group",
    "updated_x_death",
]
