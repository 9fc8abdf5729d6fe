"""AMQP logins and permissions against a real ``braid serve``, with pika, aio-pika and py-amqp
(AMQPLAIN): users made over the HTTP API log in (PLAIN, AMQPLAIN; a wrong password or an
unknown user is 403 ACCESS_REFUSED with RabbitMQ's text, and an audit line), EXTERNAL with a
client certificate on AMQPS, Connection.Open of a vhost without a permission (530 NOT_ALLOWED),
each kind of denial as a 403 channel close with RabbitMQ's text (the connection and other
clients go on), topic permissions with ``{username}`` on a topic exchange, and a permission
changed over HTTP applying to the open connection at once. Every AMQP row of the mapping table
is driven in tests/security/test_mapping_table.py."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
import aiormq
import amqp
import pika
import pika.exceptions
import pytest

from tests.braid_process import BraidProcess, free_port
from tests.security.certs import CertificateAuthority
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism {}. For details see the "
    "broker logfile."
)


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    directory = tmp_path_factory.mktemp("amqp-sec")
    config = directory / "braid.toml"
    config.write_text('[amqp]\nvhosts = ["/", "private"]\n')
    with BraidProcess(
        directory, listeners=("amqp", "http"), extra_args=("--config", str(config))
    ) as process:
        yield process


@pytest.fixture(scope="module")
def admin(braid: BraidProcess) -> Admin:
    return Admin(braid.http_port)


def user_with(admin: Admin, prefix: str, **permissions: str) -> tuple[str, str]:
    name, password = unique(prefix), uuid.uuid4().hex
    admin.user(name, password)
    if permissions:
        admin.permit(name, **permissions)
    return name, password


def connect(braid: BraidProcess, user: str, password: str, vhost: str = "/") -> Any:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            vhost,
            pika.PlainCredentials(user, password),
            connection_attempts=1,
        )
    )


def refused(action: Any) -> tuple[int, str]:
    """Run ``action`` (on a pika channel); the 403 channel close it must end in."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        action()
    return closed.value.reply_code, closed.value.reply_text


# -- logins ------------------------------------------------------------------------------------


def test_a_user_made_over_http_logs_in_with_pika_and_py_amqp(
    braid: BraidProcess, admin: Admin
) -> None:
    user, password = user_with(admin, "amy", configure=".*", write=".*", read=".*")
    connection = connect(braid, user, password)
    channel = connection.channel()
    queue = unique("q.")
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"as amy")
    _method, _properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"as amy"
    connection.close()
    # py-amqp (kombu's transport) logs in with AMQPLAIN.
    with amqp.Connection(
        f"127.0.0.1:{braid.amqp_port}", userid=user, password=password, login_method="AMQPLAIN"
    ) as other:
        other.connect()
        other_channel = other.channel()
        other_channel.basic_publish(amqp.Message(b"amqplain"), "", queue)
        assert other_channel.basic_get(queue, no_ack=True).body == b"amqplain"


@pytest.mark.parametrize("case", ["wrong password", "unknown user"])
def test_a_refused_login_is_access_refused(braid: BraidProcess, admin: Admin, case: str) -> None:
    user, password = user_with(admin, "bea", configure=".*", write=".*", read=".*")
    if case == "wrong password":
        password = "not-" + password
    else:
        user = unique("nobody-")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as error:
        connect(braid, user, password)
    assert f"(403) '{LOGIN_REFUSED.format('PLAIN')}'" in str(error.value)
    assert "login failed: protocol=amqp peer='127.0.0.1:" in braid.stderr()
    assert f"user='{user}' mechanism=PLAIN reason=bad_credentials" in braid.stderr()
    assert password not in braid.stderr()
    # The broker and another client are unaffected.
    good = connect(braid, "guest", "guest")
    assert good.channel().queue_declare("", exclusive=True).method.queue
    good.close()


async def test_aio_pika_login_and_refusal(braid: BraidProcess, admin: Admin) -> None:
    user, password = user_with(admin, "cy", configure=".*", write=".*", read=".*")
    url = f"amqp://{user}:{password}@127.0.0.1:{braid.amqp_port}/"
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("q."), auto_delete=True)
        await channel.default_exchange.publish(aio_pika.Message(b"hi"), queue.name)
        async with asyncio.timeout(DEADLINE_S):
            message = await queue.get(timeout=DEADLINE_S, fail=True)
        assert message is not None
        assert message.body == b"hi"
    bad = f"amqp://{user}:wrong@127.0.0.1:{braid.amqp_port}/"
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as closed:
        await aio_pika.connect(bad)
    assert closed.value.args[0] == LOGIN_REFUSED.format("PLAIN")


def test_a_login_without_mechanism_support_is_command_invalid(braid: BraidProcess) -> None:
    # EXTERNAL is offered only on TLS with a verified client certificate.
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.amqp_port,
        credentials=pika.credentials.ExternalCredentials(),
        connection_attempts=1,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(parameters)


# -- Connection.Open ----------------------------------------------------------------------------


def test_a_vhost_without_permission_is_not_allowed(braid: BraidProcess, admin: Admin) -> None:
    user, password = user_with(admin, "dee", configure=".*", write=".*", read=".*")  # "/" only
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as closed:
        connect(braid, user, password, vhost="private")
    assert f"""(530) "NOT_ALLOWED - access to vhost 'private' refused for user '{user}'\"""" in (
        str(closed.value)
    )
    assert "operation='amqp connection.open' vhost='private'" in braid.stderr()
    # Three empty expressions are still a permission: the vhost opens (RabbitMQ's rule).
    admin._send("PUT", f"/permissions/private/{user}", {"configure": "", "write": "", "read": ""})
    connection = connect(braid, user, password, vhost="private")
    channel = connection.channel()
    code, text = refused(lambda: channel.queue_declare("anything"))
    assert code == 403
    assert text == (
        f"ACCESS_REFUSED - configure access to queue 'anything' in vhost 'private' refused "
        f"for user '{user}'"
    )
    connection.close()


# -- denials, as RabbitMQ words them -----------------------------------------------------------


def test_each_denial_closes_the_channel_with_rabbitmqs_text(
    braid: BraidProcess, admin: Admin
) -> None:
    user, password = user_with(admin, "eve", configure="^eve\\.", write="^eve\\.", read="^eve\\.")
    setup = connect(braid, "guest", "guest").channel()
    setup.exchange_declare("other.x", "direct")
    setup.queue_declare("other.q")
    setup.exchange_declare("eve.x", "direct")
    setup.queue_declare("eve.q")
    connection = connect(braid, user, password)

    def denied(action: Any, text: str) -> None:
        channel = connection.channel()
        code, reply = refused(lambda: action(channel))
        assert (code, reply) == (403, f"ACCESS_REFUSED - {text} refused for user '{user}'")

    where = "in vhost '/'"
    denied(lambda c: c.exchange_declare("other.y", "fanout"),
           f"configure access to exchange 'other.y' {where}")  # fmt: skip
    denied(lambda c: c.exchange_delete("other.x"),
           f"configure access to exchange 'other.x' {where}")  # fmt: skip
    denied(lambda c: c.queue_declare("other.r"), f"configure access to queue 'other.r' {where}")
    denied(lambda c: c.queue_delete("other.q"), f"configure access to queue 'other.q' {where}")
    denied(lambda c: c.queue_purge("other.q"), f"read access to queue 'other.q' {where}")
    denied(lambda c: c.queue_bind("other.q", "eve.x"), f"write access to queue 'other.q' {where}")
    denied(lambda c: c.queue_bind("eve.q", "other.x"),
           f"read access to exchange 'other.x' {where}")  # fmt: skip
    denied(lambda c: c.basic_get("other.q"), f"read access to queue 'other.q' {where}")
    denied(lambda c: c.basic_consume("other.q", lambda *_: None),
           f"read access to queue 'other.q' {where}")  # fmt: skip
    # A publish is refused asynchronously: the next synchronous call sees the close.
    denied(lambda c: (c.basic_publish("other.x", "k", b"x"), c.queue_declare("eve.q")),
           f"write access to exchange 'other.x' {where}")  # fmt: skip
    denied(lambda c: (c.basic_publish("", "eve.q", b"x"), c.queue_declare("eve.q")),
           f"write access to exchange 'amq.default' {where}")  # fmt: skip
    # What the user may do works, on the same connection, after all those channel closes.
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("eve.r", auto_delete=True)
    channel.queue_bind("eve.r", "eve.x", "k")
    channel.basic_publish("eve.x", "k", b"mine")
    _method, _properties, body = channel.basic_get("eve.r", auto_ack=True)
    assert body == b"mine"
    connection.close()
    assert "protocol=amqp peer='127.0.0.1:" in braid.stderr()
    assert "operation='amqp basic.publish' vhost='/' resource='exchange amq.default'" in (
        braid.stderr()
    )
    setup.connection.close()


def test_topic_permissions_apply_to_publishes_and_bindings_on_topic_exchanges(
    braid: BraidProcess, admin: Admin
) -> None:
    user, password = user_with(admin, "flo", configure=".*", write=".*", read=".*")
    admin.topic_permit(user, "amq.topic", write="^{username}\\.", read="^{username}\\.")
    connection = connect(braid, user, password)
    channel = connection.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "amq.topic", f"{user}.#")
    channel.basic_publish("amq.topic", f"{user}.a", b"mine")
    _method, _properties, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"mine"
    code, text = refused(lambda: channel.basic_publish("amq.topic", "someone.a", b"theirs"))
    assert (code, text) == (
        403,
        f"ACCESS_REFUSED - write access to topic 'someone.a' in exchange 'amq.topic' in vhost "
        f"'/' refused for user '{user}'",
    )
    other = connection.channel()
    code, text = refused(lambda: other.queue_bind(queue, "amq.topic", "#"))
    assert text == (
        f"ACCESS_REFUSED - read access to topic '#' in exchange 'amq.topic' in vhost '/' "
        f"refused for user '{user}'"
    )
    # Not a topic exchange: routing keys are not checked (RabbitMQ checks topic exchanges only).
    last = connection.channel()
    last.confirm_delivery()
    last.basic_publish("amq.direct", "someone.a", b"direct")
    connection.close()


def test_a_permission_change_applies_to_the_open_connection(
    braid: BraidProcess, admin: Admin
) -> None:
    user, password = user_with(admin, "gus", configure=".*", write=".*", read=".*")
    connection = connect(braid, user, password)
    channel = connection.channel()
    queue = unique("gus.")
    channel.queue_declare(queue)
    channel.basic_get(queue)
    admin.permit(user, configure=".*", write=".*", read="^nothing$")
    code, _text = refused(lambda: channel.basic_get(queue))
    assert code == 403
    admin.permit(user, configure=".*", write=".*", read=".*")
    assert connection.channel().basic_get(queue) == (None, None, None)
    connection.close()


# -- EXTERNAL with a client certificate on AMQPS -------------------------------------------------


@pytest.fixture(scope="module")
def amqps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    directory = tmp_path_factory.mktemp("amqps-external")
    ca = CertificateAuthority(directory / "pki", "amqp-ca")
    server = ca.issue("localhost", server=True)
    port = free_port()
    args = (
        "--tls-cert", str(server.cert), "--tls-key", str(server.key),
        "--tls-ca", str(ca.cert_path), "--tls-verify-peer", "--amqps-port", str(port),
        "--mqtts-port", "0", "--mqtt-wss-port", "0", "--kafka-tls-port", "0",
        "--https-port", "0",
    )  # fmt: skip
    # AMQPS alone: the plain AMQP listener is off (--amqp-port 0).
    with BraidProcess(directory, listeners=("http",), extra_args=args) as process:
        process.amqps_port = port  # type: ignore[attr-defined]
        process.ca = ca  # type: ignore[attr-defined]
        yield process


def client_tls(ca: CertificateAuthority, common_name: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    if common_name is not None:
        issued = ca.issue(common_name, server=False)
        context.load_cert_chain(str(issued.cert), str(issued.key))
    return context


def external(amqps: BraidProcess, common_name: str | None) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1",
        amqps.amqps_port,  # type: ignore[attr-defined]
        credentials=pika.credentials.ExternalCredentials(),
        ssl_options=pika.SSLOptions(client_tls(amqps.ca, common_name), "localhost"),  # type: ignore[attr-defined]
        connection_attempts=1,
    )


def test_external_logs_in_the_certificates_common_name(amqps: BraidProcess) -> None:
    admin = Admin(amqps.http_port)
    admin.user("hal", "unused-password")
    admin.permit("hal", configure="^hal\\.", write="^hal\\.|^$", read="^hal\\.")
    connection = pika.BlockingConnection(external(amqps, "hal"))
    channel = connection.channel()
    channel.queue_declare("hal.q")
    _code, text = refused(lambda: channel.queue_declare("ivy.q"))
    assert text.endswith("refused for user 'hal'")  # acting as the certificate's user
    connection.close()
    # A CN that is no user: refused as a login.
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as error:
        pika.BlockingConnection(external(amqps, "stranger"))
    assert f"(403) '{LOGIN_REFUSED.format('EXTERNAL')}'" in str(error.value)
    assert "user='stranger' mechanism=EXTERNAL reason=bad_credentials" in amqps.stderr()
    # Without a certificate EXTERNAL is not offered; a password still logs in over TLS.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(external(amqps, None))
    plain = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            amqps.amqps_port,  # type: ignore[attr-defined]
            credentials=pika.PlainCredentials("guest", "guest"),
            ssl_options=pika.SSLOptions(client_tls(amqps.ca, None), "localhost"),  # type: ignore[attr-defined]
        )
    )
    plain.close()


async def test_aio_pika_external(amqps: BraidProcess) -> None:
    admin = Admin(amqps.http_port)
    admin.user("ida", "unused-password")
    admin.permit("ida", configure=".*", write=".*", read=".*")
    url = f"amqps://localhost:{amqps.amqps_port}/?auth=external"  # type: ignore[attr-defined]
    connection = await aio_pika.connect(url, ssl_context=client_tls(amqps.ca, "ida"))  # type: ignore[attr-defined]
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("ida.q", auto_delete=True)


def test_amqps_runs_without_the_plain_listener(amqps: BraidProcess) -> None:
    port = amqps.amqps_port  # type: ignore[attr-defined]
    assert f"amqps=127.0.0.1:{port} " in amqps.ready_line + " "
    assert " amqp=- " in amqps.ready_line
