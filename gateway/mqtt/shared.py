"""Shared subscriptions (``$share/<share>/<filter>``, MQTT 5.0 §4.8.2): one durable ack queue
per group and filter (``__mqtt.share.<share>/<filter>``, bound like a persistent session's
queue), read by one consumer the group owns, and a dispatcher that hands each record to one
member, chosen per message among the members with room in their window.

Why the group dispatches and not the queue's consumers: with one consumer per member, the queue
hands records to whichever consumer has credit when it pumps, and a member's credit (its
Receive Maximum, up to 65,535) is rarely the limit, so one member took every record of a slow
publisher (issue 17, item 1: 100/0 in 3 of 5 runs). Here the group keeps the turn, as Mosquitto
and EMQX do, and knows which members can take a message now.

A member *has room* when it is connected, nothing waits in its session's ``pending`` queue, its
socket is not congested, and it has fewer QoS 1/2 messages in flight than the client's Receive
Maximum. The strategies (``shared_subscription_strategy``, EMQX's names):

- ``round_robin`` (default): the members in the order they joined, taking turns; a member
  without room is skipped and the turn goes on after the one that took the message;
- ``random``: a member with room, at random;
- ``sticky``: the same member while it has room; when it has none (or goes), another with room
  at random, which then keeps it;
- ``hash_clientid``: the connected member the publisher's client id hashes to (CRC-32), so one
  publisher's messages go to one member in order; that member takes it even without room (it
  waits in the member's session).

A record no member can take now waits in the group's ``backlog`` (in the order the queue gave
it); it goes out when a member gets room (``refill``: after a PUBACK, PUBCOMP, a socket drained,
a member connecting). The consumer's credit (``CONSUMER_PREFETCH``) bounds what the group holds
in memory: records in flight at members plus the backlog. A member that disconnects gives its
group records back to the queue (``Session.detach`` nacks them, so another member gets them,
flagged DUP); when no member is connected, the consumer is detached and what it held goes back
to the queue, durable, for the next member to come. A queue of another node's shard is read
through that node; when it ends the consumer (it restarted, or went away) the group attaches
again, with backoff, while members are connected (``RETRY_*``).

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import random
import zlib
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Final

from core.api import Delivery, Subscription
from gateway.mqtt.addresses import BindingSpec
from gateway.mqtt.messages import OutMessage, out_message_of
from gateway.mqtt.options import HASH_CLIENTID, RANDOM, ROUND_ROBIN, STICKY

if TYPE_CHECKING:
    from gateway.mqtt.client_session import Session
    from gateway.mqtt.hub import MqttHub
    from gateway.mqtt.subscriptions import Sub

# Records the group's consumer holds at most (in flight at members plus the backlog), as a
# persistent session's own consumer (client_session.py: CONSUMER_PREFETCH).
GROUP_PREFETCH: Final = 1000
# A consumer the queue's owner ended (another node, restarted or gone) is attached again while
# members are connected: first after RETRY_FIRST_S, doubled after each failed attach up to
# RETRY_MAX_S (an owner down for long is not asked ten times a second).
RETRY_FIRST_S: Final = 0.1
RETRY_MAX_S: Final = 5.0

log = logging.getLogger(__name__)


class SharedGroup:
    """``$share/<share>/<filter>``: the durable queue ``name`` its members share, one message to
    one member. See the module docstring."""

    __slots__ = (
        "_attaches",
        "_retry",
        "_retry_s",
        "_rng",
        "_sticky",
        "_turn",
        "backlog",
        "consumer",
        "filter",
        "hub",
        "members",
        "name",
        "plan",
        "share",
        "strategy",
    )

    def __init__(
        self,
        hub: MqttHub,
        name: str,
        share: str,
        topic_filter: str,
        plan: list[BindingSpec],
        strategy: str = ROUND_ROBIN,
    ) -> None:
        self.hub = hub
        self.name = name
        self.share = share
        self.filter = topic_filter
        self.plan = plan
        self.strategy = strategy
        # Member sessions, in the order they joined (round robin's order).
        self.members: dict[Session, Sub] = {}
        self.consumer: Subscription | None = None
        self.backlog: deque[Delivery] = deque()
        self._turn = 0
        self._sticky: Session | None = None
        self._rng = random.Random()
        # The consumer's attach count (a cancel of an older one is stale), the timer of the
        # next attach after a cancel and its delay (module constants RETRY_*).
        self._attaches = 0
        self._retry: asyncio.TimerHandle | None = None
        self._retry_s = RETRY_FIRST_S

    def __repr__(self) -> str:
        return f"SharedGroup({self.name!r}, members={len(self.members)}, {self.strategy})"

    # -- members ---------------------------------------------------------------------------

    def member_online(self) -> None:
        """A member is connected (or subscribed while connected): read the queue, and give the
        waiting records to whoever has room."""
        if self.consumer is None and self._retry is None:
            self._attach()
        self.refill()

    def _attach(self) -> None:
        hub = self.hub
        self._attaches += 1
        self.consumer = hub.api.consume_session_queue(
            hub.context,
            self.name,
            GROUP_PREFETCH,
            self._on_delivery,
            partial(self._cancelled, self._attaches),
        )

    def _cancelled(self, attach: int, reason: str) -> None:
        """The queue's owner (another node) ended the consumer, or could not attach it: what
        it held goes back to the queue there; attached again later while members are
        connected (module constants RETRY_*), so the group goes on reading once the owner
        is back, without its members reconnecting."""
        if attach != self._attaches or self.consumer is None:
            return  # an older consumer's, or the group stopped meanwhile
        self.consumer = None
        self.backlog.clear()
        if not any(member.connection is not None for member in self.members):
            return
        delay = self._retry_s
        self._retry_s = min(delay * 2, RETRY_MAX_S)
        log.warning(
            "mqtt $share %s: consumer ended (%s): attached again in %.1f s",
            self.name,
            reason,
            delay,
        )
        self._retry = asyncio.get_running_loop().call_later(delay, self._retry_attach)

    def _retry_attach(self) -> None:
        self._retry = None
        if self.consumer is None and any(m.connection is not None for m in self.members):
            self._attach()

    def member_offline(self, session: Session) -> None:
        """``session`` disconnected (its group records in flight are back in the queue already:
        ``Session.detach``). With no member left connected, stop reading."""
        if self._sticky is session:
            self._sticky = None
        if not any(member.connection is not None for member in self.members):
            self.stop()

    def remove(self, session: Session) -> None:
        """``session`` unsubscribed (or ended): what it has in flight finishes normally
        [MQTT-3.10.4-3]; the group stops reading when no member is connected."""
        self.members.pop(session, None)
        self.member_offline(session)

    def stop(self) -> None:
        """Detach the consumer: what it held (the backlog, records at no member) goes back to
        the queue, to be delivered again first."""
        consumer, self.consumer = self.consumer, None
        self.backlog.clear()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if consumer is not None:
            consumer.detach()

    # -- dispatch --------------------------------------------------------------------------

    def _on_delivery(self, delivery: Delivery) -> None:
        """The queue's pump: one record for the group."""
        self._retry_s = RETRY_FIRST_S  # attached: a later cancel retries soon again
        if self.backlog or not self._dispatch(delivery):
            self.backlog.append(delivery)

    def refill(self) -> None:
        """Hand waiting records to members with room, in the queue's order."""
        backlog = self.backlog
        while backlog and self._dispatch(backlog[0]):
            backlog.popleft()

    def _dispatch(self, delivery: Delivery) -> bool:
        """Give ``delivery`` to a member; False if none can take it now."""
        message = out_message_of(delivery.message)
        member = self._pick(message)
        if member is None:
            return False
        member.on_group_delivery(self.members[member], delivery, message)
        return True

    def _pick(self, message: OutMessage) -> Session | None:
        strategy = self.strategy
        members = list(self.members)
        if strategy == ROUND_ROBIN:
            count = len(members)
            turn = self._turn
            for step in range(count):
                index = (turn + step) % count
                member = members[index]
                if has_room(member):
                    self._turn = index + 1
                    return member
            return None
        if strategy == HASH_CLIENTID:
            online = [member for member in members if member.connection is not None]
            if not online:
                return None
            return online[zlib.crc32(message.origin.encode()) % len(online)]
        if strategy == STICKY:
            sticky = self._sticky
            if sticky is not None and sticky in self.members and has_room(sticky):
                return sticky
        ready = [member for member in members if has_room(member)]
        if not ready:
            return None
        chosen = self._rng.choice(ready)
        if strategy == STICKY:
            self._sticky = chosen
        else:
            assert strategy == RANDOM, strategy
        return chosen


def has_room(session: Session) -> bool:
    """Whether ``session`` can be sent one more message now (see the module docstring)."""
    connection = session.connection
    return (
        connection is not None
        and not session.pending
        and not connection.writing_paused
        and len(session.inflight) < connection.send_quota
    )
