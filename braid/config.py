"""Settings of ``braid serve``: embedded defaults, overridden by a TOML file, overridden by flags.

Config file layout (every key optional; docs/configuration.md lists them all)::

    [log]          data_dir, and any field of core.log.LogConfig (segment_size, durability,
                   topic_durability, retention_ms, retention_bytes, ...)
    [broker]       any field of core.broker.BrokerConfig (auto_create_topics, num_partitions, ...)
    [listeners]    host, amqp_port, mqtt_port, mqtt_ws_port, kafka_port, http_port (0: off),
                   kafka_advertised_host, kafka_advertised_port
    [logging]      level
    [amqp]         vhosts, users (``[amqp.users.NAME]`` tables: password, vhosts)
    [mqtt]         the MQTT gateway's settings (MQTT_SETTINGS: receive_maximum, max_keepalive,
                   shared_subscription_strategy, ...)
    [kafka]        group_tag_filters (``[kafka.group_tag_filters]``: "group id" = "TagA || TagB")
    [auth]         any field of core.security.SecurityConfig (anonymous, loopback_users, ...)
    [tls]          cert_file, key_file, ca_file, verify_peer, fail_if_no_peer_cert
    [limits]       any field of core.limits.LimitsConfig (max_connections, max_message_size, ...)
    [cluster]      url, node_id, advertised_host, secret, workers, shards, and any field of
                   core.cluster.settings.ClusterSettings (lease_ms, heartbeat_ms, expect_nodes,
                   cluster_port, kafka_worker_port_base, ...): a node of a cluster, or with
                   workers > 1 a supervisor of that many (docs/cluster.md sections 9 and 13)

Unknown sections and keys are errors, so a typo is reported instead of silently ignored. The
[log] and [broker] keys are the fields of those dataclasses, so a field added there is
configurable here at once. For an optional limit (``retention_ms``, ``retention_bytes``,
``memory_high_watermark_bytes``...), ``-1`` means "no limit", as Kafka's ``retention.ms = -1``
does (TOML has no null).

Pure functions and frozen dataclasses; no I/O except reading the config file.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from braid.tls import TlsConfigError, TlsSettings
from core.broker import BrokerConfig
from core.cluster.settings import ClusterSettings
from core.limits import LimitsConfig
from core.log import LogConfig
from core.security import SecurityConfig

DEFAULT_DATA_DIR = "./data"
# Listen on every interface, as RabbitMQ, Mosquitto and Kafka do by default.
DEFAULT_HOST = "0.0.0.0"
# The IANA / de-facto ports of each protocol: AMQP 5672, MQTT 1883, Kafka 9092; 8083 is EMQX's
# MQTT-over-WebSocket port; 8080 the usual HTTP operations port.
DEFAULT_AMQP_PORT = 5672
DEFAULT_MQTT_PORT = 1883
DEFAULT_MQTT_WS_PORT = 8083
DEFAULT_KAFKA_PORT = 9092
DEFAULT_HTTP_PORT = 8080
# The TLS ports: IANA's amqps 5671 and secure-mqtt 8883, EMQX's wss 8084, Kafka's customary SSL
# listener 9093, RabbitMQ's management TLS port 15671. On when a certificate is configured.
DEFAULT_AMQPS_PORT = 5671
DEFAULT_MQTTS_PORT = 8883
DEFAULT_MQTT_WSS_PORT = 8084
DEFAULT_KAFKA_TLS_PORT = 9093
DEFAULT_HTTPS_PORT = 15671
DEFAULT_LOG_LEVEL = "info"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
MAX_PORT = 65_535
# The running broker's pid, in the data dir. The lock itself is an flock on the directory (see
# braid/server.py), as Kafka's ``.lock``: a second broker would recover (truncate) a live log.
LOCK_FILE = "braid.lock"
# An optional LogConfig limit set to this in the file means None (no limit); Kafka's convention.
UNLIMITED = -1

# LogConfig fields that are not settable from the [log] section (data_dir has its own key).
_LOG_FIELDS_NOT_CONFIGURABLE = frozenset({"data_dir"})
SECTIONS = (
    "log",
    "broker",
    "listeners",
    "logging",
    "amqp",
    "kafka",
    "mqtt",
    "auth",
    "tls",
    "limits",
    "cluster",
)
# Kafka's broker.id is an int32 and a node id is its Kafka broker id (docs/cluster.md section 8).
MAX_NODE_ID = 2**31 - 1
# The [cluster] keys that are not ClusterSettings fields.
CLUSTER_NODE_KEYS = ("url", "node_id", "advertised_host", "secret")
# The [cluster] keys of `braid serve --workers N` (braid/workers.py), integers; with the
# --supervised flag, which only the supervisor passes (to each worker it starts).
CLUSTER_WORKER_KEYS = ("workers", "shards")
# AMQP virtual hosts: "/" or 1-64 of these characters, as gateway/amqp/vhost.py requires (the
# name becomes part of topic names: amq.vhost.<name>.<exchange>); "*" in a user's vhosts: all.
AMQP_DEFAULT_VHOST = "/"
AMQP_VHOST_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
AMQP_ANY_VHOST = "*"


# The [mqtt] keys: gateway/mqtt/options.py:MqttOptions fields of the same names, which hold the
# defaults (this module imports no gateway: braid/server.py alone knows them; a test holds the two
# to each other). Type, and the range an integer must be in (None: any non-negative).
MQTT_SETTINGS: dict[str, tuple[object, tuple[int, int] | None]] = {
    "use_identity_as_username": (bool, None),
    "max_packet_size": (int, (1, 268_435_455)),  # the largest MQTT packet (5.0 §2.1.4)
    "receive_maximum": (int, (1, 65_535)),  # 0 is a Protocol Error (5.0 §3.2.2.3.3)
    "topic_alias_maximum": (int, (0, 65_535)),
    "max_keepalive": (int, (0, 65_535)),  # Mosquitto's; 0: as the client asks
    "max_session_expiry": (int | None, (0, 0xFFFF_FFFF)),  # -1: as the client asks
    "max_queued_messages": (int, None),
    "connect_timeout_s": (float, None),
    "shared_subscription_strategy": (str, None),
    "sys_interval": (float, None),  # seconds between $SYS updates (Mosquitto's); 0: off
}
# EMQX's names (gateway/mqtt/options.py: SHARED_SUBSCRIPTION_STRATEGIES).
MQTT_SHARED_SUBSCRIPTION_STRATEGIES = ("round_robin", "random", "sticky", "hash_clientid")


class ConfigError(Exception):
    """A setting is wrong; the message says where (file, section, key) and why."""


@dataclass(frozen=True)
class ListenerSettings:
    host: str = DEFAULT_HOST
    amqp_port: int = DEFAULT_AMQP_PORT
    mqtt_port: int = DEFAULT_MQTT_PORT
    mqtt_ws_port: int = DEFAULT_MQTT_WS_PORT
    kafka_port: int = DEFAULT_KAFKA_PORT
    http_port: int = DEFAULT_HTTP_PORT
    # What Kafka clients are told to connect to (Kafka's advertised.listeners); None: the
    # address each client connected to.
    kafka_advertised_host: str | None = None
    kafka_advertised_port: int | None = None
    # TLS listeners (on when [tls] has a certificate; 0: off).
    amqps_port: int = DEFAULT_AMQPS_PORT
    mqtts_port: int = DEFAULT_MQTTS_PORT
    mqtt_wss_port: int = DEFAULT_MQTT_WSS_PORT
    kafka_tls_port: int = DEFAULT_KAFKA_TLS_PORT
    https_port: int = DEFAULT_HTTPS_PORT


@dataclass(frozen=True)
class AmqpUser:
    password: str
    vhosts: tuple[str, ...] = (AMQP_DEFAULT_VHOST,)  # the vhosts it may open ("*": all)


def default_amqp_users() -> dict[str, AmqpUser]:
    return {"guest": AmqpUser("guest")}  # RabbitMQ's default user, allowed on "/"


@dataclass(frozen=True)
class AmqpSettings:
    vhosts: tuple[str, ...] = (AMQP_DEFAULT_VHOST,)
    users: Mapping[str, AmqpUser] = field(default_factory=default_amqp_users)


@dataclass(frozen=True)
class ClusterNodeSettings:
    """``[cluster]`` and its flags: what makes ``braid serve`` a node of a cluster
    (docs/cluster.md sections 9 and 13). ``url`` None: a single node (the rest is unused)."""

    url: str | None = None  # the cluster's Redis: redis://, rediss://, unix://, redis+sentinel://
    node_id: int | None = None  # this node's id, also its Kafka broker id
    # What other nodes and clients are told to connect to (None: the listeners' host, or this
    # machine's name when they listen on every interface).
    advertised_host: str | None = None
    # The shared secret of the gRPC calls between nodes (None: the cluster id, see
    # docs/configuration.md: enough on loopback, not across machines).
    secret: str | None = None
    # Keyword arguments for ClusterSettings, already type-checked.
    options: Mapping[str, object] = field(default_factory=dict)
    # `--workers N`: more than 1 runs a supervisor of N worker processes (braid/workers.py).
    workers: int = 1
    # `--shards N`: the shard count of a data root the supervisor creates (None: 16).
    shards: int | None = None
    # `--supervised`: this process is worker node_id of a supervisor (set by the supervisor):
    # its shared listeners bind with SO_REUSEPORT, and it also listens on its own Kafka port.
    supervised: bool = False

    @property
    def enabled(self) -> bool:
        return self.url is not None

    @property
    def supervisor(self) -> bool:
        """Whether ``braid serve`` runs the supervisor of ``workers`` processes."""
        return self.workers > 1 and not self.supervised

    def settings(self) -> ClusterSettings:
        return ClusterSettings(**self.options)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ServerSettings:
    data_dir: str = DEFAULT_DATA_DIR
    log_level: str = DEFAULT_LOG_LEVEL
    listeners: ListenerSettings = field(default_factory=ListenerSettings)
    # Keyword arguments for LogConfig besides data_dir, already type-checked.
    log_options: Mapping[str, object] = field(default_factory=dict)
    # Keyword arguments for BrokerConfig, already type-checked.
    broker_options: Mapping[str, object] = field(default_factory=dict)
    amqp: AmqpSettings = field(default_factory=AmqpSettings)
    # [kafka.group_tag_filters]: consumer group id -> tag filter expression.
    kafka_group_tag_filters: Mapping[str, str] = field(default_factory=dict)
    # [mqtt]: keyword arguments for gateway/mqtt's MqttOptions, already checked.
    mqtt_options: Mapping[str, object] = field(default_factory=dict)
    # [auth]: logins, anonymous access, the login slow-down (core/security/config.py).
    auth: SecurityConfig = field(default_factory=SecurityConfig)
    # [tls]: the certificate every TLS listener serves (braid/tls.py).
    tls: TlsSettings = field(default_factory=TlsSettings)
    # [limits]: counts and sizes, for every protocol (core/limits/config.py).
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # [cluster]: a node of a cluster on a data root (docs/cluster.md); off by default.
    cluster: ClusterNodeSettings = field(default_factory=ClusterNodeSettings)

    def log_config(self) -> LogConfig:
        return LogConfig(Path(self.data_dir), **self.log_options)  # type: ignore[arg-type]

    def broker_config(self) -> BrokerConfig:
        return BrokerConfig(**self.broker_options)  # type: ignore[arg-type]


def configurable_fields(cls: type, skip: frozenset[str] = frozenset()) -> dict[str, object]:
    """``{field name: type hint}`` of a settings dataclass, as a config section accepts them."""
    hints = typing.get_type_hints(cls)
    return {
        item.name: hints[item.name] for item in dataclasses.fields(cls) if item.name not in skip
    }


def configurable_log_fields() -> dict[str, object]:
    return configurable_fields(LogConfig, _LOG_FIELDS_NOT_CONFIGURABLE)


def configurable_broker_fields() -> dict[str, object]:
    return configurable_fields(BrokerConfig)


def field_defaults(cls: type, skip: frozenset[str] = frozenset()) -> dict[str, object]:
    """Default value of each field of a settings dataclass (for docs and tests)."""
    defaults: dict[str, object] = {}
    for item in dataclasses.fields(cls):
        if item.name in skip:
            continue
        if item.default is not dataclasses.MISSING:
            defaults[item.name] = item.default
        elif item.default_factory is not dataclasses.MISSING:
            defaults[item.name] = item.default_factory()
    return defaults


def log_field_defaults() -> dict[str, object]:
    return field_defaults(LogConfig, _LOG_FIELDS_NOT_CONFIGURABLE)


def check_port(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PORT:
        raise ConfigError(
            f"{where}: a port must be an integer 0..{MAX_PORT} (0: off), not {value!r}"
        )
    return value


def check_log_level(value: object, where: str) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ConfigError(
            f"{where}: log level must be one of {', '.join(LOG_LEVELS)}, not {value!r}"
        )
    return value.lower()


def _type_name(hint: object) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def _coerce(value: object, hint: object, where: str) -> object:
    """Check a TOML value against a LogConfig field's type hint; returns the value to use."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value == UNLIMITED and not isinstance(value, bool):
            return None
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _coerce(value, inner, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, not {value!r}")
        if value < 0:
            raise ConfigError(f"{where}: must not be negative, not {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, not {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, not {value!r}")
        return value
    if hint is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a path string, not {value!r}")
        return Path(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, not {value!r}")
        _key_hint, value_hint = args
        return {str(k): _coerce(v, value_hint, f"{where}.{k}") for k, v in value.items()}
    raise ConfigError(f"{where}: cannot be set from a config file (type {_type_name(hint)})")


def _must_be_positive(key: str) -> bool:
    """Sizes, counts and intervals where 0 is meaningless (an interval of 0 would spin a loop)."""
    return key.endswith("_interval_ms") or key in (
        "segment_size",
        "index_entries_per_file",
        "num_partitions",
    )


def _dataclass_options(
    section: Mapping[str, object],
    fields: Mapping[str, object],
    where: str,
    extra_keys: tuple[str, ...] = (),
) -> dict[str, object]:
    """Check a section's keys and values against a settings dataclass's fields."""
    options: dict[str, object] = {}
    for key, value in section.items():
        if key not in fields:
            known = ", ".join([*extra_keys, *fields])
            raise ConfigError(f"{where} {key}: unknown key (known: {known})")
        options[key] = _coerce(value, fields[key], f"{where} {key}")
        if _must_be_positive(key) and options[key] == 0:
            raise ConfigError(f"{where} {key}: must be positive")
    return options


def _section(raw: Mapping[str, object], name: str, where: str) -> dict[str, object]:
    section = raw.get(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: [{name}] must be a table")
    return section


def read_config_file(path: str) -> dict[str, object]:
    """Parse a TOML config file; every problem is a ConfigError naming the file."""
    try:
        with open(path, "rb") as stream:
            return tomllib.load(stream)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path}: is a directory") from None
    except OSError as error:
        raise ConfigError(f"config file {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path}: invalid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path}: not UTF-8 text: {error}") from None


def _string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{where}: expected a list of strings, not {value!r}")
    return list(value)


def _amqp_vhost(name: str, where: str) -> str:
    if name != AMQP_DEFAULT_VHOST and AMQP_VHOST_NAME.fullmatch(name) is None:
        raise ConfigError(
            f"{where}: invalid vhost name {name!r}: '/' or 1-64 characters of A-Z a-z 0-9 _ -"
        )
    return name


def _amqp_settings(section: Mapping[str, object], where: str) -> AmqpSettings:
    """The ``[amqp]`` section: ``vhosts = [...]`` and ``[amqp.users.NAME]`` tables."""
    vhosts: tuple[str, ...] = (AMQP_DEFAULT_VHOST,)
    users: dict[str, AmqpUser] | None = None
    for key, value in section.items():
        if key == "vhosts":
            names = [_amqp_vhost(n, f"{where} vhosts") for n in _string_list(value, where)]
            if not names:
                raise ConfigError(f"{where} vhosts: at least one vhost is needed")
            if len(set(names)) != len(names):
                raise ConfigError(f"{where} vhosts: a vhost is listed twice in {names!r}")
            vhosts = tuple(names)
        elif key == "users":
            if not isinstance(value, dict):
                raise ConfigError(f"{where} users: expected a table of [amqp.users.NAME] tables")
            users = {}
            for name, table in value.items():
                at = f"{where} users.{name}"
                if not isinstance(table, dict):
                    raise ConfigError(f"{at}: expected a table (password, vhosts)")
                # Keys first: a mistyped one ("pasword") is named, not reported as the
                # password missing.
                allowed: tuple[str, ...] = (AMQP_DEFAULT_VHOST,)
                for option, option_value in table.items():
                    if option == "vhosts":
                        allowed = tuple(_string_list(option_value, f"{at} vhosts"))
                    elif option != "password":
                        raise ConfigError(f"{at} {option}: unknown key (known: password, vhosts)")
                password = table.get("password")
                if password is None:
                    raise ConfigError(f"{at}: password missing (keys: password, vhosts)")
                if not isinstance(password, str):
                    raise ConfigError(f"{at} password: expected a string, not {password!r}")
                users[str(name)] = AmqpUser(password, allowed)
        else:
            raise ConfigError(f"{where} {key}: unknown key (known: vhosts, users)")
    if users is None:  # the default guest: "/" when it is a vhost
        return AmqpSettings(vhosts)
    for name, user in users.items():
        for vhost in user.vhosts:
            if vhost != AMQP_ANY_VHOST and vhost not in vhosts:
                raise ConfigError(
                    f"{where} users.{name} vhosts: {vhost!r} is not one of the vhosts "
                    f"{list(vhosts)!r}"
                )
    return AmqpSettings(vhosts, users)


def _kafka_group_tag_filters(section: Mapping[str, object], where: str) -> dict[str, str]:
    """The ``[kafka]`` section: ``[kafka.group_tag_filters]``, group id -> ``"TagA || TagB"``."""
    filters: dict[str, str] = {}
    for key, value in section.items():
        if key != "group_tag_filters":
            raise ConfigError(f"{where} {key}: unknown key (known: group_tag_filters)")
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where} group_tag_filters: expected a table of group = filter")
        for group, expression in value.items():
            if not isinstance(expression, str):
                raise ConfigError(
                    f"{where} group_tag_filters.{group}: expected a string such as "
                    f'"TagA || TagB", not {expression!r}'
                )
            filters[str(group)] = expression
    return filters


def _mqtt_options(section: Mapping[str, object], where: str) -> dict[str, object]:
    """The ``[mqtt]`` section: :data:`MQTT_SETTINGS`, checked."""
    options: dict[str, object] = {}
    for key, value in section.items():
        setting = MQTT_SETTINGS.get(key)
        if setting is None:
            raise ConfigError(f"{where} {key}: unknown key (known: {', '.join(MQTT_SETTINGS)})")
        hint, bounds = setting
        checked = _coerce(value, hint, f"{where} {key}")
        if isinstance(checked, int) and not isinstance(checked, bool) and bounds is not None:
            low, high = bounds
            if not low <= checked <= high:
                raise ConfigError(f"{where} {key}: must be {low}..{high}, not {checked}")
        if key == "connect_timeout_s" and checked == 0:
            raise ConfigError(f"{where} {key}: must be positive")
        if key == "sys_interval" and isinstance(checked, float) and checked < 0:
            raise ConfigError(f"{where} {key}: must be 0 (off) or more seconds, not {checked}")
        if key == "shared_subscription_strategy" and checked not in (
            MQTT_SHARED_SUBSCRIPTION_STRATEGIES
        ):
            raise ConfigError(
                f"{where} {key}: one of {', '.join(MQTT_SHARED_SUBSCRIPTION_STRATEGIES)}, "
                f"not {checked!r}"
            )
        options[key] = checked
    return options


def settings_from_mapping(raw: Mapping[str, object], source: str) -> ServerSettings:
    """Settings from a parsed config file (``source`` names it in error messages)."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section or key {', '.join(unknown)} "
            f"(known sections: {', '.join(f'[{s}]' for s in SECTIONS)})"
        )

    log_section = dict(_section(raw, "log", source))
    data_dir = log_section.pop("data_dir", DEFAULT_DATA_DIR)
    if not isinstance(data_dir, str) or not data_dir:
        raise ConfigError(
            f"{source}: [log] data_dir: expected a non-empty path string, not {data_dir!r}"
        )
    log_options = _dataclass_options(
        log_section, configurable_log_fields(), f"{source}: [log]", extra_keys=("data_dir",)
    )
    broker_options = _dataclass_options(
        _section(raw, "broker", source), configurable_broker_fields(), f"{source}: [broker]"
    )

    listener_section = _section(raw, "listeners", source)
    listener_values: dict[str, object] = {}
    listener_fields = {item.name for item in dataclasses.fields(ListenerSettings)}
    for key, value in listener_section.items():
        where = f"{source}: [listeners] {key}"
        if key not in listener_fields:
            raise ConfigError(f"{where}: unknown key (known: {', '.join(sorted(listener_fields))})")
        if key == "kafka_advertised_host":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: expected a host name or address, not {value!r}")
            listener_values[key] = value or None  # "": the address each client used
        elif key == "kafka_advertised_port":
            listener_values[key] = check_port(value, where) or None  # 0: the Kafka port
        elif key == "host":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{where}: expected a host name or address, not {value!r}")
            listener_values[key] = value
        else:
            listener_values[key] = check_port(value, where)

    logging_section = _section(raw, "logging", source)
    log_level = DEFAULT_LOG_LEVEL
    for key, value in logging_section.items():
        where = f"{source}: [logging] {key}"
        if key != "level":
            raise ConfigError(f"{where}: unknown key (known: level)")
        log_level = check_log_level(value, where)

    amqp = _amqp_settings(_section(raw, "amqp", source), f"{source}: [amqp]")
    kafka_group_tag_filters = _kafka_group_tag_filters(
        _section(raw, "kafka", source), f"{source}: [kafka]"
    )
    mqtt_options = _mqtt_options(_section(raw, "mqtt", source), f"{source}: [mqtt]")

    settings = ServerSettings(
        data_dir=data_dir,
        log_level=log_level,
        listeners=ListenerSettings(**listener_values),  # type: ignore[arg-type]
        log_options=log_options,
        broker_options=broker_options,
        amqp=amqp,
        kafka_group_tag_filters=kafka_group_tag_filters,
        mqtt_options=mqtt_options,
        auth=_auth_settings(_section(raw, "auth", source), f"{source}: [auth]"),
        tls=_tls_settings(_section(raw, "tls", source), f"{source}: [tls]"),
        limits=_limits_settings(_section(raw, "limits", source), f"{source}: [limits]"),
        cluster=_cluster_settings(_section(raw, "cluster", source), source),
    )
    validate(settings, source)
    return settings


def validate(settings: ServerSettings, source: str) -> None:
    """Let LogConfig and BrokerConfig check what they check (durability names, minimum segment
    size...)."""
    try:
        settings.log_config()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{source}: [log] {error}") from None
    try:
        settings.broker_config()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{source}: [broker] {error}") from None
    try:
        settings.tls.check()
    except TlsConfigError as error:
        raise ConfigError(f"{source}: [tls] {error}") from None
    cluster = settings.cluster
    try:
        cluster.settings()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{source}: {error}") from None
    if cluster.workers < 1:
        raise ConfigError(f"{source}: [cluster] workers must be 1 or more, not {cluster.workers}")
    if cluster.shards is not None and cluster.shards < 1:
        raise ConfigError(f"{source}: [cluster] shards must be 1 or more, not {cluster.shards}")
    if cluster.supervisor:
        _check_supervisor(settings, source)
        return
    if cluster.supervised and not cluster.enabled:
        raise ConfigError(f"{source}: --supervised goes with --cluster URL and --node-id")
    if cluster.enabled and cluster.node_id is None:
        raise ConfigError(f"{source}: [cluster] a node of a cluster needs its node_id (--node-id)")
    if not cluster.enabled and cluster.node_id is not None:
        raise ConfigError(
            f"{source}: [cluster] node_id without url: --node-id goes with --cluster URL"
        )


def _check_supervisor(settings: ServerSettings, source: str) -> None:
    """What `--workers N` (N > 1) cannot take: settings that name one process's own port or
    id, where the supervisor gives each worker its own."""
    cluster = settings.cluster
    if cluster.node_id is not None:
        raise ConfigError(
            f"{source}: [cluster] node_id with workers = {cluster.workers}: the supervisor "
            f"numbers its workers 0..{cluster.workers - 1}"
        )
    if cluster.settings().cluster_port != 0:
        raise ConfigError(
            f"{source}: [cluster] cluster_port with workers = {cluster.workers}: each worker "
            "binds its own gRPC port (0: any free port)"
        )
    if settings.listeners.kafka_advertised_port is not None:
        raise ConfigError(
            f"{source}: [listeners] kafka_advertised_port names one port; with workers = "
            f"{cluster.workers} worker i advertises its own, kafka_worker_port_base + i"
        )


def override(
    settings: ServerSettings,
    *,
    data_dir: str | None = None,
    log_level: str | None = None,
    listeners: Mapping[str, object] | None = None,
    tls: Mapping[str, object] | None = None,
    cluster: Mapping[str, object] | None = None,
) -> ServerSettings:
    """Apply command-line flags (``None``: not given) on top of ``settings``. ``cluster``:
    :class:`ClusterNodeSettings` attributes (url, node_id, ...) and ClusterSettings fields."""
    given = {key: value for key, value in (listeners or {}).items() if value is not None}
    tls_given = {key: value for key, value in (tls or {}).items() if value is not None}
    cluster_given = {key: value for key, value in (cluster or {}).items() if value is not None}
    node_given = {
        key: cluster_given.pop(key)
        for key in (*CLUSTER_NODE_KEYS, *CLUSTER_WORKER_KEYS, "supervised")
        if key in cluster_given
    }
    node = dataclasses.replace(
        settings.cluster,
        options={**settings.cluster.options, **cluster_given},
        **node_given,  # type: ignore[arg-type]
    )
    return dataclasses.replace(
        settings,
        data_dir=settings.data_dir if data_dir is None else data_dir,
        log_level=settings.log_level if log_level is None else log_level,
        listeners=dataclasses.replace(settings.listeners, **given),  # type: ignore[arg-type]
        tls=dataclasses.replace(settings.tls, **tls_given),  # type: ignore[arg-type]
        cluster=node,
    )


# -- [auth] and [tls] --------------------------------------------------------------------------


def _auth_settings(section: Mapping[str, object], where: str) -> SecurityConfig:
    """The ``[auth]`` section: the fields of core.security.SecurityConfig."""
    fields = configurable_fields(SecurityConfig, frozenset({"loopback_users"}))
    options: dict[str, object] = {}
    for key, value in section.items():
        if key == "loopback_users":
            options[key] = tuple(_string_list(value, f"{where} {key}"))
        elif key in fields:
            options[key] = _coerce(value, fields[key], f"{where} {key}")
        else:
            known = ", ".join(["loopback_users", *fields])
            raise ConfigError(f"{where} {key}: unknown key (known: {known})")
    try:
        return SecurityConfig(**options)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where} {error}") from None


def _tls_settings(section: Mapping[str, object], where: str) -> TlsSettings:
    """The ``[tls]`` section: certificate, key and CA files, and client-certificate checks."""
    fields = configurable_fields(TlsSettings)
    options: dict[str, object] = {}
    for key, value in section.items():
        if key not in fields:
            raise ConfigError(f"{where} {key}: unknown key (known: {', '.join(fields)})")
        if key.endswith("_file"):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{where} {key}: expected a file path, not {value!r}")
            options[key] = value
        else:
            options[key] = _coerce(value, fields[key], f"{where} {key}")
    return TlsSettings(**options)  # type: ignore[arg-type]


def _limits_settings(section: Mapping[str, object], where: str) -> LimitsConfig:
    """The ``[limits]`` section: the fields of core.limits.LimitsConfig (-1: no limit)."""
    options = _dataclass_options(section, configurable_fields(LimitsConfig), where)
    try:
        return LimitsConfig(**options)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{where} {error}") from None


def check_node_id(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NODE_ID:
        raise ConfigError(
            f"{where}: a node id is an integer 0..{MAX_NODE_ID} (its Kafka broker id), "
            f"not {value!r}"
        )
    return value


def _cluster_settings(section: Mapping[str, object], source: str) -> ClusterNodeSettings:
    """The ``[cluster]`` section: :data:`CLUSTER_NODE_KEYS` and the fields of
    core.cluster.settings.ClusterSettings (checked by it)."""
    where = f"{source}: [cluster]"
    node: dict[str, object] = {}
    options: dict[str, object] = {}
    fields = configurable_fields(ClusterSettings)
    for key, value in section.items():
        if key == "node_id":
            node[key] = check_node_id(value, f"{where} {key}")
        elif key in CLUSTER_WORKER_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where} {key}: expected a positive integer, not {value!r}")
            node[key] = value
        elif key in CLUSTER_NODE_KEYS:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{where} {key}: expected a non-empty string, not {value!r}")
            node[key] = value
        elif key in fields:
            options[key] = _coerce(value, fields[key], f"{where} {key}")
        else:
            known = ", ".join([*CLUSTER_NODE_KEYS, *CLUSTER_WORKER_KEYS, *fields])
            raise ConfigError(f"{where} {key}: unknown key (known: {known})")
    try:
        ClusterSettings(**options)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:  # its messages name [cluster] and the key
        raise ConfigError(f"{source}: {error}") from None
    return ClusterNodeSettings(options=options, **node)  # type: ignore[arg-type]
