"""No plaintext password anywhere (issue 18): users made over the HTTP API and with ``braid
user``, logins with every mechanism (AMQP PLAIN and AMQPLAIN, MQTT password, Kafka SASL PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512, HTTP Basic), wrong passwords among them, passwords changed
both ways, a restart and logins after it, all with ``--log-level debug``; then no password used,
right or wrong, is in any file of the data directory (its bytes, binary-safe) or in what the
broker wrote to stdout and stderr.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import amqp
import amqp.exceptions
import paho.mqtt.client as mqtt
import pika
import pika.exceptions
from confluent_kafka import KafkaError, Producer
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from tests.braid_process import REPO_ROOT, BraidProcess
from tests.security.http_admin import Admin

DEADLINE_S = 30.0
KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def secret(label: str) -> str:
    # Random, so that finding it anywhere can only mean it was written there.
    return f"{label}-{uuid.uuid4().hex}"


class Passwords:
    """Every password the test sends, right or wrong."""

    def __init__(self) -> None:
        self.used: list[str] = []
        self.basic_tokens: list[bytes] = []  # HTTP Basic's base64 of user:password

    def new(self, label: str) -> str:
        password = secret(label)
        self.used.append(password)
        return password


def put_user(braid: BraidProcess, name: str, password: str) -> None:
    """Make or change a user over the HTTP API as guest; the management tag lets it log in to
    the HTTP API too (RabbitMQ's rule: a user without a tag may not)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{braid.http_port}/api/users/{name}",
        method="PUT",
        data=json.dumps({"password": password, "tags": "management"}).encode(),
        headers={
            "authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "content-type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
        assert response.status < 300


def braid_cli(braid: BraidProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``braid user ...`` against the running broker, as guest, the password on stdin."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["BRAID_URL"] = f"http://127.0.0.1:{braid.http_port}"
    env["BRAID_ADMIN_USER"], env["BRAID_ADMIN_PASSWORD"] = "guest", "guest"
    return subprocess.run(
        [sys.executable, "-m", "braid", *args],
        cwd=REPO_ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- a login on each protocol: True when it was let in, False when refused -------------------


def amqp_plain(braid: BraidProcess, user: str, password: str) -> bool:
    parameters = pika.ConnectionParameters(
        "127.0.0.1",
        braid.amqp_port,
        credentials=pika.PlainCredentials(user, password),
        connection_attempts=1,
    )
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.ProbableAuthenticationError:
        return False
    connection.close()
    return True


def amqp_amqplain(braid: BraidProcess, user: str, password: str) -> bool:
    connection = amqp.Connection(
        f"127.0.0.1:{braid.amqp_port}", userid=user, password=password, login_method="AMQPLAIN"
    )
    try:
        connection.connect()
    except amqp.exceptions.AccessRefused:
        return False
    connection.close()
    return True


def mqtt_login(braid: BraidProcess, user: str, password: str) -> bool:
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=f"np-{uuid.uuid4().hex[:8]}", protocol=mqtt.MQTTv5
    )
    client.username_pw_set(user, password)
    answered: list[ReasonCode] = []
    done = threading.Event()

    def on_connect(_c: Any, _u: Any, _flags: Any, reason: ReasonCode, _p: Any) -> None:
        answered.append(reason)
        done.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *_args: done.set()
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    try:
        assert done.wait(DEADLINE_S), "no CONNACK"
        assert answered, "closed without a CONNACK"
        assert answered[0].value in (0x00, 0x86), answered[0]
        return answered[0].value == 0x00
    finally:
        client.disconnect()
        client.loop_stop()


def kafka_login(braid: BraidProcess, mechanism: str, user: str, password: str) -> bool:
    """Produce one record with SASL ``mechanism``: True when stored, False when the login was
    refused."""
    errors: list[KafkaError] = []
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "message.timeout.ms": int(DEADLINE_S * 1000),
            "error_cb": errors.append,
        }
    )
    producer.produce("no-plaintext", b"v", on_delivery=lambda e, _m: reports.append(e))
    deadline = time.monotonic() + DEADLINE_S
    while not reports and not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, f"neither delivery nor refusal: {errors}"
        producer.poll(0.1)
    if reports:
        assert reports[0] is None, reports
        return True
    producer.purge()
    producer.flush(0)
    return False


def http_basic(braid: BraidProcess, passwords: Passwords, user: str, password: str) -> bool:
    token = base64.b64encode(f"{user}:{password}".encode())
    passwords.basic_tokens.append(token)
    request = urllib.request.Request(
        f"http://127.0.0.1:{braid.http_port}/api/whoami",
        headers={"authorization": "Basic " + token.decode()},
    )
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            status = int(response.status)
    except urllib.error.HTTPError as error:
        status = error.code
    assert status in (200, 401), status
    return status == 200


def every_login(braid: BraidProcess, passwords: Passwords, user: str, password: str) -> None:
    """``user`` logs in with ``password`` on every protocol and mechanism, and is refused a
    wrong password on each."""
    wrong = passwords.new("wrong")
    for right, expected in ((password, True), (wrong, False)):
        assert amqp_plain(braid, user, right) is expected
        assert amqp_amqplain(braid, user, right) is expected
        assert mqtt_login(braid, user, right) is expected
        for mechanism in KAFKA_MECHANISMS:
            assert kafka_login(braid, mechanism, user, right) is expected, mechanism
        assert http_basic(braid, passwords, user, right) is expected


def stdout_of(braid: BraidProcess) -> str:
    """What the stopped broker wrote to stdout after its ready line."""
    assert braid.process is not None
    assert braid.process.stdout is not None
    return braid.process.stdout.read()


def test_no_password_is_written_in_the_data_directory_or_the_output(tmp_path: Path) -> None:
    passwords = Passwords()
    braid = BraidProcess(tmp_path, extra_args=("--log-level", "debug"))
    outputs: list[str] = []
    with braid:
        admin = Admin(braid.http_port)
        # alice over the HTTP API, bob with the CLI.
        alice = passwords.new("alice")
        put_user(braid, "alice", alice)
        bob = passwords.new("bob")
        added = braid_cli(
            braid,
            "user",
            "add",
            "bob",
            "--tags",
            "management",
            "--password-stdin",
            stdin=bob + "\n",
        )
        assert added.returncode == 0, added.stderr
        for name in ("alice", "bob"):
            admin.permit(name, configure=".*", write=".*", read=".*")
        every_login(braid, passwords, "alice", alice)
        every_login(braid, passwords, "bob", bob)

        # New passwords, both ways: the old ones are refused, the new ones (and the SCRAM
        # credentials made from them) let in.
        old_alice, alice = alice, passwords.new("alice-changed")
        put_user(braid, "alice", alice)
        old_bob, bob = bob, passwords.new("bob-changed")
        changed = braid_cli(braid, "user", "passwd", "bob", "--password-stdin", stdin=bob + "\n")
        assert changed.returncode == 0, changed.stderr
        assert not amqp_plain(braid, "alice", old_alice)
        assert not kafka_login(braid, "SCRAM-SHA-512", "bob", old_bob)
        every_login(braid, passwords, "alice", alice)

        assert braid.stop() == 0
        outputs.append(stdout_of(braid))
        braid.start()
        # After the restart, from what the log kept.
        every_login(braid, passwords, "bob", bob)
        assert amqp_plain(braid, "alice", alice)
        assert braid.stop() == 0
        outputs.append(stdout_of(braid))

    stderr = braid.stderr()
    assert "login failed" in stderr  # the wrong passwords were logged (without themselves)
    written = {"stdout": "".join(outputs).encode(), "stderr": stderr.encode()}
    files = [path for path in braid.data_dir.rglob("*") if path.is_file()]
    assert files, "no data directory files"
    for path in files:
        written[str(path)] = path.read_bytes()
    needles = [p.encode() for p in passwords.used] + passwords.basic_tokens
    assert len(needles) >= 16  # 8 passwords (4 wrong), 8 HTTP Basic tokens
    found = [
        (needle.decode(), where)
        for where, content in written.items()
        for needle in needles
        if content.find(needle) >= 0
    ]
    assert found == [], found
