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
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

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


def peer_certificate_cn(transport: asyncio.BaseTransport) -> str | None:
    """The common name of the verified client certificate of a TLS connection, or None: the
    user name for AMQP EXTERNAL, MQTT's identity as user name and Kafka's SSL principal."""
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TlsListener:
    """A TLS server whose connections a plain listener's protocol factory makes."""

    def __init__(self, protocol_factory: Callable[[], asyncio.BaseProtocol], tls: TlsContext):
        self.protocol_factory = protocol_factory
        self.tls = tls
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.protocol_factory,
            host,
            port,
            ssl=self.tls.ssl,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
            reuse_address=True,
            backlog=LISTEN_BACKLOG,
        )

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
