"""core/security/authorizer.py over the mapping table: every protocol operation of
core/security/mapping.py:OPERATIONS granted by exactly the permission it names, refused
without it, and Kafka ACLs adding to it (an ALLOW from either source grants, a DENY wins)."""

from __future__ import annotations

import pytest

from core.cluster import LocalMetadata
from core.security.authorizer import ANONYMOUS_PRINCIPAL, Authorizer, expand_variables, matches
from core.security.mapping import (
    ADMINISTRATOR,
    CLUSTER,
    CONFIGURE,
    DESCRIBE,
    EXCHANGE,
    GROUP,
    OPERATION_LIST,
    QUEUE,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    mqtt_filter_as_routing_pattern,
    resource_of,
    split_vhost,
)
from core.security.model import KafkaAcl, TopicPermission, User, VhostPermission
from core.security.store import SecurityStore

# A name of each resource kind that the expression ^alice\. covers.
NAMES = {
    TOPIC: "alice.t",
    EXCHANGE: "alice.x",
    QUEUE: "amq.queue.alice.q",
    GROUP: "alice.g",
    TRANSACTIONAL_ID: "alice.tx",
    CLUSTER: "",
}
OTHER_NAMES = {
    TOPIC: "bob.t",
    EXCHANGE: "bob.x",
    QUEUE: "amq.queue.bob.q",
    GROUP: "bob.g",
    TRANSACTIONAL_ID: "bob.tx",
}
ALICE = "^alice\\."


def only(permission: str) -> VhostPermission:
    """Exactly one of configure/write/read granted on alice.* names."""
    return VhostPermission(
        ALICE if permission == CONFIGURE else "",
        ALICE if permission == WRITE else "",
        ALICE if permission == READ else "",
    )


def all_but(permission: str) -> VhostPermission:
    return VhostPermission(
        "" if permission == CONFIGURE else ".*",
        "" if permission == WRITE else ".*",
        "" if permission == READ else ".*",
    )


@pytest.fixture
async def security(stores):
    store = SecurityStore(LocalMetadata(stores()))
    await store.put_user(User("alice"))
    return store


def decide(authorizer, rule, name, user="alice", host="10.0.0.1", routing_key=None):
    return authorizer.decide(user, host, "client-1", rule.name, name, routing_key).allowed


@pytest.mark.parametrize("rule", OPERATION_LIST, ids=lambda rule: rule.name)
async def test_each_operation_needs_exactly_its_permission(security, rule):
    authorizer = Authorizer(security, anonymous_user=None)
    name = NAMES[rule.resource]
    if rule.permission == ADMINISTRATOR:
        await security.set_permission("/", "alice", VhostPermission(".*", ".*", ".*"))
        assert not decide(authorizer, rule, name)
        await security.put_user(User("alice", tags=("administrator",)))
        assert decide(authorizer, rule, name)
        return
    if rule.permission == DESCRIBE:
        for granted in (CONFIGURE, WRITE, READ):
            await security.set_permission("/", "alice", only(granted))
            assert decide(authorizer, rule, name), granted
        await security.set_permission("/", "alice", VhostPermission("", "", ""))
        assert not decide(authorizer, rule, name)
    else:
        await security.set_permission("/", "alice", only(rule.permission))
        assert decide(authorizer, rule, name)
        assert not decide(authorizer, rule, OTHER_NAMES[rule.resource])
        await security.set_permission("/", "alice", all_but(rule.permission))
        assert not decide(authorizer, rule, name)
    await security.clear_permission("/", "alice")
    assert not decide(authorizer, rule, name)


@pytest.mark.parametrize("rule", OPERATION_LIST, ids=lambda rule: rule.name)
async def test_each_operation_is_its_kafka_acl(security, rule):
    authorizer = Authorizer(security, anonymous_user=None)
    name = NAMES[rule.resource]
    resource = resource_of(rule.resource, name)
    allow = KafkaAcl(
        resource.acl_type,
        resource.acl_name,
        "LITERAL",
        "User:alice",
        "*",
        rule.kafka_operation,
        "ALLOW",
    )
    assert not decide(authorizer, rule, name)
    await security.add_acl(allow)  # an ALLOW ACL grants without any vhost permission
    assert decide(authorizer, rule, name)
    assert not decide(authorizer, rule, name, user="bob")
    deny = KafkaAcl(
        resource.acl_type, resource.acl_name, "LITERAL", "User:*", "10.0.0.1", "ALL", "DENY"
    )
    await security.set_permission("/", "alice", VhostPermission(".*", ".*", ".*"))
    await security.put_user(User("alice", tags=("administrator",)))
    await security.add_acl(deny)  # a DENY wins over both
    assert not decide(authorizer, rule, name)
    assert decide(authorizer, rule, name, host="10.0.0.2")  # another host: not denied


async def test_the_issues_example_needs_no_kafka_acl(security):
    await security.set_permission("/", "alice", VhostPermission(ALICE, ALICE, ALICE))
    authorizer = Authorizer(security, anonymous_user=None)
    assert authorizer.decide("alice", "h", "", "kafka Produce", "alice.t").allowed
    refused = authorizer.decide("alice", "h", "", "kafka Produce", "bob.t")
    assert not refused.allowed
    assert refused.reason == "no permission"
    assert (refused.resource.vhost, refused.resource.kind, refused.resource.name) == (
        "/",
        EXCHANGE,
        "bob.t",
    )


async def test_a_private_vhost_is_protected_on_every_protocol(security):
    """The issue's example: guest has '/' only, so vhost secret's queue payroll is refused to
    an anonymous Kafka consumer, an MQTT publisher and a Kafka DeleteTopics."""
    await security.put_user(User("guest"))
    await security.set_permission("/", "guest", VhostPermission(".*", ".*", ".*"))
    authorizer = Authorizer(security, anonymous_user="guest")
    payroll = "amq.vhost.secret.amq.queue.payroll"
    for operation in ("kafka Fetch", "mqtt PUBLISH", "kafka DeleteTopics", "kafka Produce"):
        decision = authorizer.decide("", "127.0.0.1", "", operation, payroll)
        assert not decision.allowed, operation
        assert (decision.resource.vhost, decision.resource.kind) == ("secret", QUEUE)
    assert authorizer.decide("", "127.0.0.1", "", "kafka Fetch", "amq.queue.payroll").allowed
    await security.set_permission("secret", "alice", VhostPermission("", "", "^payroll$"))
    assert authorizer.decide("alice", "h", "", "kafka Fetch", payroll).allowed
    assert not authorizer.decide("alice", "h", "", "kafka Produce", payroll).allowed


async def test_anonymous_acts_as_the_anonymous_user_and_is_user_anonymous_in_acls(security):
    await security.set_permission("/", "alice", VhostPermission("", ALICE, ""))
    authorizer = Authorizer(security, anonymous_user="alice")
    assert authorizer.decide("", "h", "", "mqtt PUBLISH", "alice.t").allowed
    assert not authorizer.decide("", "h", "", "mqtt SUBSCRIBE", "alice.t").allowed
    await security.add_acl(
        KafkaAcl("TOPIC", "alice.", "PREFIXED", ANONYMOUS_PRINCIPAL, "*", "WRITE", "DENY")
    )
    assert not authorizer.decide("", "h", "", "mqtt PUBLISH", "alice.t").allowed
    assert authorizer.decide("alice", "h", "", "mqtt PUBLISH", "alice.t").allowed
    assert (
        not Authorizer(security, anonymous_user=None)
        .decide("", "h", "", "kafka Fetch", "alice.t")
        .allowed
    )


async def test_topic_permissions_apply_to_routing_keys_with_variables(security):
    await security.set_permission("/", "alice", VhostPermission(".*", ".*", ".*"))
    await security.set_topic_permission(
        "/", "alice", TopicPermission("sensors", "^{username}\\.", "^{client_id}\\.")
    )
    authorizer = Authorizer(security, anonymous_user=None)

    def allowed(operation: str, key: str) -> bool:
        return authorizer.decide("alice", "h", "dev-7", operation, "sensors", key).allowed

    assert allowed("mqtt PUBLISH", "alice.temp")
    assert not allowed("mqtt PUBLISH", "bob.temp")
    assert allowed("mqtt SUBSCRIBE", "dev-7.#")
    assert not allowed("mqtt SUBSCRIBE", "#")
    assert allowed("amqp basic.publish", "alice.x")
    # Exchanges without a topic permission, and operations without a key, are not limited.
    assert authorizer.decide("alice", "h", "", "mqtt PUBLISH", "other", "bob.temp").allowed
    assert authorizer.decide("alice", "h", "", "kafka Produce", "sensors").allowed


async def test_changes_apply_at_once(security):
    authorizer = Authorizer(security, anonymous_user=None)
    await security.set_permission("/", "alice", VhostPermission("", ALICE, ""))
    assert authorizer.decide("alice", "h", "", "kafka Produce", "alice.t").allowed  # cached
    await security.set_permission("/", "alice", VhostPermission("", "", ""))
    assert not authorizer.decide("alice", "h", "", "kafka Produce", "alice.t").allowed
    await security.set_permission("/", "alice", VhostPermission("", ALICE, ""))
    await security.delete_user("alice")
    assert not authorizer.decide("alice", "h", "", "kafka Produce", "alice.t").allowed


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("", "", False),  # RabbitMQ: "" matches nothing
        ("", "anything", False),
        (".*", "", True),
        ("^alice\\.", "alice.t", True),
        ("^alice\\.", "xalice.t", False),
        ("alice", "xalice.t", True),  # searched, as re:run: anchor your expressions
        ("(", "x", False),  # a bad expression grants nothing
    ],
)
def test_expressions_match_as_rabbitmq(pattern, value, expected):
    assert matches(pattern, value) is expected


def test_variables_are_escaped():
    pattern = expand_variables("^{username}$", username="a.*", vhost="/", client_id="")
    assert matches(pattern, "a.*")
    assert not matches(pattern, "abc")


@pytest.mark.parametrize(
    ("name", "vhost", "local"),
    [
        ("t", "/", "t"),
        ("amq.vhost.staging.events", "staging", "events"),
        ("amq.vhost.staging.amq.queue.q", "staging", "amq.queue.q"),
        ("amq.vhost.", "/", "amq.vhost."),
        ("amq.vhostly", "/", "amq.vhostly"),
    ],
)
def test_split_vhost(name, vhost, local):
    assert split_vhost(name) == (vhost, local)


def test_mqtt_filters_as_routing_patterns():
    assert mqtt_filter_as_routing_pattern("a/+/b.c") == "a.*.b/c"
    assert mqtt_filter_as_routing_pattern("#") == "#"
