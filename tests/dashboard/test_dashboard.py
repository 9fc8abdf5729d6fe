"""The web dashboard (issue 20) in a real headless Chromium (Debian's, driven by Playwright)
against ``braid serve`` while pika, paho and kafka-python run a bounded load
(tests/dashboard/load.py): every page loads with no console error and is photographed (into
docs/images/ with BRAID_SCREENSHOTS=docs); the overview's rates move; a queue's depth moves;
purge, delete, re-drive, close connection and delete retained work from the page; the message
browser shows one record as Kafka, AMQP and MQTT see it; a ``monitoring`` user sees but cannot
purge."""

from __future__ import annotations

import http.server
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
import requests
from kafka import KafkaProducer
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from playwright.sync_api import Browser, Page, expect

from tests.braid_process import BraidProcess
from tests.dashboard.conftest import GUEST, WAIT_MS, Dashboard, api, dashboard_of
from tests.dashboard.load import AMQP_QUEUE, KAFKA_GROUP, KAFKA_TOPIC, Load
from tests.management.test_connections import MqttClient

PAGES = (
    "overview",
    "queues",
    "connections",
    "mqtt",
    "groups",
    "pending",
    "dead-letters",
    "browser",
    "access",
)
EVENTS = "dash-events"  # the topic an AMQP exchange, Kafka and MQTT all publish to
DELAY_MS = 600_000
DEAD_LETTERS = 3
DEADLINE_S = 60.0
CHART_SAMPLES_SHOWN = 8


def wait_for(predicate: Any, what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pika_connection(braid: BraidProcess, name: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            credentials=pika.PlainCredentials(*GUEST),
            client_properties={"connection_name": name},
        )
    )


def run_until_closed(connection: pika.BlockingConnection) -> None:
    """Serve the connection's events until the broker closes it (raises) or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)


def mqtt_publish(
    braid: BraidProcess, client_id: str, topic: str, payload: bytes, **kw: Any
) -> None:
    client = MqttClient(braid, client_id)
    client.client.publish(topic, payload, qos=1, **kw).wait_for_publish(30)
    client.close()


def row_of(page: Page, table: str, column: str, text: str) -> Any:
    """The row of ``table`` whose ``column`` cell reads exactly ``text``."""
    cell = page.locator(f'td[data-col="{column}"]', has_text=re.compile(f"^{re.escape(text)}$"))
    return page.locator(f'table[data-table="{table}"] tbody tr', has=cell)


@pytest.fixture(scope="module")
def scene(braid: BraidProcess, load: Load) -> Iterator[None]:
    """Something on every page: dead letters, a delayed record of each kind, an open AMQP
    transaction, retained messages, an offline persistent session, and one record of each
    protocol in one topic (offsets 0: AMQP, 1-3: Kafka, 4: MQTT)."""
    connection = pika_connection(braid, "dash-scene")
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("dash.dlx", "fanout", durable=True)
    channel.queue_declare("dash.dlq", durable=True)
    channel.queue_bind("dash.dlq", "dash.dlx")
    channel.queue_declare(
        "dash.work", durable=True, arguments={"x-dead-letter-exchange": "dash.dlx"}
    )
    for index in range(DEAD_LETTERS):
        channel.basic_publish("", "dash.work", f"job {index}".encode())
    for _ in range(DEAD_LETTERS):
        method, _properties, _body = channel.basic_get("dash.work")
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.exchange_declare(
        "dash.later", "x-delayed-message", arguments={"x-delayed-type": "direct"}
    )
    channel.queue_declare("dash.soon", durable=True)
    channel.queue_bind("dash.soon", "dash.later", "k")
    channel.basic_publish(
        "dash.later", "k", b"later", pika.BasicProperties(headers={"x-delay": DELAY_MS})
    )
    channel.exchange_declare(EVENTS, "topic", durable=True)
    channel.basic_publish(
        EVENTS,
        "room.1",
        b"from amqp",
        pika.BasicProperties(
            content_type="text/plain", correlation_id="c-1", headers={"site": "north"}
        ),
    )
    in_tx = connection.channel()
    in_tx.tx_select()
    in_tx.basic_publish("", "dash.soon", b"not yet committed")

    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap, client_id="dash-scene")
    for index in range(3):
        producer.send(
            EVENTS,
            f"kafka {index}".encode(),
            key=f"room.{index}".encode(),
            headers=[("site", b"south")],
            partition=0,
        )
    producer.send("dash-later", b"k", partition=0, headers=[("x-delay", str(DELAY_MS).encode())])
    producer.flush(30)
    producer.close()

    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("site", "east")]
    properties.ContentType = "application/json"
    mqtt_publish(braid, "dash-scene", f"{EVENTS}/room/9", b'{"t": 1}', properties=properties)
    mqtt_publish(braid, "dash-lamp", "dash/retained/lamp", b"on", retain=True)
    offline = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id="dash-sleeper",
        protocol=mqtt.MQTTv311,
        clean_session=False,
    )
    subscribed = threading.Event()
    offline.on_subscribe = lambda *_args: subscribed.set()
    offline.connect("127.0.0.1", braid.mqtt_port)
    offline.loop_start()
    offline.subscribe("dash/load/#", qos=1)
    assert subscribed.wait(30)
    offline.disconnect()
    offline.loop_stop()
    wait_for(
        lambda: api(braid, "GET", f"braid/records/{EVENTS}/0/4").status_code == 200, "five records"
    )
    yield
    connection.close()


@pytest.fixture
def watcher(browser: Browser, braid: BraidProcess, load: Load) -> Iterator[Dashboard]:
    created = api(braid, "PUT", "users/dash-watcher", {"password": "w", "tags": "monitoring"})
    assert created.status_code in (201, 204), created.text
    yield from dashboard_of(browser, braid, "dash-watcher", "w")


def test_every_page_loads_without_console_errors(admin: Dashboard, scene: None) -> None:
    # What each page shows once the load and the scene are there (for the screenshots).
    shown = {
        "overview": '[data-chart="kafka"] span[data-series="deliver"]:not([data-rate="0"])',
        "queues": 'table[data-table="topics"] td[data-col="lag"]:has-text("dash-readers")',
        "connections": 'td[data-col="client"]:has-text("dash-load-producer")',
        "mqtt": 'table[data-table="retained"] td:has-text("dash/retained/lamp")',
        "groups": f'table[data-table="group-partitions"] td:has-text("{KAFKA_GROUP}")',
        "pending": 'table[data-table="transactions"] tbody tr:not(.empty)',
        "dead-letters": '[data-action="redrive"]',
        "browser": '[data-view="mqtt"] [data-field="mqtt.topic"]',
        "access": 'table[data-table="users"] td:has-text("guest")',
    }
    for name in PAGES:
        admin.open(name, f"topic={EVENTS}&partition=0&offset=4" if name == "browser" else "")
        admin.page.locator(shown[name]).first.wait_for(timeout=WAIT_MS)
        if name == "overview":  # a line worth a picture: some samples in every chart
            admin.page.wait_for_function(
                "(n) => [...document.querySelectorAll('polyline')]"
                ".every((line) => line.getAttribute('points').split(' ').length >= n)",
                arg=CHART_SAMPLES_SHOWN,
                timeout=WAIT_MS,
            )
        admin.screenshot(name)
        admin.assert_clean()
    # The delays of the three kinds are on the pending page too.
    page = admin.open("pending")
    expect(
        page.locator('table[data-table="delays"] td[data-col="queue"]', has_text="dash.soon")
    ).to_be_visible()
    expect(
        page.locator('table[data-table="delays"] td[data-col="queue"]', has_text="dash-later/0")
    ).to_be_visible()
    admin.assert_clean()


def test_overview_rates_move(admin: Dashboard) -> None:
    page = admin.open("overview")
    for protocol in ("amqp", "mqtt", "kafka"):
        for series in ("publish", "deliver"):
            page.wait_for_function(
                "([p, s]) => Number(document.querySelector("
                '`[data-chart="${p}"] span[data-series="${s}"]`).dataset.rate) > 0',
                arg=[protocol, series],
                timeout=WAIT_MS,
            )
    line = page.locator('[data-chart="amqp"] polyline[data-series="publish"]')
    before = line.get_attribute("points")
    page.wait_for_function(
        "(before) => document.querySelector("
        "'[data-chart=\"amqp\"] polyline[data-series=\"publish\"]').getAttribute('points')"
        " !== before",
        arg=before,
        timeout=WAIT_MS,
    )
    assert len((line.get_attribute("points") or "").split()) >= 2
    expect(page.locator('[data-card="connections-Kafka"] .value')).not_to_have_text("0")
    # The topics' append rates too: the Kafka load's partition grows.
    page = admin.open("queues")
    appended = row_of(page, "topics", "topic", KAFKA_TOPIC).locator('td[data-col="rate"]')
    expect(appended).not_to_have_text(re.compile(r"^(-|0\.0/s)$"))
    admin.assert_clean()


def test_queue_depth_moves_then_purge_and_delete(admin: Dashboard, braid: BraidProcess) -> None:
    connection = pika_connection(braid, "dash-depth")
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dash.depth", durable=True)
    page = admin.open("queues")
    row = row_of(page, "queues", "name", "dash.depth")
    ready = row.locator('td[data-col="ready"]')
    expect(ready).to_have_text("0")
    for index in range(7):
        channel.basic_publish("", "dash.depth", f"m{index}".encode())
    expect(ready).to_have_text("7")
    for index in range(5):
        channel.basic_publish("", "dash.depth", f"n{index}".encode())
    expect(ready).to_have_text("12")
    # The load's queue has a consumer: its depth stays near 0 while its consumers show 1.
    expect(
        row_of(page, "queues", "name", AMQP_QUEUE).locator('td[data-col="consumers"]')
    ).to_have_text("1")

    row.locator('[data-action="purge"]').click()
    expect(ready).to_have_text("0")
    expect(page.locator("#banner.done")).to_have_text("purged queue 'dash.depth'")
    assert api(braid, "GET", "queues/%2F/dash.depth").json()["messages"] == 0
    channel.basic_publish("", "dash.depth", b"after the purge")
    expect(ready).to_have_text("1")

    row.locator('[data-action="delete"]').click()
    expect(row).to_have_count(0)
    assert api(braid, "GET", "queues/%2F/dash.depth").status_code == 404
    connection.close()
    admin.assert_clean()


def test_close_connections_from_the_page(admin: Dashboard, braid: BraidProcess) -> None:
    victim = pika_connection(braid, "dash-victim")
    device = MqttClient(braid, "dash-device-5")
    page = admin.open("connections")

    row = row_of(page, "connections-AMQP 0-9-1", "client", "dash-victim")
    row.locator('[data-action="close"]').click()
    # The broker sends Connection.Close; a blocking pika client reads it when served.
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        run_until_closed(victim)
    assert closed.value.reply_code == 320
    assert "Closed from the dashboard by guest" in closed.value.reply_text
    expect(row).to_have_count(0)

    row = row_of(page, "connections-MQTT 5.0", "client", "dash-device-5")
    row.locator('[data-action="close"]').click()
    expect(row).to_have_count(0)
    assert device.disconnected.wait(DEADLINE_S)
    assert device.reason == 0x98  # Administrative action
    admin.assert_clean()


def test_delete_a_retained_message_from_the_page(admin: Dashboard, braid: BraidProcess) -> None:
    mqtt_publish(braid, "dash-door", "dash/retained/door", b"open", retain=True)
    page = admin.open("mqtt")
    row = row_of(page, "retained", "topic", "dash/retained/door")
    expect(row.locator('td[data-col="payload"]')).to_have_text("open")
    row.locator('[data-action="delete"]').click()
    expect(row).to_have_count(0)
    assert api(braid, "GET", "braid/mqtt/retained?filter=dash/retained/door").json() == []
    # A new subscriber is sent no retained message: the first it gets is one published after.
    got: list[bytes] = []
    arrived = threading.Event()
    subscriber = MqttClient(braid, "dash-door-watcher")
    subscriber.client.on_message = lambda _c, _u, m: (got.append(m.payload), arrived.set())
    subscribed = threading.Event()
    subscriber.client.on_subscribe = lambda *_args: subscribed.set()
    subscriber.client.subscribe("dash/retained/door", qos=1)
    assert subscribed.wait(DEADLINE_S)
    mqtt_publish(braid, "dash-door", "dash/retained/door", b"marker")
    assert arrived.wait(DEADLINE_S)
    assert got[0] == b"marker"
    subscriber.close()
    admin.assert_clean()


def test_redrive_dead_letters_from_the_page(
    admin: Dashboard, braid: BraidProcess, scene: None
) -> None:
    page = admin.open("dead-letters")
    row = row_of(page, "dead-letters", "queue", "dash.dlq")
    expect(row.locator('td[data-col="ready"]')).to_have_text(str(DEAD_LETTERS))
    expect(row.locator('td[data-col="from"]')).to_have_text("dash.work")
    row.locator('[data-action="redrive"]').click()
    expect(page.locator("#banner.done")).to_contain_text(f"moved {DEAD_LETTERS} of 'dash.dlq' back")
    expect(row.locator('td[data-col="ready"]')).to_have_text("0")
    connection = pika_connection(braid, "dash-redrive-check")
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get("dash.work", auto_ack=True))[0] is not None:
        bodies.append(got[2])
    assert bodies == [f"job {index}".encode() for index in range(DEAD_LETTERS)]
    connection.close()
    admin.assert_clean()


def test_message_browser_shows_a_record_as_each_protocol_sees_it(
    admin: Dashboard, scene: None
) -> None:
    page = admin.open("browser")
    page.fill('input[name="topic"]', EVENTS)
    page.fill('input[name="partition"]', "0")
    page.fill('input[name="offset"]', "0")
    page.click('[data-action="show"]')
    page.locator(f'[data-record="{EVENTS}/0/0"]').wait_for()

    def field(name: str) -> Any:
        return page.locator(f'[data-field="{name}"]')

    # The AMQP publish.
    expect(field("stored.protocol")).to_have_text("amqp")
    expect(field("amqp.exchange")).to_have_text(EVENTS)
    expect(field("amqp.routing_key")).to_have_text("room.1")
    expect(field("amqp.content_type")).to_have_text("text/plain")
    expect(field("kafka.key")).to_have_text("room.1")
    expect(field("kafka.value")).to_have_text("from amqp")
    expect(field("mqtt.topic")).to_have_text(f"{EVENTS}/room/1")
    expect(field("mqtt.user_properties")).to_contain_text("site=north")
    # The next offset: the first of three Kafka records.
    page.click('[data-action="next"]')
    page.locator(f'[data-record="{EVENTS}/0/1"]').wait_for()
    expect(field("stored.protocol")).to_have_text("kafka")
    expect(field("kafka.key")).to_have_text("room.0")
    expect(field("kafka.headers")).to_have_text("site=south")
    expect(field("amqp.routing_key")).to_have_text("room.0")
    expect(field("mqtt.topic")).to_have_text(f"{EVENTS}/room/0")
    # The MQTT publish, by its address.
    admin.open("browser", f"topic={EVENTS}&partition=0&offset=4")
    page.locator(f'[data-record="{EVENTS}/0/4"]').wait_for()
    expect(field("stored.protocol")).to_have_text("mqtt")
    expect(field("mqtt.topic")).to_have_text(f"{EVENTS}/room/9")
    expect(field("mqtt.content_type")).to_have_text("application/json")
    expect(field("amqp.routing_key")).to_have_text("room.9")
    expect(field("amqp.headers")).to_have_text('{"site":"east"}')
    expect(field("kafka.key")).to_have_text("room.9")
    expect(field("kafka.value")).to_have_text('{"t": 1}')
    admin.assert_clean()


def test_a_monitoring_user_sees_but_cannot_purge(watcher: Dashboard, braid: BraidProcess) -> None:
    connection = pika_connection(braid, "dash-watched")
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dash.watched", durable=True)
    for index in range(4):
        channel.basic_publish("", "dash.watched", f"w{index}".encode())
    page = watcher.open("queues")
    row = row_of(page, "queues", "name", "dash.watched")
    expect(row.locator('td[data-col="ready"]')).to_have_text("4")
    expect(page.locator('table[data-table="topics"]')).to_be_visible()
    assert page.locator('[data-action="purge"], [data-action="delete"]').count() == 0
    watcher.screenshot("monitoring-queues")
    # The API refuses it too (RabbitMQ's rule: no access to the vhost), and nothing moved.
    refused = api(braid, "DELETE", "queues/%2F/dash.watched/contents", auth=("dash-watcher", "w"))
    assert refused.status_code == 401, refused.text
    assert api(braid, "GET", "queues/%2F/dash.watched").json()["messages"] == 4
    page = watcher.open("dead-letters")
    assert page.locator('[data-action="redrive"]').count() == 0
    page = watcher.open("connections")
    expect(page.locator('td[data-col="client"]', has_text="dash-watched")).to_be_visible()
    assert page.locator('[data-action="close"]').count() == 0
    for name in ("browser", "access"):
        page = watcher.open(name)
        expect(page.locator("[data-needs]")).to_be_visible()
    connection.close()
    watcher.assert_clean()


def test_the_page_needs_a_login(braid: BraidProcess) -> None:
    url = f"http://127.0.0.1:{braid.http_port}/"
    anonymous = requests.get(url, timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"] == 'Basic realm="BraidMQ"'
    page = requests.get(url, auth=GUEST, timeout=30)
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["Content-Security-Policy"]
    module = requests.get(url + "dashboard/app.js", auth=GUEST, timeout=30)
    assert module.headers["Content-Type"].startswith("text/javascript")
    assert requests.get(url + "dashboard/nothing.js", auth=GUEST, timeout=30).status_code == 404
    assert requests.get(url + "dashboard/app.js", timeout=30).status_code == 401


def dead_letters(braid: BraidProcess, prefix: str, count: int) -> None:
    """``count`` dead letters in ``{prefix}.dlq``, rejected from ``{prefix}.work``."""
    connection = pika_connection(braid, f"{prefix}-setup")
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare(f"{prefix}.dlx", "fanout", durable=True)
    channel.queue_declare(f"{prefix}.dlq", durable=True)
    channel.queue_bind(f"{prefix}.dlq", f"{prefix}.dlx")
    arguments = {"x-dead-letter-exchange": f"{prefix}.dlx"}
    channel.queue_declare(f"{prefix}.work", durable=True, arguments=arguments)
    for index in range(count):
        channel.basic_publish("", f"{prefix}.work", f"job {index}".encode())
    for _ in range(count):
        method, _properties, _body = channel.basic_get(f"{prefix}.work")
        channel.basic_reject(method.delivery_tag, requeue=False)
    connection.close()


class AttackerSite:
    """Another web site on another port: a page whose form, submitted by its script, POSTs
    JSON as ``text/plain`` (no CORS preflight) to ``target``."""

    def __init__(self, target: str) -> None:
        page = (
            f'<form id="f" method="POST" enctype="text/plain" action="{target}">'
            '<input name=\'{"count": 5, "pad": "\' value=\'"}\'></form>'
            '<script>document.getElementById("f").submit()</script>'
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_another_site_cannot_act_with_the_remembered_login(
    browser: Browser, braid: BraidProcess, load: Load
) -> None:
    dead_letters(braid, "dash.csrf", 2)
    redrive = f"http://127.0.0.1:{braid.http_port}/api/braid/dead-letters/%2F/dash.csrf.dlq/redrive"
    attacker = AttackerSite(redrive)
    # A browser logged in to the dashboard sends its credentials with every request to it.
    context = browser.new_context(
        http_credentials={"username": "guest", "password": "guest", "send": "always"}
    )
    try:
        page = context.new_page()
        page.goto(attacker.url)
        page.wait_for_url(redrive)
        assert "cross-site request refused" in page.inner_text("body")
    finally:
        context.close()
        attacker.close()
    (listed,) = [
        q for q in api(braid, "GET", "braid/dead-letters").json() if q["queue"] == "dash.csrf.dlq"
    ]
    assert listed["messages_ready"] == 2
    assert "refused a cross-site POST /api/braid/dead-letters" in braid.stderr()
    # Not a browser (no Origin, no Sec-Fetch-Site), or the page itself: served.
    own = {"Origin": f"http://127.0.0.1:{braid.http_port}", "Sec-Fetch-Site": "same-origin"}
    moved = requests.post(redrive, json={"count": 1}, auth=GUEST, headers=own, timeout=30)
    assert moved.json()["moved"] == 1
    assert api(braid, "POST", "braid/dead-letters/%2F/dash.csrf.dlq/redrive").json()["moved"] == 1
    elsewhere = {"Origin": "http://127.0.0.1:1"}
    refused = requests.post(redrive, json={}, auth=GUEST, headers=elsewhere, timeout=30)
    assert refused.status_code == 403
    assert refused.json() == {"error": "forbidden", "reason": "cross-site request refused"}
