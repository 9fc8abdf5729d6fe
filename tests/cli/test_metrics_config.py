"""braid/metrics.py (exposition, registry, store gauges) and braid/config.py (settings)."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path

import pytest

from braid import config
from braid.metrics import (
    MetricsRegistry,
    escape_label_value,
    format_value,
    process_collector,
    store_collector,
)
from core.log import LogConfig, LogStore

from .conftest import parse_exposition

# -- metrics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3, "3"),
        (True, "1"),
        (0.5, "0.5"),
        (math.nan, "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
    ],
)
def test_format_value(value, text):
    assert format_value(value) == text


def test_render_families_labels_and_escaping():
    registry = MetricsRegistry()
    registry.register(
        "test",
        lambda: [
            ("demo_total", "counter", 'Help with a \\ and a\nnewline "quoted".', 5),
            ("demo_gauge", "gauge", "Labelled.", [({"a": 'x"y\\z\n'}, 1.5), ({}, 2)]),
        ],
    )
    text = registry.render()
    assert text.endswith("\n")
    assert '# HELP demo_total Help with a \\\\ and a\\nnewline "quoted".\n' in text
    assert "# TYPE demo_total counter\ndemo_total 5\n" in text
    assert 'demo_gauge{a="x\\"y\\\\z\\n"} 1.5\ndemo_gauge 2\n' in text
    assert escape_label_value('"') == '\\"'
    samples, helps, types = parse_exposition(text)
    assert types == {
        "braid_metrics_collector_errors_total": "counter",
        "demo_total": "counter",
        "demo_gauge": "gauge",
    }
    assert samples["braid_metrics_collector_errors_total"] == 0
    assert set(helps) == set(types)


def test_a_failing_collector_is_counted_not_fatal():
    registry = MetricsRegistry()

    def broken():
        raise RuntimeError("bug")

    registry.register("broken", broken)
    registry.register("bad-name", lambda: [("bad name", "gauge", "x", 1)])
    registry.register("bad-kind", lambda: [("fine", "histogram", "x", 1)])
    registry.register("bad-label", lambda: [("fine", "gauge", "x", [({"__x": "y"}, 1)])])
    registry.register("good", lambda: [("good", "gauge", "Still here.", 1)])
    samples, _, _ = parse_exposition(registry.render())
    assert samples["good"] == 1
    assert samples["braid_metrics_collector_errors_total"] == 4
    assert "fine" not in samples


def test_same_family_from_two_collectors_is_merged():
    registry = MetricsRegistry()
    registry.register("one", lambda: [("shared", "gauge", "Shared.", [({"node": "a"}, 1)])])
    registry.register("two", lambda: [("shared", "gauge", "Shared.", [({"node": "b"}, 2)])])
    registry.register("three", lambda: [("shared", "counter", "Clash.", 3)])
    text = registry.render()
    assert text.count("# TYPE shared gauge") == 1
    samples, _, _ = parse_exposition(text)
    assert samples['shared{node="a"}'] == 1
    assert samples['shared{node="b"}'] == 2
    assert samples["braid_metrics_collector_errors_total"] == 1


def test_register_counters():
    counters = {"frames_in": 3}
    registry = MetricsRegistry()
    registry.register_counters("braid_amqp_", lambda: counters, {"frames_in": "Frames read."})
    counters["frames_in"] = 4
    text = registry.render()
    assert "# HELP braid_amqp_frames_in_total Frames read.\n" in text
    assert "# TYPE braid_amqp_frames_in_total counter\nbraid_amqp_frames_in_total 4\n" in text


def test_store_metrics_move_with_appends(tmp_path):
    store = LogStore(LogConfig(tmp_path / "data", segment_size=64 * 1024))
    registry = MetricsRegistry()
    registry.register("log", store_collector(store))
    before, _, types = parse_exposition(registry.render())
    assert types["braid_log_appends_total"] == "counter"
    assert types["braid_log_recovered_records"] == "gauge"
    for number in range(200):
        store.append("t", number % 3, b"x" * 1000)
    store.append("__acks", 0, b"cursor")
    after, _, _ = parse_exposition(registry.render())
    assert after["braid_log_appends_total"] == before["braid_log_appends_total"] + 201
    assert after["braid_log_appended_bytes_total"] > 200_000
    assert after["braid_log_index_entries_total"] == 201
    assert after["braid_log_write_position_bytes"] == store.commitlog.write_position
    assert after["braid_log_segments"] >= 4
    assert after['braid_log_queues{kind="user"}'] == 3
    assert after['braid_log_queues{kind="system"}'] == 1
    assert after["braid_log_open"] == 1
    store.close()
    closed, _, _ = parse_exposition(registry.render())
    assert closed["braid_log_open"] == 0


def test_process_metrics():
    samples, _, types = parse_exposition(MetricsRegistry().render())
    assert "process_resident_memory_bytes" not in samples  # only when registered
    registry = MetricsRegistry()
    registry.register("process", process_collector)
    samples, _, types = parse_exposition(registry.render())
    assert samples["process_resident_memory_bytes"] > 0
    assert samples["process_virtual_memory_bytes"] >= samples["process_resident_memory_bytes"]
    assert 0 < samples["process_start_time_seconds"] < 2**34
    assert types["process_cpu_seconds_total"] == "counter"


# -- config ----------------------------------------------------------------------------------


def test_defaults():
    settings = config.ServerSettings()
    assert settings.data_dir == "./data"
    assert settings.listeners == config.ListenerSettings("0.0.0.0", 5672, 1883, 8083, 9092, 8080)
    log_config = settings.log_config()
    assert log_config.data_dir == Path("data")
    assert log_config == LogConfig(Path("./data"))


def test_every_log_config_field_is_configurable():
    fields = config.configurable_log_fields()
    assert "data_dir" not in fields
    for name in ("segment_size", "durability", "topic_durability", "retention_ms"):
        assert name in fields
    assert set(config.log_field_defaults()) == set(fields)


def test_file_values():
    settings = config.settings_from_mapping(
        {
            "log": {
                "data_dir": "/srv/braid",
                "segment_size": 1 << 20,
                "durability": "async",
                "topic_durability": {"payments": "sync"},
                "retention_ms": -1,
                "retention_bytes": 10_000_000,
            },
            "listeners": {"host": "127.0.0.1", "kafka_port": 0},
            "logging": {"level": "DEBUG"},
        },
        "test",
    )
    assert settings.data_dir == "/srv/braid"
    assert settings.log_level == "debug"
    assert settings.listeners.host == "127.0.0.1"
    assert settings.listeners.kafka_port == 0
    assert settings.listeners.amqp_port == 5672
    log_config = settings.log_config()
    assert log_config.segment_size == 1 << 20
    assert log_config.durability_for("payments") == "sync"
    assert log_config.durability_for("other") == "async"
    assert log_config.retention_ms is None
    assert log_config.retention_bytes == 10_000_000


def test_flags_override_file():
    from_file = config.settings_from_mapping(
        {"log": {"data_dir": "a"}, "listeners": {"http_port": 1, "host": "h"}}, "test"
    )
    settings = config.override(
        from_file, data_dir="b", log_level=None, listeners={"http_port": 2, "host": None}
    )
    assert settings.data_dir == "b"
    assert settings.listeners.http_port == 2
    assert settings.listeners.host == "h"
    assert settings.log_level == "info"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"log": {"segment_size": True}}, "expected an integer"),
        ({"log": {"segment_size": -5}}, "must not be negative"),
        ({"log": {"segment_size": 100}}, "segment_size must be at least"),
        ({"log": {"retention_ms": "7d"}}, "expected an integer"),
        ({"log": {"topic_durability": {"t": "maybe"}}}, "durability must be one of"),
        ({"log": {"topic_durability": "sync"}}, "expected a table"),
        ({"log": {"data_dir": ""}}, "non-empty path"),
        ({"log": {"checkpoint_interval_ms": 0}}, "must be positive"),
        ({"log": "x"}, "[log] must be a table"),
        ({"listeners": {"amqp_port": "5672"}}, "a port must be"),
        ({"listeners": {"host": 1}}, "host name or address"),
    ],
)
def test_bad_values(raw, message):
    with pytest.raises(config.ConfigError, match=r"^test: ") as caught:
        config.settings_from_mapping(raw, "test")
    assert message in str(caught.value)


def test_read_config_file_errors(tmp_path):
    with pytest.raises(config.ConfigError, match="not found"):
        config.read_config_file(str(tmp_path / "missing.toml"))
    with pytest.raises(config.ConfigError, match="is a directory"):
        config.read_config_file(str(tmp_path))
    (tmp_path / "bad.toml").write_bytes(b"a = \xff\n")
    with pytest.raises(config.ConfigError, match=r"config file .*bad\.toml"):
        config.read_config_file(str(tmp_path / "bad.toml"))


def test_broker_section():
    settings = config.settings_from_mapping(
        {"broker": {"auto_create_topics": False, "num_partitions": 4}}, "test"
    )
    broker_config = settings.broker_config()
    assert broker_config.auto_create_topics is False
    assert broker_config.num_partitions == 4
    with pytest.raises(config.ConfigError, match="expected true or false"):
        config.settings_from_mapping({"broker": {"auto_create_topics": 1}}, "test")
    with pytest.raises(config.ConfigError, match=r"\[broker\] nope: unknown key"):
        config.settings_from_mapping({"broker": {"nope": 1}}, "test")


# -- docs/configuration.md stays complete and right --------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_docs_name_every_flag_and_key(capsys):
    from braid.cli import main

    text = DOCS.read_text()
    assert main(["serve", "--help"]) == 0
    flags = set(re.findall(r"--[a-z][a-z-]+", capsys.readouterr().out))
    assert "--http-port" in flags
    for flag in flags:
        if flag != "--help":
            assert f"`{flag}" in text, flag
    keys = [
        *config.configurable_log_fields(),
        *config.configurable_broker_fields(),
        *(f.name for f in dataclasses.fields(config.ListenerSettings)),
        "data_dir",
        "level",
    ]
    for key in keys:
        assert f"| `{key}` |" in text, key
        assert re.search(rf"^{key} = ", text, re.MULTILINE), key


def test_the_documented_example_file_is_the_defaults():
    example = re.search(r"```toml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert example
    settings = config.settings_from_mapping(tomllib.loads(example[1]), "docs")
    defaults = config.ServerSettings()
    assert settings.log_config() == defaults.log_config()
    assert settings.broker_config() == defaults.broker_config()
    assert settings.listeners == defaults.listeners
    assert settings.log_level == defaults.log_level
    assert settings.data_dir == defaults.data_dir
