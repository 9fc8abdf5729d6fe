"""The AMQP listener's side of the management API: a vhost's exchanges, queues and bindings
changed by an operator (``PUT /api/queues/...`` and the rest, ``braid/web/rabbit/``), and each
open connection with its channels registered for ``/api/connections`` and ``/api/channels``.

:class:`VhostAdministrator` is the :class:`~core.api.ObjectAdministrator` the listener registers
for each of its vhosts at start, so the management API reaches these objects only through the
Broker API. It runs the same :class:`~gateway.amqp.vhost.VirtualHost` calls a channel does, so
an operator's declare gets AMQP's equivalence checks and RabbitMQ's texts, and a channel error
becomes a :class:`~core.api.ManagementRefusal` (404 not found, 403 access, else precondition:
RabbitMQ's management API answers a 406 with 400 and the same text). An operator's queue is
owned by no connection (never exclusive), as RabbitMQ's.

:func:`amqp_connection_opened` (at Connection.Open) and :func:`amqp_connection_closed` (when the
socket goes) are the session's two calls; :class:`AmqpConnectionControl` describes the
connection and its channels as they are at each listing and closes it for an operator as
RabbitMQ does (Connection.Close 320 ``CONNECTION_FORCED - Closed via management plugin``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from core.api import (
    PROTOCOL_AMQP_091,
    REFUSED_ACCESS,
    REFUSED_NOT_FOUND,
    REFUSED_PRECONDITION,
    ChannelDetails,
    ClientContext,
    ConnectionDetails,
    ManagementRefusal,
    connection_name,
    split_address,
)
from gateway.amqp.constants import ACCESS_REFUSED, CONNECTION_FORCED, NOT_FOUND
from gateway.amqp.errors import AmqpChannelError
from gateway.amqp.vhost import VirtualHost

if TYPE_CHECKING:
    from gateway.amqp.session import Session

T = TypeVar("T")


def _refusal_of(error: AmqpChannelError) -> ManagementRefusal:
    kind = {NOT_FOUND: REFUSED_NOT_FOUND, ACCESS_REFUSED: REFUSED_ACCESS}.get(
        error.reply_code, REFUSED_PRECONDITION
    )
    return ManagementRefusal(kind, str(error.reply_text))


def _as_refusal(action: Callable[[], T]) -> T:
    try:
        return action()
    except AmqpChannelError as error:
        raise _refusal_of(error) from None


async def _awaited_as_refusal(work: Awaitable[T]) -> T:
    try:
        return await work
    except AmqpChannelError as error:
        raise _refusal_of(error) from None


class VhostAdministrator:
    """One vhost's objects for the management API (:class:`~core.api.ObjectAdministrator`)."""

    def __init__(self, vhost: VirtualHost) -> None:
        self.vhost = vhost

    async def declare_exchange(
        self,
        context: ClientContext,
        name: str,
        ex_type: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        existed = self.vhost.find_exchange(context, name) is not None
        await _awaited_as_refusal(
            self.vhost.declare_exchange(
                context,
                name,
                ex_type,
                passive=False,
                durable=durable,
                auto_delete=auto_delete,
                internal=internal,
                arguments=arguments,
            )
        )
        return not existed

    async def delete_exchange(self, context: ClientContext, name: str, *, if_unused: bool) -> bool:
        if self.vhost.find_exchange(context, name) is None:
            return False
        await _awaited_as_refusal(self.vhost.delete_exchange(context, name, if_unused=if_unused))
        return True

    async def declare_queue(
        self,
        context: ClientContext,
        name: str,
        *,
        durable: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        existed = self.vhost.find_queue(name) is not None
        await _awaited_as_refusal(
            self.vhost.declare_queue(
                context,
                None,
                name,
                passive=False,
                durable=durable,
                exclusive=False,
                auto_delete=auto_delete,
                arguments=arguments,
            )
        )
        return not existed

    async def delete_queue(
        self, context: ClientContext, name: str, *, if_unused: bool, if_empty: bool
    ) -> bool:
        if self.vhost.find_queue(name) is None:
            return False
        await _awaited_as_refusal(
            self.vhost.delete_queue(None, name, if_unused=if_unused, if_empty=if_empty)
        )
        return True

    async def bind(
        self,
        context: ClientContext,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: Mapping[str, Any],
        *,
        unbind: bool,
    ) -> None:
        if destination_type == "queue":
            await _awaited_as_refusal(
                self.vhost.bind_queue(
                    context, None, destination, source, routing_key, arguments, unbind=unbind
                )
            )
        else:
            await _awaited_as_refusal(
                self.vhost.bind_exchange(
                    context, destination, source, routing_key, arguments, unbind=unbind
                )
            )

    def publish_topic(self, context: ClientContext, exchange: str, routing_key: str) -> str | None:
        if exchange == "":
            queue = self.vhost.find_queue(routing_key)
            return None if queue is None else queue.topic
        return _as_refusal(lambda: self.vhost.exchange(context, exchange)).topic


# -- connections and channels --------------------------------------------------------------


class AmqpConnectionControl:
    """One open AMQP connection for the management API (:class:`~core.api.ConnectionControl`)."""

    def __init__(self, session: Session, name: str, local: tuple[str, int]) -> None:
        self.session = session
        self.name = name
        self.local = local

    def describe(self) -> ConnectionDetails:
        session = self.session
        io = session.io
        peer_host, peer_port = _peer(session)
        channels = tuple(
            ChannelDetails(
                number=channel.number,
                prefetch_count=channel.prefetch_consumer,
                global_prefetch_count=channel.prefetch_global,
                consumer_count=len(channel.consumers),
                messages_unacknowledged=len(channel.unacked),
                messages_unconfirmed=max(channel.next_seq - 1 - channel.confirmed, 0)
                if channel.confirm
                else 0,
                confirm=channel.confirm,
                transactional=channel.tx is not None,
                consumers=tuple(
                    (consumer.queue.topic, tag)
                    for tag, consumer in channel.consumers.items()
                    if consumer.queue is not None
                ),
            )
            for channel in sorted(session.channels.values(), key=lambda c: c.number)
        )
        return ConnectionDetails(
            name=self.name,
            protocol=PROTOCOL_AMQP_091,
            user=session.user,
            vhost=session.vhost.name if session.vhost is not None else "/",
            peer_host=peer_host,
            peer_port=peer_port,
            host=self.local[0],
            port=self.local[1],
            client_id=session.client_name,
            client_properties=dict(session.client_properties),
            auth_mechanism="PLAIN",
            tls=_transport_info(session, "ssl_object") is not None,
            timeout_s=session.heartbeat,
            frame_max=session.frame_max,
            channel_max=session.channel_max,
            # Counted once, in gateway/transport.py's reads and writes.
            recv_oct=getattr(io, "recv_oct", 0),
            send_oct=getattr(io, "send_oct", 0),
            recv_cnt=getattr(io, "recv_cnt", 0),
            send_cnt=getattr(io, "send_cnt", 0),
            channels=channels,
        )

    def close_by_operator(self, reason: str) -> None:
        self.session.close_by_server(CONNECTION_FORCED, f"CONNECTION_FORCED - {reason}")


# Session -> its registration, from Connection.Open until the socket goes.
_registered: dict[Session, AmqpConnectionControl] = {}


def _transport_info(session: Session, key: str) -> Any:
    transport = getattr(session.io, "transport", None)
    return None if transport is None else transport.get_extra_info(key)


def _peer(session: Session) -> tuple[str, int]:
    return split_address(_transport_info(session, "peername"))


def amqp_connection_opened(session: Session) -> None:
    """Connection.Open succeeded: the connection shows in ``/api/connections``."""
    peer_host, peer_port = _peer(session)
    local = split_address(_transport_info(session, "sockname"))
    name = connection_name(peer_host, peer_port, *local)
    control = _registered[session] = AmqpConnectionControl(session, name, local)
    session.api.register_connection(session.context, name, control)


def amqp_connection_closed(session: Session) -> None:
    control = _registered.pop(session, None)
    if control is not None:
        session.api.unregister_connection(session.context, control.name, control)
