"""What one MQTT connection may do: its permission checks, cached (docs/security.md).

The broker's one authorizer decides (``BrokerAPI.authorize``, with the operations of the mapping
table: ``mqtt PUBLISH``, ``mqtt will``, ``mqtt SUBSCRIBE``, ``mqtt deliver``); MQTT ``T/a/b`` is
the log topic (exchange) ``T`` with routing key ``a.b``, and a filter's levels after the first
are its routing-key pattern (``+`` -> ``*``). A connection asks once per (operation, topic,
routing key) and keeps the answer until the user store changes (its generation), so the publish
path costs one dict lookup per message, never a regular expression; a permission changed or
revoked applies at the next operation that is not cached under the new generation, that is at
once. A denial writes the core's audit line the first time it is decided.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from typing import Final

from core.api import BrokerAPI, ClientContext

PUBLISH: Final = "mqtt PUBLISH"
WILL: Final = "mqtt will"
SUBSCRIBE: Final = "mqtt SUBSCRIBE"
DELIVER: Final = "mqtt deliver"

# Answers one connection keeps at most: a client publishing to ever new topic names (ids in
# them) must not grow it without bound; cleared whole when full, far above a working set.
MAX_CACHED_ANSWERS: Final = 4096


class Access:
    """The cached decisions of one connection's user (``context``: after its login)."""

    __slots__ = ("answers", "api", "context", "generation")

    def __init__(self, api: BrokerAPI, context: ClientContext) -> None:
        self.api = api
        self.context = context
        self.generation = api.security_generation(context)
        self.answers: dict[tuple[str, str, str], bool] = {}

    def allowed(self, operation: str, log_topic: str, routing_key: str) -> bool:
        """May this connection do ``operation`` on ``log_topic`` with ``routing_key``?"""
        api = self.api
        generation = api.security_generation(self.context)
        answers = self.answers
        if generation != self.generation:
            self.generation = generation
            answers.clear()
        key = (operation, log_topic, routing_key)
        answer = answers.get(key)
        if answer is None:
            answer = api.authorize(self.context, operation, log_topic, routing_key)
            if len(answers) >= MAX_CACHED_ANSWERS:
                answers.clear()
            answers[key] = answer
        return answer
