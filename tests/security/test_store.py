"""core/security/store.py: users, permissions and ACLs durable in the log, over real data dirs."""

from __future__ import annotations

from pathlib import Path

from core.cluster import LocalMetadata
from core.security.model import (
    KafkaAcl,
    KafkaAclFilter,
    TopicPermission,
    User,
    VhostPermission,
)
from core.security.passwords import RABBIT_SHA256, PasswordHash, hash_password, verify_password
from core.security.scram import credentials_from_password
from core.security.store import DEFAULT_USER, FULL_ACCESS, SECURITY_TOPIC, SecurityStore

ALICE_PERMISSION = VhostPermission("^alice\\.", "^alice\\.", "^alice\\.")
ACL = KafkaAcl("TOPIC", "payroll", "LITERAL", "User:bob", "*", "READ", "DENY")


def test_a_fresh_store_has_guest_loopback_administrator(stores):
    security = SecurityStore(LocalMetadata(stores()))
    guest = security.user(DEFAULT_USER)
    assert guest is not None
    assert guest.tags == ("administrator",)
    assert verify_password(guest.password, "guest")
    assert set(guest.scram) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
    assert security.permission("/", DEFAULT_USER) == FULL_ACCESS


async def test_deleting_guest_survives_a_restart(stores):
    security = SecurityStore(LocalMetadata(stores()))
    assert await security.delete_user(DEFAULT_USER)
    assert security.permission("/", DEFAULT_USER) is None
    security.metadata.store.flush()
    again = SecurityStore(LocalMetadata(stores()))
    assert again.user(DEFAULT_USER) is None  # made once, on first boot only
    assert again.users() == []


async def test_restart_keeps_users_hashes_permissions_and_acls(stores, tmp_path: Path):
    security = SecurityStore(LocalMetadata(stores()))
    alice_hash = hash_password("alice-secret")
    await security.put_user(
        User("alice", alice_hash, ("management",), credentials_from_password("alice-secret"))
    )
    imported = PasswordHash(RABBIT_SHA256, "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR")
    await security.put_user(User("imported", imported, ("monitoring",)))
    await security.set_permission("/", "alice", ALICE_PERMISSION)
    await security.set_permission("staging", "alice", FULL_ACCESS)
    await security.set_topic_permission(
        "/", "alice", TopicPermission("amq.topic", "^{username}\\.", ".*")
    )
    await security.add_acl(ACL)
    security.metadata.store.flush()
    generation = security.generation

    again = SecurityStore(LocalMetadata(stores()))
    alice = again.user("alice")
    assert alice is not None
    assert alice.password == alice_hash
    assert alice.tags == ("management",)
    assert alice.scram == security.user("alice").scram
    assert verify_password(again.user("imported").password, "test12")
    assert again.permission("/", "alice") == ALICE_PERMISSION
    assert again.permission("staging", "alice") == FULL_ACCESS
    assert again.topic_permissions_of("/", "alice") == {
        "amq.topic": TopicPermission("amq.topic", "^{username}\\.", ".*")
    }
    assert again.acls() == [ACL]
    assert generation > 0

    # No plaintext password anywhere in the data directory.
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            assert b"alice-secret" not in raw, path
            assert b"test12" not in raw, path


async def test_deleting_a_user_deletes_its_permissions(stores):
    security = SecurityStore(LocalMetadata(stores()))
    await security.put_user(User("alice"))
    await security.set_permission("/", "alice", ALICE_PERMISSION)
    await security.set_topic_permission("/", "alice", TopicPermission("x", ".*", ".*"))
    assert await security.delete_user("alice")
    assert not await security.delete_user("alice")
    assert security.permission("/", "alice") is None
    assert security.topic_permissions_of("/", "alice") == {}
    security.metadata.store.flush()
    again = SecurityStore(LocalMetadata(stores()))
    assert again.user("alice") is None
    assert [user for _, user, _ in again.permissions()] == [DEFAULT_USER]


async def test_acls_are_selected_and_deleted_by_filter(stores):
    security = SecurityStore(LocalMetadata(stores()))
    prefixed = KafkaAcl("TOPIC", "alice.", "PREFIXED", "User:alice", "*", "WRITE", "ALLOW")
    group = KafkaAcl("GROUP", "*", "LITERAL", "User:*", "*", "READ", "ALLOW")
    for acl in (ACL, prefixed, group):
        await security.add_acl(acl)
    await security.add_acl(ACL)  # the same binding twice is one
    assert len(security.acls()) == 3
    assert security.acls(KafkaAclFilter(resource_type="TOPIC")) == sorted(
        [ACL, prefixed], key=lambda acl: acl.key()
    )
    # MATCH: the ACLs that apply to the name (a prefix, "*"), of any type unless one is given.
    assert security.acls(
        KafkaAclFilter("TOPIC", resource_name="alice.t", pattern_type="MATCH")
    ) == [prefixed]
    assert security.acls(KafkaAclFilter(resource_name="alice.t", pattern_type="MATCH")) == [
        group,
        prefixed,
    ]
    assert security.acls(KafkaAclFilter(resource_name="g1", pattern_type="MATCH")) == [group]
    assert await security.delete_acls(KafkaAclFilter(principal="User:bob")) == [ACL]
    security.metadata.store.flush()
    again = SecurityStore(LocalMetadata(stores()))
    assert sorted(again.acls(), key=lambda acl: acl.key()) == sorted(
        [prefixed, group], key=lambda acl: acl.key()
    )


async def test_every_change_is_a_record_of_the_system_topic(stores):
    security = SecurityStore(LocalMetadata(stores()))
    _, before = security.metadata.store.queue_bounds(SECURITY_TOPIC, 0)
    await security.put_user(User("alice"))
    await security.set_permission("/", "alice", ALICE_PERMISSION)
    _, after = security.metadata.store.queue_bounds(SECURITY_TOPIC, 0)
    assert after == before + 2
    assert security.last_version > 0


async def test_listeners_hear_every_change(stores):
    security = SecurityStore(LocalMetadata(stores()))
    heard: list[int] = []
    security.add_listener(lambda: heard.append(security.generation))
    await security.put_user(User("alice"))
    await security.clear_permission("/", "nobody")  # nothing to clear: no change
    await security.set_permission("/", "alice", ALICE_PERMISSION)
    assert heard == [heard[0], heard[0] + 1]
