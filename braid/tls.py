"""TLS for every listener, from the standard library's ``ssl`` with asyncio.

One server :class:`ssl.SSLContext` (:class:`TlsContext`) is made from the ``[tls]`` settings
(``--tls-cert``, ``--tls-key``, ``--tls-ca``, ``verify_peer``, ``fail_if_no_peer_cert``) and
shared by every TLS listener: AMQPS, MQTTS, MQTT over secure WebSocket, Kafka SSL and HTTPS.
Client certificates follow RabbitMQ's ``ssl_options``: ``verify_peer`` asks for one and checks
it against the CA file; with ``fail_if_no_peer_cert`` a client without one is refused in the
handshake, without it such a client is let in (and logs in some other way).

:meth:`TlsContext.reload` (on SIGHUP) loads the certificate, key and CA file again into the
same context: handshakes from then on use the new certificate, open connections keep theirs
and are not dropped. A reload that fails (a half-written file) keeps the old certificate.

A TLS listener (:class:`TlsListener`) is an asyncio server with the context whose connections
are made by the plain listener's own protocol factory, so a TLS connection is handled exactly
as a plain one (the gateway's connections set holds both, and its ``close()`` closes both).
A gateway on its TLS port alone (``--amqp-port 0 --amqps-port 5671``) and HTTPS listen through
:func:`tls_listen`, the same listener, so a failed handshake is audited on every TLS port.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

log = logging.getLogger(__name__)

# TLS 1.2 at least: RabbitMQ 3.12+, Mosquitto 2 and Kafka 3 default to TLS 1.2 and 1.3.
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
# A client that opens a connection and never finishes its handshake is dropped after this long
# (asyncio's default is 60 s; RabbitMQ's handshake_timeout is 5 s for the whole TLS handshake).
HANDSHAKE_TIMEOUT_S: Final = 10.0
LISTEN_BACKLOG: Final = 1024


class TlsConfigError(ValueError):
    """The certificate, key or CA file cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsSettings:
    """The ``[tls]`` section (docs/configuration.md). A TLS listener is on when ``cert_file``
    is set (and its port is not 0)."""

    cert_file: str | None = None
    key_file: str | None = None  # None: the key is in cert_file
    ca_file: str | None = None  # CAs that client certificates are checked against
    verify_peer: bool = False
    fail_if_no_peer_cert: bool = False

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    def check(self) -> None:
        if not self.enabled and (self.key_file is not None or self.ca_file is not None):
            raise TlsConfigError("a TLS key or CA file without a certificate (--tls-cert)")
        if self.verify_peer and self.ca_file is None:
            raise TlsConfigError("verify_peer needs a CA file (--tls-ca) to check clients against")
        if self.fail_if_no_peer_cert and not self.verify_peer:
            raise TlsConfigError("fail_if_no_peer_cert needs verify_peer")


class TlsContext:
    """The one server context; :meth:`reload` loads the files again into it."""

    def __init__(self, settings: TlsSettings) -> None:
        settings.check()
        self.settings = settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_VERSION
        if settings.verify_peer:
            context.verify_mode = (
                ssl.CERT_REQUIRED if settings.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
            )
        else:
            context.verify_mode = ssl.CERT_NONE
        self.ssl = context
        self._load()
        self.reloads = 0

    def _load(self) -> None:
        settings = self.settings
        assert settings.cert_file is not None
        try:
            self.ssl.load_cert_chain(settings.cert_file, settings.key_file)
        except (OSError, ssl.SSLError) as error:
            raise TlsConfigError(
                f"cannot load the TLS certificate {settings.cert_file} "
                f"(key {settings.key_file or 'in the same file'}): {error}"
            ) from None
        if settings.ca_file is not None:
            try:
                self.ssl.load_verify_locations(cafile=settings.ca_file)
            except (OSError, ssl.SSLError) as error:
                raise TlsConfigError(
                    f"cannot load the TLS CA file {settings.ca_file}: {error}"
                ) from None

    def reload(self) -> bool:
        """Load the certificate, key and CA again (SIGHUP); False (and the old ones kept) when
        they cannot be loaded."""
        try:
            self._load()
        except TlsConfigError as error:
            log.error("TLS reload failed, keeping the certificate in use: %s", error)
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.settings.cert_file)
        return True


# A flood of failed handshakes from one host writes one audit line per this many seconds
# (core/security/audit.py's interval for repeated denials), the next one counting those left out.
HANDSHAKE_AUDIT_INTERVAL_S: Final = 10.0
HANDSHAKE_AUDIT_MAX_HOSTS: Final = 10_000
audit_log = logging.getLogger("braid.audit")


def _handshake_reason(error: BaseException) -> str:
    """What the audit line says of a failed handshake: the certificate check's own words
    ("certificate has expired", "unable to get local issuer certificate") or OpenSSL's reason."""
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return str(error.verify_message)
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason)
    if isinstance(error, TimeoutError):
        return "handshake timed out"
    return type(error).__name__


class HandshakeAudit:
    """One audit line (``braid.audit``, as every failed login) per failed TLS handshake, with
    the peer; at most one per host and reason per :data:`HANDSHAKE_AUDIT_INTERVAL_S`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.failures = 0
        # (host, reason) -> (when its last line was written, lines left out since)
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def failed(self, protocol: str, peer: tuple[Any, ...] | None, error: BaseException) -> None:
        self.failures += 1
        host = str(peer[0]) if peer else "?"
        reason = _handshake_reason(error)
        key = (host, reason)
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < HANDSHAKE_AUDIT_INTERVAL_S:
            self._last[key] = (last[0], last[1] + 1)
            return
        if len(self._last) >= HANDSHAKE_AUDIT_MAX_HOSTS:
            self._last.clear()
        left_out = last[1] if last is not None else 0
        self._last[key] = (now, 0)
        shown_peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        audit_log.warning(
            "login failed: protocol=%s peer=%r user='' mechanism=TLS reason=tls_handshake (%s)%s",
            protocol,
            shown_peer,
            reason,
            f" (and {left_out} more like it from {host} since the last line)" if left_out else "",
        )


class _Handshake(asyncio.Protocol):
    """An accepted TCP connection until its TLS handshake is done: the listener does it with
    ``loop.start_tls``, so that a failed one is known with its peer (asyncio and uvloop report
    those only in debug mode), then hands the TLS transport to the gateway's protocol."""

    def __init__(self, listener: TlsListener) -> None:
        self.listener = listener
        self.task: asyncio.Task[None] | None = None
        self.early = bytearray()  # the ClientHello, when it comes before start_tls is called

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.stream = stream = cast(asyncio.Transport, transport)
        self.task = asyncio.get_running_loop().create_task(self.listener._handshake(stream, self))
        self.listener._handshakes.add(self.task)
        self.task.add_done_callback(self.listener._handshakes.discard)

    def data_received(self, data: bytes) -> None:
        # Kept for start_tls's protocol (pausing in connection_made instead stalls uvloop).
        self.early += data
        self.stream.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        # Gone before start_tls took the transport over.
        if self.task is not None and not self.task.done():
            self.task.cancel()


class _Pending(asyncio.Protocol):
    """The TLS transport's protocol from the end of the handshake until the gateway's protocol
    has had ``connection_made`` (start_tls delivers what follows the handshake at once)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data += data

    def eof_received(self) -> bool:
        self.eof = True
        return True  # the gateway's protocol decides

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Hand ``data`` to a protocol as its transport would (uvloop's SSL protocol is a buffered
    protocol without being an ``asyncio.BufferedProtocol`` subclass)."""
    if hasattr(protocol, "buffer_updated"):
        protocol = cast(asyncio.BufferedProtocol, protocol)
        view = memoryview(data)
        while view:
            buffer = memoryview(protocol.get_buffer(len(view)))
            count = min(len(buffer), len(view))
            buffer[:count] = view[:count]
            protocol.buffer_updated(count)
            view = view[count:]
    else:
        cast(asyncio.Protocol, protocol).data_received(data)


class TlsListener:
    """A TLS server whose connections a plain listener's protocol factory makes."""

    def __init__(
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        tls: TlsContext,
        protocol: str = "tls",
        audit: HandshakeAudit | None = None,
        *,
        reuse_port: bool = False,
    ):
        self.protocol_factory = protocol_factory
        # SO_REUSEPORT: the port is shared by the workers of `braid serve --workers N`.
        self.reuse_port = reuse_port
        self.tls = tls
        self.protocol = protocol  # the audit line's protocol=
        self.audit = audit or HandshakeAudit()
        self._server: asyncio.Server | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> asyncio.Server:
        """Listen; the asyncio server returned is the one :meth:`close` closes."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Handshake(self),
            host,
            port,
            reuse_address=True,
            reuse_port=self.reuse_port or None,
            backlog=LISTEN_BACKLOG,
        )
        return self._server

    async def _handshake(self, transport: asyncio.Transport, accepted: _Handshake) -> None:
        loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if accepted.early:
            # Ahead of start_tls's own connection_made (same batch, scheduled first): what came
            # early goes into its incoming buffer, where its handshake reads it from.
            early = bytes(accepted.early)
            loop.call_soon(lambda: _feed(transport.get_protocol(), early))
        pending = _Pending()
        try:
            tls_transport = await loop.start_tls(
                transport,
                pending,
                self.tls.ssl,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            )
        except (ssl.SSLError, TimeoutError) as error:
            self.audit.failed(self.protocol, peer, error)
            transport.abort()
            return
        except (OSError, ConnectionError) as error:  # the client left mid-handshake
            log.debug("TLS handshake with %s ended: %r", peer, error)
            transport.abort()
            return
        if tls_transport is None or pending.lost is not None:  # closed as it finished
            transport.abort()
            return
        protocol = self.protocol_factory()
        protocol.connection_made(tls_transport)
        tls_transport.set_protocol(protocol)
        if pending.data:
            _feed(protocol, bytes(pending.data))
        if pending.eof and not cast(asyncio.Protocol, protocol).eof_received():
            tls_transport.close()

    @property
    def address(self) -> tuple[str, int] | None:
        if self._server is None or not self._server.sockets:
            return None
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop accepting; the connections belong to the plain listener, which closes them
        (so this does not wait for them, as ``wait_closed`` would)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for handshake in list(self._handshakes):
            handshake.cancel()


# How a gateway or the HTTP server listens (its ``start(..., listen=)``): its protocol factory,
# host and port in, a listening asyncio server out.
Listen = Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]


def tls_listen(
    tls: TlsContext,
    protocol: str,
    audit: HandshakeAudit | None = None,
    *,
    reuse_port: bool = False,
) -> Listen:
    """How a server listens on a TLS port with no plain listener beside it (a TLS-only gateway,
    HTTPS): through a :class:`TlsListener`, whose failed handshakes are audit lines, rather
    than with ``create_server(ssl=)``, whose failed handshakes asyncio reports in debug mode
    only. The server closes the returned asyncio server as its own; a handshake still under way
    then finishes or times out (as with ``ssl=``)."""

    async def listen(
        protocol_factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
    ) -> asyncio.Server:
        listener = TlsListener(
            protocol_factory, tls, protocol=protocol, audit=audit, reuse_port=reuse_port
        )
        return await listener.start(host, port)

    return listen
