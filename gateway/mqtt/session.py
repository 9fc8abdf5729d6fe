"""The MQTT state machines: ``Connection`` (one network connection: packets in, bytes out) and
``Session`` (one client's session: subscriptions, the outbound QoS 1/2 window, queued messages),
for MQTT 3.1.1 and 5.0.

A ``Connection`` is sans-IO: the transport (``server.py``, ``websocket.py``) hands it decoded
packets (``handle``) and gives it a :class:`Link` to write bytes to, pause reading and close.
What a packet may do in each state is the table :data:`TRANSITIONS`; a packet type missing from
it is a Protocol Error (0x82) [MQTT-3.1.0-1, 3.1.0-2, 4.8.0-1].

Delivery to a session (docs/mqtt.md, "Sessions"):

- a *clean* session (3.1.1 Clean Session 1; 5.0 Session Expiry 0) lives as long as its network
  connection: its plain subscriptions are live subscriptions in the broker's live router
  (``BrokerAPI.subscribe_live``) and messages are handed to it straight from the publish path
  (and, for records of other protocols, read back by the core: ``follow_live_records``), so it
  costs the log nothing beyond the record itself;
- a *persistent* session (Clean Session 0; Session Expiry > 0) has a durable queue in the log
  (``BrokerAPI.declare_session_queue``): its subscriptions are core bindings, every matching
  record is indexed into its queue (never copied), pushed to it while it is connected
  (``consume_session_queue``), acked on PUBACK/PUBREC, and redelivered (DUP, same Packet
  Identifier) after a reconnect or a broker restart;
- a shared subscription ``$share/<group>/<filter>`` is one ack queue per group and filter,
  whose records the group hands one by one to a member with room (``shared.py``).

The outbound window: QoS 1/2 messages in flight are capped by the client's Receive Maximum
[MQTT-3.3.4-9]; more wait in ``pending`` in arrival order. A clean session queues at most
``max_queued_messages`` there (then drops, as Mosquitto's ``max_queued_messages`` does); a
persistent session's backlog stays in its ack queue (``CONSUMER_PREFETCH`` in memory at most).
``Session`` is in ``client_session.py``.

A client that does not read (issue 21 item 4): once its connection's outgoing buffer is over
``[limits] max_outgoing_buffer_bytes`` (the transport's ``pause_writing``), live messages for
it (clean sessions, any QoS) are dropped and counted (``messages_dropped``, $SYS's
publish/messages/dropped) instead of buffered, and records of its ack queue wait in
``pending`` unsent, which stops the queue's pump at its prefetch: the rest stays in the log.
Publishers are never held back by it. Sending resumes when the buffer drains; a client that
stays over the bound for ``stalled_client_timeout_s`` is disconnected (``gateway/transport.py``).

What arrives: ``flow.py`` acknowledges a client's QoS 1/2 PUBLISHes once durable and holds it
to the server's Receive Maximum; the subscriptions and in-flight entries are ``subscriptions.py``.

Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from core.api import (
    PROTOCOL_MQTT,
    ClientContext,
    LoginResult,
    RestOfCoroutine,
    ShardUnavailable,
    TagFilter,
    TopicError,
    now_ms,
    run_until_first_wait,
)
from gateway.mqtt.access import Access
from gateway.mqtt.client_session import Session
from gateway.mqtt.encoder import encode, encode_ack, encode_publish
from gateway.mqtt.errors import MqttProtocolError, protocol_error
from gateway.mqtt.flow import InboundFlow, Outcome
from gateway.mqtt.management import mqtt_connection_closed, mqtt_connection_opened
from gateway.mqtt.messages import OutMessage
from gateway.mqtt.options import grant_keep_alive
from gateway.mqtt.packet_types import MQTT_5, PacketType
from gateway.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from gateway.mqtt.packets import Subscription as SubscribeEntry
from gateway.mqtt.properties import NO_PROPERTIES, Properties
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.subscriptions import (
    Sub,
)
from gateway.transport import GatewayTransport

if TYPE_CHECKING:
    from gateway.mqtt.hub import MqttHub

_connection_numbers = itertools.count(1)


def new_connection_id() -> str:
    """A name for one MQTT connection in logs and the management API."""
    return f"mqtt-{next(_connection_numbers)}"


log = logging.getLogger(__name__)

# SUBSCRIBE user property (5.0): a tag filter (``TagA || TagB``) on the subscription (a shared
# subscription's: on its group's queue). See docs/mqtt.md, "Tag filters".
TAG_FILTER_PROPERTY: Final = "tag-filter"
# Session Expiry Interval meaning "never" (5.0 §3.1.2.11.2); 3.1.1's Clean Session 0.
NEVER_EXPIRES: Final = 0xFFFF_FFFF
# Receive Maximum when the client sends none (5.0 §3.1.2.11.3).
DEFAULT_RECEIVE_MAXIMUM: Final = 65_535
# Topic aliases we assign towards a client at most, whatever larger maximum it allows.
OUTBOUND_TOPIC_ALIASES: Final = 1024


class Link(Protocol):
    """What a connection's transport offers its state machine."""

    def write(self, data: bytes) -> None: ...  # buffered, one transport write per iteration

    def close(self) -> None: ...  # flush what was written, then close

    def pause_reading(self, reason: str) -> None: ...

    def resume_reading(self, reason: str) -> None: ...

    def start_keep_alive(self, seconds: int) -> None: ...


class State(enum.Enum):
    AWAIT_CONNECT = "await-connect"
    CONNECTED = "connected"
    CLOSED = "closed"  # DISCONNECT received or sent, taken over, or the socket is gone


# ---------------------------------------------------------------------------------------------
# Connection
# ---------------------------------------------------------------------------------------------

Handler = Callable[["Connection", Any], "Awaitable[None] | None"]


def _now_or_later(work: Coroutine[Any, Any, None]) -> Awaitable[None] | None:
    """Run a handler's coroutine to its first wait: None when it is done (a single node's
    session queues and bindings change without waiting: no task, no loop turn), else the
    rest, which the transport awaits with the packets after it parked."""
    started = run_until_first_wait(work)
    return started if isinstance(started, RestOfCoroutine) else None


class Connection:
    """One network connection's MQTT protocol state machine. See the module docstring."""

    def __init__(self, hub: MqttHub, link: Link, metrics: dict[str, int], peer: str = "") -> None:
        self.hub = hub
        self.link = link
        self.metrics = metrics
        # Who is calling, in every Broker API call made for this connection: completed with
        # the user and client id at CONNECT. ``peer``: the client's ``host:port``.
        self.context = ClientContext(PROTOCOL_MQTT, peer=peer, connection_id=new_connection_id())
        self.state = State.AWAIT_CONNECT
        # What the user may do (made again at CONNECT, for the user who logged in).
        self.access = Access(hub.api, self.context)
        # Set by the transport of a TLS connection: its verified client certificate's common
        # name (None: no certificate), the user with ``use_identity_as_username``.
        self.tls = False
        self.certificate_user: str | None = None
        self.version = MQTT_5
        self.session: Session | None = None
        self.client_id = ""
        self.keep_alive = 0
        self.will: Will | None = None
        self.normal_disconnect = False
        # Limits the client set in CONNECT (5.0).
        self.send_quota = DEFAULT_RECEIVE_MAXIMUM
        self.max_packet_size = 0  # 0: no limit beyond the protocol's
        self.problem_information = True
        self.aliases_in: dict[int, str] = {}
        self.aliases_out: dict[str, int] = {}
        self.alias_out_max = 0
        # The client's QoS 1/2 publishes: acknowledgements and the server's Receive Maximum.
        self.inbound = InboundFlow(self, hub.options.receive_maximum)
        self.writing_paused = False  # the outgoing buffer is over its bound
        self.connected_at = time.monotonic()
        # This connection's generation of its client id in the cluster (BrokerAPI's
        # claim_client_id; 0 on a single node): a takeover closes only older ones.
        self.cluster_gen = 0

    def __repr__(self) -> str:
        return f"Connection({self.client_id!r}, {self.state.value})"

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    # -- entry points for the transport ----------------------------------------------------

    def handle(self, packet: Packet) -> Awaitable[None] | None:
        """Act on one packet; an awaitable when the rest must wait (the transport holds the
        following packets of this connection until it is done). Raises MqttProtocolError."""
        handler = TRANSITIONS[self.state].get(type(packet))
        if handler is None:
            if self.state is State.CLOSED:
                return None  # after DISCONNECT or a takeover: the rest is ignored
            raise protocol_error(
                f"{type(packet).__name__.upper()} not allowed {self.state.value} [MQTT-4.8.0-1]"
            )
        return handler(self, packet)

    def end_of_batch(self) -> None:
        """Every packet of a read was handled: acknowledgements go out once durable."""
        inbound = self.inbound
        if inbound.acks and not inbound.waiting:
            inbound.flush()

    def protocol_error(self, error: MqttProtocolError, detail: str = "") -> None:
        """The peer broke the protocol: tell it why where the version allows, then close.
        ``detail``: what the transport knows more (what the first bytes look like)."""
        code = error.reason_code
        self.metrics["protocol_errors"] += 1
        log.info(
            "mqtt %s from %s: %s%s",
            self.client_id or "(connecting)",
            self.context.peer or "?",
            error,
            detail,
        )
        if self.state is State.AWAIT_CONNECT:
            if code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION:
                self.link.write(encode(Connack(False, 0x01), 4))  # 3.1.1 form, as Mosquitto
            elif code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID:
                self.link.write(encode(Connack(False, 0x02), 4))
            self.state = State.CLOSED
            self.link.close()
            return
        self.close_with(code, error.message)

    def close_with(self, reason_code: int, reason: str = "") -> None:
        """Send DISCONNECT (5.0) with ``reason_code`` and close [MQTT-4.13.2-1]."""
        if self.state is State.CLOSED:
            return
        if self.version == MQTT_5 and self.state is State.CONNECTED:
            properties = NO_PROPERTIES
            if reason and self.problem_information:
                properties = Properties(reason_string=reason[:200])
            self.link.write(encode(Disconnect(reason_code, properties), MQTT_5))
        self._go_away()

    def keep_alive_expired(self) -> None:
        """[MQTT-3.1.2-22]: nothing received for 1.5 times the Keep Alive."""
        self.metrics["keep_alive_timeouts"] += 1
        self.close_with(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout")

    def take_over(self) -> None:
        """Another connection took this client id [MQTT-3.1.4-3]: 0x8E, then close. The session
        is detached now (the new connection continues or ends it)."""
        self.metrics["sessions_taken_over"] += 1
        self.close_with(ReasonCode.SESSION_TAKEN_OVER, "session taken over")

    def server_shutting_down(self) -> None:
        self.close_with(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def connection_lost(self) -> None:
        """The transport is gone (or closing): end the connection's part in the session."""
        if self.state is not State.CLOSED:
            self._go_away()

    def _go_away(self) -> None:
        mqtt_connection_closed(self)
        was_connected = self.state is State.CONNECTED
        self.state = State.CLOSED
        session = self.session
        hub = self.hub
        if was_connected and session is not None:
            will = None if self.normal_disconnect else self.will
            hub.detach(session, self, will)
        if self.cluster_gen:
            if (
                was_connected
                and session is not None
                and session.persistent
                and not session.ended
                and hub.sessions.get(session.client_id) is session
            ):
                # A persistent session stays registered to this node while it lives here
                # offline, so a reconnect elsewhere takes it over from here (the copy here is
                # dropped); released when it ends here (hub.end_session).
                session.cluster_gen = self.cluster_gen
            else:
                hub.api.release_client_id(self.context, self.cluster_gen)
        self.link.close()

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.link.write(data)

    def send_publish(
        self,
        message: OutMessage,
        qos: int,
        packet_id: int | None,
        retain: bool,
        subscription_ids: tuple[int, ...],
        dup: bool,
    ) -> bool:
        """Write one PUBLISH; False (nothing written) if larger than the client accepts."""
        version = self.version
        if version == MQTT_5:
            topic = message.topic
            alias = 0
            new_alias = False
            if self.alias_out_max:
                alias = self.aliases_out.get(topic, 0)
                if alias:
                    topic = ""  # the alias stands for it [MQTT-3.3.2-12]
                elif len(self.aliases_out) < self.alias_out_max:
                    alias = len(self.aliases_out) + 1
                    self.aliases_out[topic] = alias
                    new_alias = True
            simple = not (alias or subscription_ids or message.expires_at_ms)
            if simple and not qos:
                data = message.cached_qos0(MQTT_5, retain)
                if data is None:
                    data = encode_publish(
                        topic, message.payload, 0, None, retain, False, message.static_properties
                    )
                    message.cache_qos0(MQTT_5, retain, data)
            else:
                props = (
                    message.static_properties
                    if simple
                    else message.wire_properties(now_ms(), alias, subscription_ids)
                )
                data = encode_publish(topic, message.payload, qos, packet_id, retain, dup, props)
            if self.max_packet_size and len(data) > self.max_packet_size:
                if new_alias:
                    del self.aliases_out[message.topic]
                self.metrics["messages_too_large"] += 1
                return False
        elif qos:
            data = encode_publish(
                message.topic, message.payload, qos, packet_id, retain, dup, b"", 4
            )
        else:
            cached = message.cached_qos0(4, retain)
            if cached is None:
                cached = encode_publish(
                    message.topic, message.payload, 0, None, retain, False, b"", 4
                )
                message.cache_qos0(4, retain, cached)
            data = cached
        self.link.write(data)
        self.metrics["publishes_sent"] += 1
        return True

    def on_writing_paused(self, paused: bool) -> None:
        self.writing_paused = paused
        if not paused and self.session is not None and self.session.connection is self:
            self.session.on_writable()

    # -- CONNECT ---------------------------------------------------------------------------

    def _on_connect(self, packet: Connect) -> Awaitable[None] | None:
        hub = self.hub
        options = hub.options
        self.version = version = packet.protocol_level
        v5 = version == MQTT_5
        props = packet.properties
        if not hub.api.may_accept_connection():  # near the descriptor limit
            self._refuse(ReasonCode.SERVER_BUSY, "server busy: near the descriptor limit")
            return None
        if v5 and props.authentication_method is not None:
            # Enhanced authentication (AUTH) is not offered.
            self._refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "no enhanced authentication")
            return None
        too_long = grant_keep_alive(packet.keep_alive, options.max_keepalive, version)[2]
        if too_long:  # 3.1.1: 0x02 Identifier rejected, as Mosquitto (options.py says why)
            self._refuse(
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                f"keep alive {packet.keep_alive} above max_keepalive {options.max_keepalive}",
            )
            return None
        api = hub.api
        context = self.context
        if self.certificate_user is not None and options.use_identity_as_username:
            # The verified certificate names the user; CONNECT's user name and password are
            # not looked at (Mosquitto's use_identity_as_username).
            return _now_or_later(
                self._logged_in(packet, api.login_certificate(context, self.certificate_user))
            )
        if self.tls and options.use_identity_as_username:
            self._refuse(ReasonCode.NOT_AUTHORIZED, "no client certificate")
            return None
        if packet.username is None:
            return _now_or_later(self._logged_in(packet, api.login_anonymous(context)))
        return self._login(packet, packet.username, packet.password or b"")

    async def _login(self, packet: Connect, user: str, password: bytes) -> None:
        """A user name and password against the user store (it may wait: the host's login
        slow-down, then the hash check in a thread; the transport holds what follows)."""
        try:
            text = password.decode()
        except UnicodeDecodeError:  # no stored password is other than UTF-8 text
            text = "\0" + password.hex()
        result = await self.hub.api.login_password(self.context, user, text, "MQTT")
        if self.state is State.AWAIT_CONNECT:  # not closed while the check ran
            await self._logged_in(packet, result)

    async def _logged_in(self, packet: Connect, result: LoginResult) -> None:
        if not result.ok:
            code = (
                ReasonCode.NOT_AUTHORIZED
                if result.not_authorized
                else ReasonCode.BAD_USER_NAME_OR_PASSWORD
            )
            self._refuse(code, f"login refused ({result.reason}): user {result.user!r}")
            return
        await self._accept(packet, result.user)

    async def _accept(self, packet: Connect, user: str) -> None:
        hub = self.hub
        link = self.link
        if isinstance(link, GatewayTransport):  # the TCP listener (WebSocket: its own marks)
            link.bound_outgoing(*hub.api.outgoing_buffer_limits(self.context))
        options = hub.options
        version = self.version
        v5 = version == MQTT_5
        props = packet.properties
        keep_alive, server_keep_alive, _ = grant_keep_alive(
            packet.keep_alive, options.max_keepalive, version
        )
        client_id = packet.client_id
        assigned: str | None = None
        if not client_id:
            client_id = hub.new_client_id()  # [MQTT-3.1.3-6]
            if v5:
                assigned = client_id
        if v5:
            expiry = props.session_expiry_interval or 0
            self.send_quota = props.receive_maximum or DEFAULT_RECEIVE_MAXIMUM
            self.max_packet_size = props.maximum_packet_size or 0
            self.alias_out_max = min(props.topic_alias_maximum or 0, OUTBOUND_TOPIC_ALIASES)
            self.problem_information = props.request_problem_information != 0
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        granted_expiry = expiry
        if options.max_session_expiry is not None and expiry > options.max_session_expiry:
            granted_expiry = options.max_session_expiry
        self.client_id = client_id
        self.context = context = replace(self.context, user=user, client_id=client_id)
        refusal = hub.api.connection_limit_refusal(context)
        if refusal is not None:  # 3.1.1: 0x03 Server unavailable (reason_codes.py)
            self._refuse(ReasonCode.QUOTA_EXCEEDED, refusal.text)
            return
        if granted_expiry > 0:
            # [limits] max_mqtt_sessions counts persistent sessions, connected or not; one that
            # exists already (resumed, or replaced by Clean Start) adds none.
            existing = hub.sessions.get(client_id)
            if existing is None or not existing.persistent:
                refusal = hub.api.session_limit_refusal(
                    context, lambda: sum(1 for s in hub.sessions.values() if s.persistent)
                )
                if refusal is not None:  # 3.1.1: 0x03 Server unavailable
                    self._refuse(ReasonCode.QUOTA_EXCEEDED, refusal.text)
                    return
        self.access = access = Access(hub.api, context)
        will = packet.will
        if will is not None and not hub.may_publish_will(access, will):
            self._refuse(ReasonCode.NOT_AUTHORIZED, f"will topic {will.topic!r} not allowed")
            return
        try:
            gen = await hub.api.claim_client_id(context)
        except ShardUnavailable as error:  # held on another node that lives: retry later
            self._refuse(ReasonCode.SERVER_UNAVAILABLE, str(error))  # 3.1.1: 0x03
            return
        if self.state is not State.AWAIT_CONNECT:  # closed while claiming
            hub.api.release_client_id(context, gen)
            return
        self.cluster_gen = gen
        self.keep_alive = keep_alive
        self.will = will
        try:
            session, present = await hub.open_session(
                self, client_id, packet.clean_start, granted_expiry
            )
        except ShardUnavailable as error:  # its queue's or state's shard: no node serves it
            kept = hub.sessions.get(client_id)
            if kept is not None and kept.persistent and kept.connection is None:
                kept.cluster_gen = gen  # still registered here, as it lives here offline
            else:
                hub.api.release_client_id(context, gen)
            log.warning("mqtt %r: session cannot be opened: %s", client_id, error)
            self._refuse(ReasonCode.SERVER_UNAVAILABLE, str(error))  # 3.1.1: 0x03
            return
        self.session = session
        self.state = State.CONNECTED
        if will is not None:
            hub.hold_will(session, will)
        connack_props = NO_PROPERTIES
        if v5:
            connack_props = Properties(
                session_expiry_interval=granted_expiry if granted_expiry != expiry else None,
                receive_maximum=(
                    options.receive_maximum
                    if options.receive_maximum < DEFAULT_RECEIVE_MAXIMUM
                    else None
                ),
                maximum_packet_size=options.max_packet_size,
                assigned_client_identifier=assigned,
                topic_alias_maximum=options.topic_alias_maximum or None,
                server_keep_alive=server_keep_alive,
            )
        self.write(encode(Connack(present, 0, connack_props), version))
        self.metrics["connects"] += 1
        if keep_alive:
            self.link.start_keep_alive(keep_alive)
        session.attach(self, present)
        mqtt_connection_opened(self)  # shown in /api/connections from now on

    def _refuse(self, reason_code: int, reason: str) -> None:
        """CONNACK with an error, then close [MQTT-3.2.2-7]."""
        self.metrics["connects_refused"] += 1
        log.info("mqtt (connecting) from %s: refused: %s", self.context.peer or "?", reason)
        properties = NO_PROPERTIES
        if self.version == MQTT_5:
            properties = Properties(reason_string=reason)
        self.write(encode(Connack(False, reason_code, properties), self.version))
        self.state = State.CLOSED
        self.link.close()

    # -- PUBLISH in ------------------------------------------------------------------------

    def _on_publish(self, packet: Publish) -> Awaitable[None] | None:
        topic = packet.topic
        props = packet.properties
        if props is not NO_PROPERTIES and props.topic_alias is not None:
            topic = self._resolve_alias(topic, props.topic_alias)
        self.metrics["publishes_received"] += 1
        qos = packet.qos
        session = self.session
        assert session is not None
        if qos:
            packet_id = packet.packet_id
            assert packet_id is not None
            inbound = self.inbound
            if qos == 2 and packet_id in session.inbound_qos2:
                # A resent PUBLISH whose PUBREC was lost: acknowledge, do not publish twice
                # [MQTT-4.3.3-10].
                self.metrics["duplicates"] += 1
                inbound.duplicate(packet_id)
                return None
            if inbound.in_flight >= inbound.limit:
                raise inbound.exceeded()  # [MQTT-3.3.4-9]: flow.py says what counts
        hub = self.hub
        if self.version == MQTT_5 and hub.api.disk_alarm():
            self._refuse_for_disk_alarm(packet)
            return None
        if hub.api.publishing_blocked():
            return self._publish_when_unblocked(packet, topic)
        outcome = hub.publish_packet(self.context, self, topic, packet)
        if not isinstance(outcome, tuple):
            return self._publish_later(packet, outcome)
        if outcome[0] == ReasonCode.NOT_AUTHORIZED:
            self._denied(topic)
        if qos:
            self._acknowledge(packet, outcome)
        return None

    def _refuse_for_disk_alarm(self, packet: Publish) -> None:
        """The disk alarm (issue 21 item 2), MQTT 5: PUBACK / PUBREC 0x97 Quota exceeded for
        QoS 1/2, so the client knows it was not taken and may send it again; QoS 0 has no
        answer and is dropped (counted), since not reading would hold the refusals behind it.
        3.1.1 has no such code: its publishers are not read while the alarm lasts."""
        self.metrics["publishes_refused_disk_alarm"] += 1
        if packet.qos:
            self._acknowledge(packet, (ReasonCode.QUOTA_EXCEEDED, 0, ""))

    def _denied(self, topic: str) -> None:
        """A publish without permission (the core wrote the audit line): 5.0 answers PUBACK
        0x87; 3.1.1 is acknowledged and dropped (Mosquitto), or the connection is closed when
        ``[auth] mqtt_denied_publish = "disconnect"`` (RabbitMQ)."""
        self.metrics["publishes_denied"] += 1
        if self.version != MQTT_5 and self.hub.api.denied_mqtt_publish_closes(self.context):
            raise MqttProtocolError(
                ReasonCode.NOT_AUTHORIZED, f"publish to {topic!r} not allowed: closed"
            )

    async def _publish_when_unblocked(self, packet: Publish, topic: str) -> None:
        self.link.pause_reading("flow")
        try:
            await self.hub.api.wait_publishing_allowed()
        finally:
            self.link.resume_reading("flow")
        pending = self._publish(packet, topic)
        if pending is not None:
            await pending

    def _publish(self, packet: Publish, topic: str) -> Awaitable[None] | None:
        try:
            outcome = self.hub.publish_packet(self.context, self, topic, packet)
        except ShardUnavailable as error:
            self._not_stored(packet, error)
            return None
        if not isinstance(outcome, tuple):
            return self._publish_later(packet, outcome)
        if outcome[0] == ReasonCode.NOT_AUTHORIZED:
            self._denied(topic)
        self._acknowledge(packet, outcome)
        return None

    async def _publish_later(self, packet: Publish, pending: Awaitable[Any]) -> None:
        try:
            outcome = await pending
        except ShardUnavailable as error:
            self._not_stored(packet, error)
            return
        except TopicError as error:  # refused after a wait (by another node: a half message's)
            log.info("mqtt %s: publish to %r refused: %s", self.client_id, packet.topic, error)
            outcome = (ReasonCode.TOPIC_NAME_INVALID, 0, "")
        self._acknowledge(packet, outcome)

    def _not_stored(self, packet: Publish, error: ShardUnavailable) -> None:
        """A publish no node stores now (the shard of a destination, or of its transaction, has
        no owner that answered): PUBACK / PUBREC 0x80; 3.1.1 has no refusal code, so the
        connection is closed (as ``flow.py`` does when a forward fails later)."""
        log.warning("mqtt %s: publish not stored: %s", self.client_id, error)
        if self.version != MQTT_5:
            self.close_with(ReasonCode.UNSPECIFIED_ERROR, "storage unavailable")
            return
        self._acknowledge(packet, (ReasonCode.UNSPECIFIED_ERROR, 0, ""))

    def _acknowledge(self, packet: Publish, outcome: Outcome) -> None:
        """Queue the PUBACK / PUBREC of a publish (written once durable: ``flow.py``);
        ``outcome`` is (reason code, end position to be durable, log topic)."""
        if packet.qos:
            self.inbound.acknowledge(packet, outcome)

    def _resolve_alias(self, topic: str, alias: int) -> str:
        """5.0 §3.3.2.3.4: a topic name sets the alias; an empty one uses it."""
        if alias > self.hub.options.topic_alias_maximum:
            raise MqttProtocolError(
                ReasonCode.TOPIC_ALIAS_INVALID,
                f"topic alias {alias} > maximum {self.hub.options.topic_alias_maximum}",
            )
        if topic:
            self.aliases_in[alias] = topic
            return topic
        known = self.aliases_in.get(alias)
        if known is None:
            raise protocol_error(f"topic alias {alias} was never set [MQTT-3.3.4-?]")
        return known

    # -- acknowledgements of our PUBLISH ---------------------------------------------------

    def _on_puback(self, packet: Puback) -> None:
        assert self.session is not None
        self.session.on_puback(packet.packet_id)

    def _on_pubrec(self, packet: Pubrec) -> None:
        assert self.session is not None
        known = self.session.on_pubrec(packet.packet_id, packet.reason_code)
        if packet.reason_code < ReasonCode.UNSPECIFIED_ERROR:
            code = 0 if known else ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
            self.write(encode_ack(PacketType.PUBREL, packet.packet_id, code, self.version))

    def _on_pubcomp(self, packet: Pubcomp) -> None:
        assert self.session is not None
        self.session.on_pubcomp(packet.packet_id)

    def _on_pubrel(self, packet: Pubrel) -> None:
        """QoS 2 inbound, part 2: the identifier is free again [MQTT-4.3.3-11]."""
        session = self.session
        assert session is not None
        known = packet.packet_id in session.inbound_qos2
        session.inbound_qos2.discard(packet.packet_id)
        self.inbound.released(packet.packet_id, known)

    # -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------

    def _on_subscribe(self, packet: Subscribe) -> Awaitable[None] | None:
        return _now_or_later(self._subscribe(packet))

    async def _subscribe(self, packet: Subscribe) -> None:
        session = self.session
        assert session is not None
        identifier = packet.subscription_identifier or 0
        tag_filter = None
        for name, value in packet.properties.user_properties:
            if name == TAG_FILTER_PROPERTY:
                tag_filter = TagFilter.parse(value)
        results = [
            await self._subscribe_one(session, subscription, identifier, tag_filter)
            for subscription in packet.subscriptions
        ]
        codes = tuple(code for code, _, _ in results)
        self.write(encode(Suback(packet.packet_id, codes), self.version))
        self.metrics["subscribes"] += 1
        # Retained messages after the SUBACK [MQTT-3.3.1-9, 3.3.1-10, 3.3.1-11].
        for code, sub, is_new in results:
            if sub is None or code >= ReasonCode.UNSPECIFIED_ERROR or sub.group is not None:
                continue
            if sub.retain_handling == 2 or (sub.retain_handling == 1 and not is_new):
                continue
            await self.hub.send_retained(session, sub)

    async def _subscribe_one(
        self,
        session: Session,
        subscription: SubscribeEntry,
        identifier: int,
        tag_filter: TagFilter | None,
    ) -> tuple[int, Sub | None, bool]:
        """One SUBSCRIBE entry; a new filter past ``[limits] max_subscriptions_per_client``
        is refused 0x97 Quota exceeded (3.1.1: 0x80), as EMQX's ``max_subscriptions``; one
        that replaces a subscription of the session is not a new one."""
        if subscription.topic_filter not in session.subscriptions:
            refusal = self.hub.api.subscription_limit_refusal(
                self.context, len(session.subscriptions)
            )
            if refusal is not None:
                log.info(
                    "mqtt %r from %s: subscription %r refused: %s",
                    session.client_id,
                    self.context.peer or "?",
                    subscription.topic_filter,
                    refusal.text,
                )
                return ReasonCode.QUOTA_EXCEEDED, None, False
        try:
            return await self.hub.subscribe(session, subscription, identifier, tag_filter)
        except ShardUnavailable as error:  # its queue's shard: no node serves it now
            log.warning(
                "mqtt %r: subscription %r failed: %s",
                session.client_id,
                subscription.topic_filter,
                error,
            )
            return ReasonCode.UNSPECIFIED_ERROR, None, False  # SUBACK 0x80 (3.1.1 too)

    def _on_unsubscribe(self, packet: Unsubscribe) -> Awaitable[None] | None:
        return _now_or_later(self._unsubscribe(packet))

    async def _unsubscribe(self, packet: Unsubscribe) -> None:
        session = self.session
        assert session is not None
        codes = tuple(
            [
                0
                if await self.hub.unsubscribe(session, topic_filter)
                else ReasonCode.NO_SUBSCRIPTION_EXISTED
                for topic_filter in packet.topic_filters
            ]
        )
        if self.version != MQTT_5:
            codes = ()
        self.write(encode(Unsuback(packet.packet_id, codes), self.version))

    # -- the rest --------------------------------------------------------------------------

    def _on_pingreq(self, _packet: Pingreq) -> None:
        self.write(_PINGRESP)

    def _on_disconnect(self, packet: Disconnect) -> None:
        session = self.session
        assert session is not None
        expiry = packet.properties.session_expiry_interval
        if expiry is not None:
            if session.expiry_interval == 0 and expiry:
                # [MQTT-3.14.2-2]: 0 in CONNECT cannot become non-zero here.
                raise protocol_error("session expiry set on DISCONNECT after 0 in CONNECT")
            self.hub.set_expiry(session, expiry)
        # The Will is dropped on a normal disconnection only (0x00) [MQTT-3.1.2-10, 3.14.4-3].
        self.normal_disconnect = packet.reason_code == ReasonCode.NORMAL_DISCONNECTION
        self._go_away()

    def _on_auth(self, _packet: Auth) -> None:
        raise protocol_error("AUTH without an authentication method in CONNECT [MQTT-4.12.0-1]")


_PINGRESP: Final = encode(Pingresp(), MQTT_5)

# What each packet type does in each state; anything missing is a Protocol Error.
TRANSITIONS: Final[dict[State, dict[type[Any], Handler]]] = {
    State.AWAIT_CONNECT: {Connect: Connection._on_connect},
    State.CONNECTED: {
        Publish: Connection._on_publish,
        Puback: Connection._on_puback,
        Pubrec: Connection._on_pubrec,
        Pubrel: Connection._on_pubrel,
        Pubcomp: Connection._on_pubcomp,
        Subscribe: Connection._on_subscribe,
        Unsubscribe: Connection._on_unsubscribe,
        Pingreq: Connection._on_pingreq,
        Disconnect: Connection._on_disconnect,
        Auth: Connection._on_auth,
    },
    State.CLOSED: {},
}
