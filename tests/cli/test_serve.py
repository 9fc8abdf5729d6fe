"""``braid serve`` as a real subprocess: ready line, /health, /metrics, signals, config."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from core.log import LogReader

from .conftest import (
    GATEWAY_PORT_FLAGS,
    REPO_ROOT,
    braid_env,
    free_port,
    http_get,
    parse_exposition,
    run_braid,
    start_broker,
    write_log,
)

READY = re.compile(
    r"braid ready: data=(?P<data>\S+) amqp=(?P<amqp>\S+) mqtt=(?P<mqtt>\S+) "
    r"mqtt-ws=(?P<mqtt_ws>\S+) kafka=(?P<kafka>\S+) http=(?P<http>\S+)"
)


def test_ready_line_health_metrics_and_sigterm(tmp_path, brokers):
    facts = write_log(tmp_path / "data")
    broker = start_broker(tmp_path)
    brokers.append(broker)

    match = READY.fullmatch(broker.ready_line)
    assert match, broker.ready_line
    assert match["data"] == str(tmp_path / "data")
    assert match["amqp"] == match["mqtt"] == match["mqtt_ws"] == match["kafka"] == "-"
    # No certificate: the TLS listeners are off, and not in the ready line.
    assert "amqps listener off (no TLS certificate" in broker.stderr
    assert re.fullmatch(r"127\.0\.0\.1:\d+", match["http"])

    status, headers, body = http_get(broker.http_url + "/health")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    health = json.loads(body)
    assert health["status"] == "ok"
    assert health["listeners"]["http"] == match["http"]
    # >=: the broker may write system records (topic definitions...) when it starts.
    assert health["log"]["write_position"] >= facts["end"]

    status, headers, body = http_get(broker.http_url + "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples, helps, types = parse_exposition(body.decode())
    for key in samples:
        family = key.partition("{")[0]
        assert family in helps, family
        assert family in types, family
    assert types["braid_log_appends_total"] == "counter"
    assert types["braid_log_write_position_bytes"] == "gauge"
    assert samples["braid_log_write_position_bytes"] == health["log"]["write_position"]
    assert samples["braid_log_segments"] >= facts["segments"] >= 3
    assert samples['braid_log_queues{kind="user"}'] == 2
    assert samples['braid_log_queues{kind="system"}'] >= 1
    assert samples["braid_log_segment_size_bytes"] == 64 * 1024  # fixed when the dir was made
    assert samples["braid_log_open"] == 1
    assert samples["process_resident_memory_bytes"] > 1_000_000
    assert samples["process_open_fds"] > 0
    # Start-up's objects are frozen out of the garbage collector's full passes.
    assert samples["braid_gc_frozen_objects"] > 10_000

    # The counters move: this scrape counts the previous responses.
    _, _, again = http_get(broker.http_url + "/metrics")
    later, _, _ = parse_exposition(again.decode())
    assert later['braid_http_responses_total{code="200"}'] == 2
    assert later["process_cpu_seconds_total"] >= samples["process_cpu_seconds_total"]

    assert broker.stop(signal.SIGTERM) == 0
    assert broker.extra_stdout == []  # exactly one line on stdout
    assert (tmp_path / "data" / "clean_shutdown").exists()
    assert "stopped" in broker.stderr
    with LogReader(tmp_path / "data") as reader:
        assert reader.verify() == []
        assert reader.queue_bounds("orders", 1) == (0, 150)


def test_sigint_is_a_clean_shutdown(tmp_path, brokers):
    broker = start_broker(tmp_path)
    brokers.append(broker)
    assert http_get(broker.http_url + "/health")[0] == 200
    assert broker.stop(signal.SIGINT) == 0
    assert (tmp_path / "data" / "clean_shutdown").exists()
    assert "Traceback" not in broker.stderr
    assert "SIGINT received" in broker.stderr


def test_recovery_shows_in_metrics(tmp_path, brokers):
    """A writer that died without closing: the server replays its records at open."""
    data_dir = tmp_path / "data"
    crash = textwrap.dedent(
        f"""
        import os
        from core.log import LogConfig, LogStore
        store = LogStore(LogConfig({str(data_dir)!r}, segment_size=65536))
        for number in range(40):
            store.append("sensors", 0, b"reading %d" % number)
        store.commitlog.sync_to(store.commitlog.write_position)
        os._exit(0)  # no close: no checkpoint, no clean-shutdown marker
        """
    )
    subprocess.run([sys.executable, "-c", crash], env=braid_env(), check=True, cwd=REPO_ROOT)
    assert not (data_dir / "clean_shutdown").exists()

    broker = start_broker(tmp_path)
    brokers.append(broker)
    samples, _, _ = parse_exposition(http_get(broker.http_url + "/metrics")[2].decode())
    assert samples["braid_log_recovered_records"] == 40
    assert samples["braid_log_index_entries_total"] >= 40
    assert samples['braid_log_queues{kind="user"}'] == 1
    assert broker.stop() == 0


def test_http_errors_do_not_stop_the_server(tmp_path, brokers):
    broker = start_broker(tmp_path)
    brokers.append(broker)
    status, _, _ = http_get(broker.http_url + "/nope")
    assert status == 404
    status, headers, _ = http_get(broker.http_url + "/health", method="POST")
    assert status == 405
    assert set(headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}

    host, port = broker.listeners["http"].rsplit(":", 1)
    for garbage in (b"garbage\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(garbage)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert re.match(rb"HTTP/1\.[01] 400 ", answer)  # and closed: read to the end
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        sock.shutdown(socket.SHUT_WR)  # half a request, then EOF
        assert sock.recv(4096) == b""

    assert http_get(broker.http_url + "/health")[0] == 200
    samples, _, _ = parse_exposition(http_get(broker.http_url + "/metrics")[2].decode())
    assert samples['braid_http_responses_total{code="400"}'] == 2
    assert samples['braid_http_responses_total{code="404"}'] == 1
    assert samples['braid_http_responses_total{code="405"}'] == 1
    assert broker.stop() == 0


def test_http_port_zero_disables_http(tmp_path, brokers):
    broker = start_broker(tmp_path, http=False)
    brokers.append(broker)
    match = READY.fullmatch(broker.ready_line)
    assert match
    assert match["http"] == "-"
    assert "http listener off" in broker.stderr
    assert broker.stop() == 0
    assert (tmp_path / "data" / "clean_shutdown").exists()


def test_every_listener_is_named_in_the_ready_line(tmp_path, brokers):
    """With every port set: each listener shows its port once implemented, '-' until then."""
    ports = {flag: free_port() for flag in (*GATEWAY_PORT_FLAGS, "--http-port")}
    args = [item for flag, port in ports.items() for item in (flag, str(port))]
    broker = start_broker(tmp_path, *args, gateways_off=False)
    brokers.append(broker)
    listeners = broker.listeners
    for name, flag in zip(
        ("amqp", "mqtt", "mqtt-ws", "kafka", "http"),
        (*GATEWAY_PORT_FLAGS, "--http-port"),
        strict=True,
    ):
        assert listeners[name] in ("-", f"127.0.0.1:{ports[flag]}"), name
    assert listeners["http"] == f"127.0.0.1:{ports['--http-port']}"
    assert broker.stop() == 0


def test_default_data_dir_is_dot_data(tmp_path, brokers):
    port = free_port()
    command = [sys.executable, "-m", "braid", "serve", "--host", "127.0.0.1"]
    command += [item for flag in GATEWAY_PORT_FLAGS for item in (flag, "0")]
    command += ["--http-port", str(port)]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=braid_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("braid ready: data=./data "), line
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert (tmp_path / "data" / "log.json").exists()
    assert (tmp_path / "data" / "clean_shutdown").exists()


def test_config_file_then_flags(tmp_path, brokers):
    file_port = free_port()
    flag_port = free_port()
    config = tmp_path / "braid.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [log]
            data_dir = "{tmp_path / "from-file"}"
            segment_size = 65_536
            durability = "async"
            topic_durability = {{ payments = "sync" }}
            retention_ms = -1

            [listeners]
            host = "127.0.0.1"
            http_port = {file_port}
            amqp_port = 0
            mqtt_port = 0
            mqtt_ws_port = 0
            kafka_port = 0

            [logging]
            level = "debug"
            """
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "braid", "serve", "--config", str(config)],
        cwd=tmp_path,
        env=braid_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().rstrip().endswith(f"http=127.0.0.1:{file_port}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        _, stderr = process.communicate()
    assert "DEBUG" in stderr
    assert json.loads((tmp_path / "from-file" / "log.json").read_text())["segment_size"] == 65536

    # Flags override the file.
    broker = start_broker(
        tmp_path,
        "--config",
        str(config),
        "--http-port",
        str(flag_port),
        "--log-level",
        "warning",
        data_dir=tmp_path / "from-flag",
    )
    brokers.append(broker)
    assert broker.listeners["http"] == f"127.0.0.1:{flag_port}"
    assert broker.listeners["data"] == str(tmp_path / "from-flag")
    assert "INFO" not in broker.stderr
    assert broker.stop() == 0
    assert (tmp_path / "from-flag" / "clean_shutdown").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("[log\n", "invalid TOML"),
        ("[log]\nsegment_sise = 65536\n", "[log] segment_sise: unknown key"),
        ("[log]\ndurability = 'fast'\n", "durability must be one of"),
        ("[log]\nsegment_size = 'big'\n", "[log] segment_size: expected an integer"),
        ("[log]\nflush_interval_ms = 0\n", "flush_interval_ms: must be positive"),
        ("[listeners]\nhttp_port = 70000\n", "[listeners] http_port: a port must be"),
        ("[listeners]\nport = 1\n", "[listeners] port: unknown key"),
        ("[server]\nhost = 'x'\n", "unknown section or key server"),
        ("[logging]\nlevel = 'loud'\n", "[logging] level: log level must be one of"),
    ],
)
def test_bad_config_file_is_a_clear_error(tmp_path, content, message):
    config = tmp_path / "braid.toml"
    if content is not None:
        config.write_text(content)
    result = run_braid(
        "serve", "--config", str(config), "--data-dir", str(tmp_path / "data"), cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"config file {config}" in result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_bad_flags_are_usage_errors(tmp_path):
    result = run_braid("serve", "--http-port", "70000", cwd=tmp_path)
    assert result.returncode == 2
    assert "invalid port" in result.stderr
    result = run_braid(cwd=tmp_path)
    assert result.returncode == 2
    result = run_braid("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("braid ")


def test_port_in_use_fails_cleanly(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = start_broker(tmp_path, "--http-port", str(port), wait=False)
        code = broker.process.wait(30)
    assert code == 1
    assert broker.process.stdout is not None
    assert broker.process.stdout.read() == ""  # never ready
    assert f"cannot listen for http on 127.0.0.1:{port}" in broker.stderr
    assert "Traceback" not in broker.stderr
    assert (tmp_path / "data" / "clean_shutdown").exists()  # the store was closed properly


def test_a_data_dir_serves_one_broker(tmp_path, brokers):
    first = start_broker(tmp_path)
    brokers.append(first)
    second = start_broker(tmp_path, wait=False)
    brokers.append(second)
    assert second.process.wait(30) == 1
    assert f"in use by another braid process (pid {first.process.pid}" in second.stderr
    assert http_get(first.http_url + "/health")[0] == 200
    assert first.stop() == 0
    # Once the first one is gone, the directory is free again.
    third = start_broker(tmp_path)
    brokers.append(third)
    assert third.stop() == 0


def test_console_script_entry_point_is_main():
    """pyproject's ``braid = "braid.cli:main"`` resolves and returns an exit code."""
    from braid.cli import main

    assert main(["log", "stat", str(REPO_ROOT / "no-such-dir")]) == 2


def test_data_dir_path_is_a_file(tmp_path):
    (tmp_path / "data").write_text("not a directory")
    broker = start_broker(tmp_path, wait=False)
    assert broker.process.wait(30) == 1
    assert "cannot use data dir" in broker.stderr
