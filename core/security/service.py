"""SecurityService: logins and access decisions for every protocol, and the changes the
management API makes, over one :class:`~core.security.store.SecurityStore`.

Logins:

- **password** (AMQP PLAIN and AMQPLAIN, MQTT user name and password, Kafka SASL PLAIN, HTTP
  Basic): :meth:`SecurityService.login_password`. The host's slow-down slot is waited for
  first (:mod:`core.security.throttle`), then the stored hash is checked in its algorithm
  (argon2id in a worker thread, so the event loop keeps serving); an unknown user costs the same
  argon2 check against a dummy hash, so timing does not tell which names exist. A user in
  ``loopback_users`` with the right password from elsewhere is refused as *not authorized*
  (RabbitMQ: "user 'guest' can only connect via localhost").
- **SCRAM-SHA-256 / 512** (Kafka): :meth:`SecurityService.scram_login` gives a sans-IO
  :class:`ScramLogin` (scramp's server) that the gateway feeds the client's two messages.
- **certificate** (AMQP EXTERNAL, MQTT and Kafka identity from the certificate's CN):
  :meth:`SecurityService.login_certificate`: the user must exist, as RabbitMQ requires.
- **anonymous** (MQTT without user name, Kafka without SASL): :meth:`login_anonymous`, as the
  ``anonymous`` setting says.

A successful argon2id check is remembered (keyed HMAC of the user name and password under a
key made at process start, beside the hash it was checked against; memory only, at most
:data:`MAX_VERIFIED` users), so that a client reconnecting with the same password does not pay
~20 ms of CPU each time; a changed hash or a deleted user forgets it.

Every failed login and every denial writes an audit line (:mod:`core.security.audit`).
Not thread-safe: the event loop's thread (argon2 work goes to threads and back).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from core.cluster.metadata import MetadataStore
from core.security.audit import Audit
from core.security.authorizer import Authorizer, Decision, expression_error
from core.security.config import ANONYMOUS_ALWAYS, ANONYMOUS_LOOPBACK, SecurityConfig
from core.security.model import (
    KafkaAcl,
    KafkaAclFilter,
    SecurityModelError,
    TopicPermission,
    User,
    VhostPermission,
    check_user_name,
    parse_tags,
)
from core.security.passwords import (
    ARGON2ID,
    NO_PASSWORD_HASH,
    PasswordHash,
    hash_password,
    verify_password,
)
from core.security.scram import (
    ScramCredential,
    check_mechanism,
    client_final_as_kafka,
    credential_from_salted_password,
    credentials_from_password,
)
from core.security.store import SecurityStore
from core.security.throttle import REFUSE, LoginThrottle, host_of

# Login outcomes (each protocol answers them in its own words: AMQP 403 ACCESS_REFUSED, MQTT
# CONNACK 0x04/0x86 and 0x05/0x87, Kafka SASL_AUTHENTICATION_FAILED).
BAD_CREDENTIALS: Final = "bad_credentials"
NOT_AUTHORIZED: Final = "not_authorized"
THROTTLED: Final = "throttled"  # answered as bad credentials: the client learns nothing more

MAX_VERIFIED: Final = 10_000
_VERIFIED_KEY: Final = os.urandom(32)


@functools.cache
def _dummy_hash() -> PasswordHash:
    """A hash checked when the user does not exist, so that an unknown name costs as much
    time as a known one (made once, at the first such login)."""
    return hash_password(os.urandom(16).hex())


class SecurityError(ValueError):
    """A management change that cannot be made (unknown user or vhost, bad expression...);
    ``status`` is the HTTP status the management API answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class LoginResult:
    """``ok``; ``user`` (``""`` for anonymous); ``tags``; ``reason`` when refused."""

    ok: bool
    user: str = ""
    tags: tuple[str, ...] = ()
    reason: str = ""

    @property
    def not_authorized(self) -> bool:
        """Refused although the credentials may be right (a loopback-only user from elsewhere,
        anonymous clients not allowed): MQTT answers 0x87/0x05 rather than 0x86/0x04."""
        return self.reason == NOT_AUTHORIZED


def is_loopback(peer: str) -> bool:
    """Whether the peer (``host:port``, ``[v6]:port`` or a bare host) is a loopback address
    (127.0.0.0/8, ::1, and IPv4-mapped ::ffff:127.x); a Unix socket (no host) counts too."""
    host = host_of(peer)
    if not host:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass
class ScramLogin:
    """One SCRAM exchange (RFC 5802), sans-IO: ``await first(client_first)`` returns the
    server-first message, ``final(client_final)`` the server-final one; either returns None
    when the login failed (``result`` says why; the client is told only that it failed)."""

    service: SecurityService
    protocol: str
    peer: str
    mechanism: str
    result: LoginResult | None = None
    _server: object = field(default=None, repr=False)
    _user: str = ""

    async def first(self, client_first: bytes) -> bytes | None:
        import scramp

        service = self.service
        host = host_of(self.peer)
        if not await service._wait_for_slot(host):
            self._fail("", THROTTLED)
            return None
        mechanism = scramp.ScramMechanism(self.mechanism)

        def credentials(user: str) -> tuple[bytes, bytes, bytes, int]:
            self._user = user
            stored = service.store.user(user)
            credential = stored.scram.get(self.mechanism) if stored is not None else None
            if credential is None:
                raise KeyError(user)
            return (
                credential.salt,
                credential.stored_key,
                credential.server_key,
                credential.iterations,
            )

        server = mechanism.make_server(credentials)
        try:
            server.set_client_first(client_first.decode())
        except (KeyError, UnicodeDecodeError, scramp.ScramException):
            self._fail(self._user, BAD_CREDENTIALS)
            return None
        self._server = server
        return str(server.get_server_first()).encode()

    def final(self, client_final: bytes) -> bytes | None:
        import scramp

        server = self._server
        if server is None or self.result is not None:
            return None
        server_final: str | None
        try:
            server.set_client_final(client_final.decode())  # type: ignore[attr-defined]
            server_final = str(server.get_server_final())  # type: ignore[attr-defined]
        except (UnicodeDecodeError, scramp.ScramException):
            # Kafka's nonce rule, which librdkafka 2.0 (kcat 1.7) needs (core/security/scram.py).
            server_final = _client_final_as_kafka(server, self.mechanism, client_final)
        if server_final is None:
            self._fail(self._user, BAD_CREDENTIALS)
            return None
        service = self.service
        user = service.store.user(self._user)
        if user is None:
            self._fail(self._user, BAD_CREDENTIALS)
            return None
        if not service._may_log_in_from(user.name, self.peer):
            self._fail(user.name, NOT_AUTHORIZED)
            return None
        service.throttle.succeeded(host_of(self.peer))
        self.result = LoginResult(True, user.name, user.tags)
        return server_final.encode()

    def _fail(self, user: str, reason: str) -> None:
        self.result = LoginResult(False, user, (), reason)
        self.service._login_failed(self.protocol, self.peer, user, self.mechanism, reason)


def _client_final_as_kafka(server: Any, mechanism: str, client_final: bytes) -> str | None:
    """scramp's server state (after the client-first message) checked again by
    :func:`core.security.scram.client_final_as_kafka`."""
    try:
        text = client_final.decode()
        return client_final_as_kafka(
            mechanism,
            (server.stored_key, server.server_key),
            f"{server.client_first_bare},{server.server_first}",
            str(server.nonce),
            bytes(server.gs2_header),
            text,
        )
    except (UnicodeDecodeError, AttributeError):
        return None


class SecurityService:
    def __init__(
        self,
        metadata: MetadataStore,
        config: SecurityConfig | None = None,
        vhosts: Sequence[str] = ("/",),
    ) -> None:
        self.config = config = config or SecurityConfig()
        self.vhosts = tuple(vhosts)
        self.store = SecurityStore(metadata)
        self.authorizer = Authorizer(self.store, config.anonymous_user or None)
        self.throttle = LoginThrottle(
            failures_before_delay=config.login_failures_before_delay,
            first_delay_s=config.login_first_delay_ms / 1000,
            max_delay_s=config.login_max_delay_ms / 1000,
            forget_after_s=config.login_failure_memory_ms / 1000,
        )
        self.audit = Audit(repeat_interval_s=config.audit_repeat_interval_ms / 1000)
        self._verified: OrderedDict[str, tuple[bytes, str]] = OrderedDict()
        self.store.add_listener(self._forget_changed_hashes)

    # -- logins ----------------------------------------------------------------------------

    async def login_password(
        self, protocol: str, peer: str, user: str, password: str, mechanism: str = "PLAIN"
    ) -> LoginResult:
        host = host_of(peer)
        if not await self._wait_for_slot(host):
            self._login_failed(protocol, peer, user, mechanism, THROTTLED)
            return LoginResult(False, user, (), THROTTLED)
        stored = self.store.user(user)
        if stored is None:
            await asyncio.to_thread(verify_password, _dummy_hash(), password)
            ok = False
        else:
            ok = await self._check(stored, password)
            stored = self.store.user(user)  # it may have changed while the thread worked
            ok = ok and stored is not None
        if not ok or stored is None:
            self._login_failed(protocol, peer, user, mechanism, BAD_CREDENTIALS)
            return LoginResult(False, user, (), BAD_CREDENTIALS)
        if not self._may_log_in_from(user, peer):
            self._login_failed(protocol, peer, user, mechanism, NOT_AUTHORIZED)
            return LoginResult(False, user, (), NOT_AUTHORIZED)
        self.throttle.succeeded(host)
        return LoginResult(True, user, stored.tags)

    def login_anonymous(self, protocol: str, peer: str) -> LoginResult:
        mode = self.config.anonymous
        if mode == ANONYMOUS_ALWAYS or (mode == ANONYMOUS_LOOPBACK and is_loopback(peer)):
            acting = self.store.user(self.config.anonymous_user)
            return LoginResult(True, "", acting.tags if acting is not None else ())
        self._login_failed(protocol, peer, "", "ANONYMOUS", NOT_AUTHORIZED)
        return LoginResult(False, "", (), NOT_AUTHORIZED)

    def login_certificate(self, protocol: str, peer: str, user: str) -> LoginResult:
        """A client certificate the TLS layer verified names ``user`` (its CN)."""
        stored = self.store.user(user)
        if stored is None:
            self._login_failed(protocol, peer, user, "EXTERNAL", BAD_CREDENTIALS)
            return LoginResult(False, user, (), BAD_CREDENTIALS)
        if not self._may_log_in_from(user, peer):
            self._login_failed(protocol, peer, user, "EXTERNAL", NOT_AUTHORIZED)
            return LoginResult(False, user, (), NOT_AUTHORIZED)
        return LoginResult(True, user, stored.tags)

    def scram_login(self, protocol: str, peer: str, mechanism: str) -> ScramLogin:
        return ScramLogin(self, protocol, peer, check_mechanism(mechanism))

    async def _wait_for_slot(self, host: str) -> bool:
        delay = self.throttle.delay_before_attempt(host)
        if delay == REFUSE:
            return False
        if delay > 0:
            await asyncio.sleep(delay)
        return True

    def _may_log_in_from(self, user: str, peer: str) -> bool:
        return user not in self.config.loopback_users or is_loopback(peer)

    def _login_failed(
        self, protocol: str, peer: str, user: str, mechanism: str, reason: str
    ) -> None:
        if reason != NOT_AUTHORIZED:
            self.throttle.failed(host_of(peer))
        self.audit.login_failed(protocol, peer, user, mechanism, reason)

    async def _check(self, user: User, password: str) -> bool:
        if user.password.algorithm != ARGON2ID:
            return verify_password(user.password, password)  # RabbitMQ's: one cheap digest
        digest = hmac.digest(_VERIFIED_KEY, f"{user.name}\0{password}".encode(), hashlib.sha256)
        known = self._verified.get(user.name)
        if (
            known is not None
            and hmac.compare_digest(known[0], digest)
            and known[1] == user.password.value
        ):
            self._verified.move_to_end(user.name)
            return True
        ok = await asyncio.to_thread(verify_password, user.password, password)
        if ok:
            self._verified[user.name] = (digest, user.password.value)
            while len(self._verified) > MAX_VERIFIED:
                self._verified.popitem(last=False)
        return ok

    def _forget_changed_hashes(self) -> None:
        for name, (_digest, value) in list(self._verified.items()):
            user = self.store.user(name)
            if user is None or user.password.value != value:
                del self._verified[name]

    # -- access ----------------------------------------------------------------------------

    def authorize(
        self,
        protocol: str,
        peer: str,
        user: str,
        client_id: str,
        operation: str,
        name: str,
        routing_key: str | None = None,
    ) -> bool:
        """The authorizer's decision; a denial writes an audit line."""
        decision = self.authorizer.decide(
            user, host_of(peer), client_id, operation, name, routing_key
        )
        if not decision.allowed:
            self._denied(protocol, peer, user, decision, routing_key)
        return decision.allowed

    def may_open_vhost(self, protocol: str, peer: str, user: str, vhost: str) -> bool:
        """Whether ``user`` has any permission (even three empty expressions) on ``vhost``:
        RabbitMQ's ``check_vhost_access`` for AMQP Connection.Open. A refusal writes an audit
        line."""
        if self.store.user(user) is not None and self.store.permission(vhost, user) is not None:
            return True
        operation = f"{protocol} connection.open"
        self.audit.denied(protocol, peer, user, operation, vhost, f"vhost {vhost}", "no permission")
        return False

    def add_vhosts(self, vhosts: Sequence[str]) -> None:
        """Vhosts a listener serves beyond those the service was made with (permissions may be
        set on them)."""
        self.vhosts = (*self.vhosts, *(v for v in vhosts if v not in self.vhosts))

    def _denied(
        self, protocol: str, peer: str, user: str, decision: Decision, routing_key: str | None
    ) -> None:
        resource = f"{decision.resource.kind} {decision.resource.name}"
        if routing_key is not None:
            resource += f" routing key {routing_key}"
        self.audit.denied(
            protocol,
            peer,
            user,
            decision.rule.name,
            decision.resource.vhost,
            resource,
            decision.reason,
        )

    # -- management (HTTP API, Kafka admin requests) ---------------------------------------

    async def _durable(self) -> None:
        await self.store.metadata.wait_durable(self.store.last_version)

    async def put_user(
        self,
        name: str,
        *,
        password: str | None = None,
        password_hash: PasswordHash | None = None,
        tags: str | Sequence[str] = (),
    ) -> bool:
        """Create or replace a user (RabbitMQ's PUT /api/users/{name}): with a ``password``
        (hashed with argon2id; SCRAM credentials made), an imported ``password_hash``, or
        neither (no password: EXTERNAL only). Returns True when the user is new."""
        try:
            check_user_name(name)
        except SecurityModelError as error:
            raise SecurityError(str(error)) from None
        scram: dict[str, ScramCredential] = {}
        if password is not None:
            if password_hash is not None:
                raise SecurityError("give a password or a password_hash, not both")
            password_hash, scram = await asyncio.to_thread(self._hash_new_password, password)
        tag_tuple = parse_tags(tags if isinstance(tags, str) else list(tags))
        created = self.store.user(name) is None
        await self.store.put_user(User(name, password_hash or NO_PASSWORD_HASH, tag_tuple, scram))
        await self._durable()
        return created

    def _hash_new_password(self, password: str) -> tuple[PasswordHash, dict[str, ScramCredential]]:
        scram = credentials_from_password(password, iterations=self.config.scram_iterations)
        return hash_password(password), scram

    async def import_config_users(self, users: Mapping[str, tuple[str, Sequence[str]]]) -> None:
        """Bring the config file's ``[amqp.users]`` (name -> (password, vhosts); ``"*"``: every
        vhost) into the one store, so the users a config names may log in, and act, on every
        protocol: a user the store lacks is created with that password, and a vhost it lists
        on which the store has no permission for it gets ``.*`` for all three (what the config
        meant: full access to the vhosts it may open). What the store holds is never
        overwritten, so changes made over the API survive a restart with the same config."""
        for name, (password, vhosts) in users.items():
            if self.store.user(name) is None:
                await self.put_user(name, password=password)
            wanted = self.vhosts if "*" in vhosts else [v for v in vhosts if v in self.vhosts]
            for vhost in wanted:
                if self.store.permission(vhost, name) is None:
                    await self.store.set_permission(vhost, name, VhostPermission(".*", ".*", ".*"))
        await self._durable()

    async def change_password(self, name: str, password: str) -> None:
        user = self.store.user(name)
        if user is None:
            raise SecurityError(f"no user {name!r}", 404)
        password_hash, scram = await asyncio.to_thread(self._hash_new_password, password)
        await self.store.set_password(name, password_hash, scram)
        await self._durable()

    async def delete_user(self, name: str) -> bool:
        deleted = await self.store.delete_user(name)
        await self._durable()
        return deleted

    def _check_vhost_and_user(self, vhost: str, user: str) -> None:
        if vhost not in self.vhosts:
            raise SecurityError(f"no vhost {vhost!r} (vhosts: {', '.join(self.vhosts)})", 400)
        if self.store.user(user) is None:
            raise SecurityError(f"no user {user!r}", 400)

    @staticmethod
    def _check_expressions(**expressions: str) -> None:
        for what, pattern in expressions.items():
            problem = expression_error(pattern)
            if problem is not None:
                raise SecurityError(f"{what}: not a regular expression ({problem}): {pattern!r}")

    async def set_permission(self, vhost: str, user: str, permission: VhostPermission) -> None:
        self._check_vhost_and_user(vhost, user)
        self._check_expressions(
            configure=permission.configure, write=permission.write, read=permission.read
        )
        await self.store.set_permission(vhost, user, permission)
        await self._durable()

    async def clear_permission(self, vhost: str, user: str) -> bool:
        cleared = await self.store.clear_permission(vhost, user)
        await self._durable()
        return cleared

    async def set_topic_permission(
        self, vhost: str, user: str, permission: TopicPermission
    ) -> None:
        self._check_vhost_and_user(vhost, user)
        self._check_expressions(write=permission.write, read=permission.read)
        await self.store.set_topic_permission(vhost, user, permission)
        await self._durable()

    async def clear_topic_permissions(
        self, vhost: str, user: str, exchange: str | None = None
    ) -> bool:
        cleared = await self.store.clear_topic_permissions(vhost, user, exchange)
        await self._durable()
        return cleared

    async def add_acls(self, acls: Sequence[KafkaAcl]) -> None:
        for acl in acls:
            await self.store.add_acl(acl)
        await self._durable()

    async def delete_acls(self, selected: KafkaAclFilter) -> list[KafkaAcl]:
        deleted = await self.store.delete_acls(selected)
        await self._durable()
        return deleted

    async def set_scram_credential(
        self, user: str, mechanism: str, salt: bytes, salted_password: bytes, iterations: int
    ) -> None:
        """Kafka's AlterUserScramCredentials upsertion: the user is created (without a
        password) when missing, as Kafka keeps SCRAM users apart from everything else."""
        credential = credential_from_salted_password(mechanism, salt, salted_password, iterations)
        stored = self.store.user(user) or User(check_user_name(user))
        scram = dict(stored.scram)
        scram[mechanism] = credential
        await self.store.put_user(User(stored.name, stored.password, stored.tags, scram))
        await self._durable()

    async def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        stored = self.store.user(user)
        if stored is None or mechanism not in stored.scram:
            return False
        scram = {m: c for m, c in stored.scram.items() if m != mechanism}
        await self.store.put_user(User(stored.name, stored.password, stored.tags, scram))
        await self._durable()
        return True
