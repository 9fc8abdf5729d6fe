"""core/security/service.py: logins (password, SCRAM with scramp's client, certificate,
anonymous), the loopback rule, the slow-down, the audit lines; and the Broker API's calls."""

from __future__ import annotations

import asyncio
import logging

import pytest
import scramp

from core.api import PROTOCOL_KAFKA, PROTOCOL_MQTT, BrokerAPI, ClientContext
from core.broker import BrokerConfig, Node
from core.cluster import LocalMetadata
from core.security.config import SecurityConfig
from core.security.model import VhostPermission
from core.security.passwords import RABBIT_SHA256, PasswordHash
from core.security.service import (
    BAD_CREDENTIALS,
    NOT_AUTHORIZED,
    THROTTLED,
    SecurityError,
    SecurityService,
    is_loopback,
)

REMOTE = "192.0.2.7:40000"
LOCAL = "127.0.0.1:40000"


@pytest.fixture
def service(stores):
    return SecurityService(LocalMetadata(stores()), vhosts=("/", "staging"))


async def test_password_logins(service, caplog):
    await service.put_user("alice", password="alice-secret", tags="management,monitoring")
    ok = await service.login_password("amqp", REMOTE, "alice", "alice-secret")
    assert ok.ok
    assert ok.user == "alice"
    assert ok.tags == ("management", "monitoring")
    with caplog.at_level(logging.WARNING, logger="braid.audit"):
        wrong = await service.login_password("amqp", REMOTE, "alice", "nope")
        unknown = await service.login_password("mqtt", REMOTE, "mallory", "x")
    assert (wrong.ok, wrong.reason) == (False, BAD_CREDENTIALS)
    assert (unknown.ok, unknown.reason) == (False, BAD_CREDENTIALS)
    lines = [r.getMessage() for r in caplog.records if r.name == "braid.audit"]
    assert lines == [
        "login failed: protocol=amqp peer='192.0.2.7:40000' user='alice' mechanism=PLAIN "
        "reason=bad_credentials",
        "login failed: protocol=mqtt peer='192.0.2.7:40000' user='mallory' mechanism=PLAIN "
        "reason=bad_credentials",
    ]
    assert "nope" not in caplog.text


async def test_guest_only_from_loopback(service):
    assert (await service.login_password("amqp", LOCAL, "guest", "guest")).ok
    assert (await service.login_password("amqp", "[::1]:5", "guest", "guest")).ok
    remote = await service.login_password("amqp", REMOTE, "guest", "guest")
    assert (remote.ok, remote.reason) == (False, NOT_AUTHORIZED)


async def test_imported_rabbitmq_user_logs_in_and_gets_scram_at_password_change(service):
    imported = PasswordHash(RABBIT_SHA256, "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR")
    await service.put_user("old", password_hash=imported, tags=["administrator"])
    assert (await service.login_password("amqp", REMOTE, "old", "test12")).ok
    assert service.store.user("old").scram == {}
    await service.change_password("old", "new-password")
    user = service.store.user("old")
    assert user.password.algorithm == "argon2id"
    assert set(user.scram) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert user.tags == ("administrator",)
    assert not (await service.login_password("amqp", REMOTE, "old", "test12")).ok
    assert (await service.login_password("amqp", REMOTE, "old", "new-password")).ok


async def test_a_changed_password_is_not_remembered(service):
    await service.put_user("alice", password="one")
    assert (await service.login_password("amqp", REMOTE, "alice", "one")).ok
    await service.change_password("alice", "two")
    assert not (await service.login_password("amqp", REMOTE, "alice", "one")).ok
    assert (await service.login_password("amqp", REMOTE, "alice", "two")).ok
    await service.delete_user("alice")
    assert not (await service.login_password("amqp", REMOTE, "alice", "two")).ok


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_logins_with_scramps_client(service, mechanism):
    await service.put_user("alice", password="pencil")

    async def attempt(password: str):
        client = scramp.ScramClient([mechanism], "alice", password)
        login = service.scram_login("kafka", REMOTE, mechanism)
        server_first = await login.first(client.get_client_first().encode())
        assert server_first is not None
        client.set_server_first(server_first.decode())
        server_final = login.final(client.get_client_final().encode())
        if server_final is not None:
            client.set_server_final(server_final.decode())  # the server proved itself
        return login.result

    good = await attempt("pencil")
    assert (good.ok, good.user) == (True, "alice")
    bad = await attempt("pen")
    assert (bad.ok, bad.reason) == (False, BAD_CREDENTIALS)


async def test_scram_unknown_user_fails_at_once(service):
    client = scramp.ScramClient(["SCRAM-SHA-256"], "mallory", "x")
    login = service.scram_login("kafka", REMOTE, "SCRAM-SHA-256")
    assert await login.first(client.get_client_first().encode()) is None
    assert login.result.reason == BAD_CREDENTIALS


async def test_certificate_logins_need_an_existing_user(service):
    await service.put_user("device-1")  # no password: EXTERNAL only
    assert service.login_certificate("amqp", REMOTE, "device-1").ok
    assert not service.login_certificate("amqp", REMOTE, "device-2").ok
    assert not (await service.login_password("amqp", REMOTE, "device-1", "")).ok


@pytest.mark.parametrize(
    ("mode", "local", "remote"),
    [("loopback", True, False), ("never", False, False), ("always", True, True)],
)
def test_anonymous_modes(stores, mode, local, remote):
    service = SecurityService(LocalMetadata(stores()), SecurityConfig(anonymous=mode))
    assert service.login_anonymous("mqtt", LOCAL).ok is local
    assert service.login_anonymous("mqtt", REMOTE).ok is remote


async def test_failed_logins_slow_the_host_down(stores):
    service = SecurityService(
        LocalMetadata(stores()),
        SecurityConfig(login_failures_before_delay=2, login_first_delay_ms=200),
    )
    for _ in range(2):
        assert not (await service.login_password("amqp", REMOTE, "guest", "x")).ok
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempts = await asyncio.gather(
        *(service.login_password("amqp", REMOTE, "guest", "x") for _ in range(3))
    )
    assert all(not result.ok for result in attempts)
    # Three parallel attempts got slots 0, 0.2 and 0.4 s (at least; no upper bound asserted).
    assert loop.time() - started >= 0.4
    assert service.throttle.delayed == 2
    other = await service.login_password("amqp", LOCAL, "guest", "guest")
    assert other.ok  # another host is not slowed


async def test_a_refused_slot_is_answered_without_a_check(stores):
    service = SecurityService(
        LocalMetadata(stores()),
        SecurityConfig(
            login_failures_before_delay=1, login_first_delay_ms=100_000, login_max_delay_ms=100_000
        ),
    )
    assert not (await service.login_password("amqp", REMOTE, "guest", "x")).ok
    first = service.throttle.delay_before_attempt("192.0.2.7")  # takes the free slot
    assert first == 0
    refused = await service.login_password("amqp", REMOTE, "guest", "guest")
    assert (refused.ok, refused.reason) == (False, THROTTLED)


async def test_denials_are_audited_once_per_interval(service, caplog):
    await service.put_user("alice", password="a")
    await service.set_permission("/", "alice", VhostPermission("", "^alice\\.", ""))
    with caplog.at_level(logging.WARNING, logger="braid.audit"):
        for _ in range(5):
            assert not service.authorize("kafka", REMOTE, "alice", "c", "kafka Produce", "bob.t")
        assert service.authorize("kafka", REMOTE, "alice", "c", "kafka Produce", "alice.t")
    lines = [r.getMessage() for r in caplog.records if r.name == "braid.audit"]
    assert lines == [
        "access denied: protocol=kafka peer='192.0.2.7:40000' user='alice' "
        "operation='kafka Produce' vhost='/' resource='exchange bob.t' reason=no permission"
    ]
    assert service.audit.denials == 5


async def test_management_changes_are_checked(service):
    await service.put_user("alice", password="a")
    with pytest.raises(SecurityError, match="no vhost"):
        await service.set_permission("nope", "alice", VhostPermission(".*", ".*", ".*"))
    with pytest.raises(SecurityError, match="no user"):
        await service.set_permission("/", "bob", VhostPermission(".*", ".*", ".*"))
    with pytest.raises(SecurityError, match="not a regular expression"):
        await service.set_permission("/", "alice", VhostPermission("(", ".*", ".*"))
    with pytest.raises(SecurityError):
        await service.put_user("", password="x")
    await service.set_permission("staging", "alice", VhostPermission(".*", "", ""))
    assert service.store.permission("staging", "alice") == VhostPermission(".*", "", "")


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("127.0.0.1:1", True),
        ("127.9.9.9:1", True),
        ("[::1]:1", True),
        ("[::ffff:127.0.0.1]:1", True),
        ("10.0.0.1:1", False),
        ("[2001:db8::1]:1", False),
        ("localhost:1", False),  # names are not resolved: an address is what a socket reports
        ("", True),  # a Unix socket
    ],
)
def test_is_loopback(peer, expected):
    assert is_loopback(peer) is expected


async def test_the_broker_api_decides_with_the_client_context(stores):
    store = stores()
    broker = Node(store, BrokerConfig())
    security = SecurityService(broker.metadata)
    api = BrokerAPI(broker, security)
    await security.put_user("alice", password="pw")
    await security.set_permission("/", "alice", VhostPermission("", "^alice\\.", "^alice\\."))
    alice = ClientContext(PROTOCOL_KAFKA, user="alice", peer=REMOTE, client_id="c")
    assert api.authorize(alice, "kafka Produce", "alice.t")
    assert not api.authorize(alice, "kafka Produce", "bob.t")
    anonymous_remote = ClientContext(PROTOCOL_MQTT, peer=REMOTE)
    assert not api.login_anonymous(anonymous_remote).ok
    assert (await api.login_password(anonymous_remote, "alice", "pw")).ok
    # An API built without a service makes a default one over the same log.
    assert BrokerAPI(broker).authorize(alice, "kafka Fetch", "alice.t")
    await broker.close()
