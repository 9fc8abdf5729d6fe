"""Session states: one opaque value per client id, durable in the system topic ``__sessions``
(a :class:`~core.state.table.DurableTable`), so that a restart rebuilds a gateway's persistent
sessions (the MQTT gateway keeps a JSON record per session: expiry, subscriptions, QoS 2
identifiers in flight, when it went offline; ``gateway/mqtt/hub.py``).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from core.log import LogStore
from core.log.names import SESSIONS_TOPIC
from core.state.table import DurableTable


class SessionStates:
    def __init__(self, store: LogStore) -> None:
        self.table = DurableTable(store, SESSIONS_TOPIC)
        store.retention_guards.append(self._segment_is_owed)

    def __len__(self) -> int:
        return len(self.table)

    def save(self, client_id: str, state: bytes) -> None:
        self.table.put(client_id, state)

    def delete(self, client_id: str) -> None:
        self.table.delete(client_id)

    def items(self) -> list[tuple[str, bytes]]:
        return list(self.table.items())

    def _segment_is_owed(self, start: int, end: int) -> bool:
        """Retention guard: the records replay needs stay (see RetainedMessages)."""
        return self.table.needs_segment_before(end)
