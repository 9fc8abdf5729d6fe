"""The ``braid`` command line.

    braid serve [--config FILE] [--data-dir DIR] [--host HOST] [--<protocol>-port N] ...
    braid serve --cluster URL --node-id ID --data-dir ROOT [--advertised-host H]
                [--cluster-port P] [--expect-nodes N]   (a node of a cluster: docs/cluster.md)
    braid serve --workers N --data-dir ROOT [--shards S] [--cluster URL]
                                                    (N worker nodes under a supervisor: section 9)
    braid log stat DIR [--shard N] [--json]         (DIR: a data directory or a cluster root)
    braid log dump DIR [--shard N] [--topic T] [--queue N] [--from OFFSET] [--limit N] [--json]
    braid log verify DIR [--shard N]
    braid tail TOPIC [--data-dir DIR] [--shard N] [--last N] [--limit N] [--json]
    braid user add|passwd|delete|list ...           (a running broker's users: braid/admin.py)
    braid permission set|clear|list ...
    braid queue list|purge|delete, braid exchange|binding|consumer list,
    braid definitions export|import                 (AMQP resources: braid/admin_resources.py)
    braid connection list|close, braid group list|describe,
    braid session list, braid dlq list|redrive      (clients, groups: braid/admin_nouns.py)
    braid cluster init ROOT [--shards N] [--adopt], braid cluster check ROOT
                                                    (a cluster's data root: braid/cluster_cli.py)
    braid cluster status [--cluster URL] [ROOT] [--json]   (nodes, shard owners and epochs)

Exit codes: 0 success; 1 runtime failure (a listener could not start, corruption found);
2 usage or configuration error (argparse's convention).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from braid import config, version
from core.cluster.settings import KAFKA_WORKER_PORT_BASE, KAFKA_WORKER_TLS_PORT_BASE

EXIT_USAGE = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# (flag, ListenerSettings attribute, default, what listens there)
PORT_FLAGS = (
    ("--amqp-port", "amqp_port", config.DEFAULT_AMQP_PORT, "AMQP 0-9-1"),
    ("--mqtt-port", "mqtt_port", config.DEFAULT_MQTT_PORT, "MQTT over TCP"),
    ("--mqtt-ws-port", "mqtt_ws_port", config.DEFAULT_MQTT_WS_PORT, "MQTT over WebSocket"),
    ("--kafka-port", "kafka_port", config.DEFAULT_KAFKA_PORT, "Kafka"),
    ("--http-port", "http_port", config.DEFAULT_HTTP_PORT, "HTTP /health, /metrics, /api"),
    ("--amqps-port", "amqps_port", config.DEFAULT_AMQPS_PORT, "AMQP 0-9-1 over TLS"),
    ("--mqtts-port", "mqtts_port", config.DEFAULT_MQTTS_PORT, "MQTT over TLS"),
    (
        "--mqtt-wss-port",
        "mqtt_wss_port",
        config.DEFAULT_MQTT_WSS_PORT,
        "MQTT over secure WebSocket",
    ),
    ("--kafka-tls-port", "kafka_tls_port", config.DEFAULT_KAFKA_TLS_PORT, "Kafka over TLS"),
    ("--https-port", "https_port", config.DEFAULT_HTTPS_PORT, "HTTPS /health, /metrics, /api"),
)
# (flag, TlsSettings attribute, help)
TLS_FILE_FLAGS = (
    ("--tls-cert", "cert_file", "PEM certificate (chain) of every TLS listener; turns them on"),
    ("--tls-key", "key_file", "PEM private key of --tls-cert (default: in the same file)"),
    ("--tls-ca", "ca_file", "PEM CA certificates that client certificates are checked against"),
)


def _port(text: str) -> int:
    try:
        return config.check_port(int(text), "port")
    except (ValueError, config.ConfigError):
        raise argparse.ArgumentTypeError(
            f"invalid port {text!r}: an integer 0..{config.MAX_PORT} (0: off)"
        ) from None


def _any_port(text: str) -> int:
    try:
        return config.check_port(int(text), "port")
    except (ValueError, config.ConfigError):
        raise argparse.ArgumentTypeError(
            f"invalid port {text!r}: an integer 0..{config.MAX_PORT} (0: any free port)"
        ) from None


def _node_id(text: str) -> int:
    try:
        return config.check_node_id(int(text), "node id")
    except (ValueError, config.ConfigError):
        raise argparse.ArgumentTypeError(
            f"invalid node id {text!r}: an integer 0..{config.MAX_NODE_ID}"
        ) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, not {text!r}")
    return value


class _VersionAction(argparse.Action):
    """argparse's "version" action, looking the version up only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        print(f"braid {version()}")
        parser.exit()


def _add_max_body(parser: argparse.ArgumentParser, default: int) -> None:
    parser.add_argument(
        "--max-body",
        type=_non_negative,
        metavar="BYTES",
        help=f"show at most BYTES of each body (default: {default}; 0: whole body)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="braid",
        description="BraidMQ: one broker for AMQP 0-9-1, MQTT and Kafka over one commit log.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the broker",
        description=(
            "Run the broker until SIGINT or SIGTERM. Settings: embedded defaults, overridden by "
            "--config FILE, overridden by flags. Prints one 'braid ready: ...' line to stdout "
            "once every listener accepts connections."
        ),
    )
    serve.add_argument("--config", metavar="FILE", help="TOML config file (docs/configuration.md)")
    serve.add_argument(
        "--data-dir", metavar="DIR", help=f"data directory (default: {config.DEFAULT_DATA_DIR})"
    )
    serve.add_argument(
        "--host", help=f"address every listener binds to (default: {config.DEFAULT_HOST})"
    )
    for flag, dest, default, what in PORT_FLAGS:
        serve.add_argument(
            flag, dest=dest, type=_port, metavar="PORT", help=f"{what} (default: {default}; 0: off)"
        )
    serve.add_argument(
        "--kafka-advertised-host",
        metavar="HOST",
        help="host Kafka clients are told to connect to (default: the address they used)",
    )
    serve.add_argument(
        "--kafka-advertised-port",
        type=_port,
        metavar="PORT",
        help="port Kafka clients are told to connect to (default: the Kafka port)",
    )
    for flag, dest, what in TLS_FILE_FLAGS:
        serve.add_argument(flag, dest=f"tls_{dest}", metavar="FILE", help=what)
    serve.add_argument(
        "--tls-verify-peer",
        action="store_const",
        const=True,
        help="ask TLS clients for a certificate and check it against --tls-ca",
    )
    serve.add_argument(
        "--tls-fail-if-no-peer-cert",
        action="store_const",
        const=True,
        help="with --tls-verify-peer: refuse TLS clients without a certificate",
    )
    cluster = serve.add_argument_group(
        "cluster node", "serve a cluster's data root ROOT as one node (docs/cluster.md)"
    )
    cluster.add_argument(
        "--cluster",
        dest="cluster_url",
        metavar="URL",
        help=(
            "the cluster's Redis (redis://, rediss://, unix://, redis+sentinel://); --data-dir "
            "is then a data root made by `braid cluster init`"
        ),
    )
    cluster.add_argument(
        "--node-id", type=_node_id, metavar="ID", help="this node's id (an integer; its Kafka id)"
    )
    cluster.add_argument(
        "--advertised-host",
        metavar="HOST",
        help="host other nodes and clients reach this node at (default: --host, or the hostname)",
    )
    cluster.add_argument(
        "--cluster-port",
        type=_any_port,
        metavar="PORT",
        help="gRPC port between nodes (default: 0, any free port, registered in Redis)",
    )
    cluster.add_argument(
        "--expect-nodes",
        type=_positive,
        metavar="N",
        help="nodes to wait for before shards are planned (default: 1)",
    )
    workers = serve.add_argument_group(
        "workers",
        "run N nodes of a cluster on this machine under a supervisor (docs/cluster.md section 9)",
    )
    workers.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        help=(
            "worker processes (default: 1, this process alone); N > 1: a supervisor starts N "
            "nodes on the data root --data-dir, sharing the listeners' ports (SO_REUSEPORT), "
            "with a private redis-server unless --cluster names one"
        ),
    )
    workers.add_argument(
        "--shards",
        type=_positive,
        metavar="N",
        help="shards of a data root --workers creates (default: 16; fixed once created)",
    )
    workers.add_argument(
        "--kafka-worker-port-base",
        type=_port,
        metavar="PORT",
        help=(
            "worker i's own Kafka port, advertised in Metadata, is PORT + i (default: "
            f"{KAFKA_WORKER_PORT_BASE}; 0: none, the shared Kafka port is advertised)"
        ),
    )
    workers.add_argument(
        "--kafka-tls-worker-port-base",
        dest="kafka_worker_tls_port_base",
        type=_port,
        metavar="PORT",
        help=f"the TLS twin of --kafka-worker-port-base (default: {KAFKA_WORKER_TLS_PORT_BASE})",
    )
    # Set by the supervisor on each worker it starts; not for people.
    workers.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument(
        "--log-level",
        type=str.lower,
        choices=config.LOG_LEVELS,
        help=f"stderr log level (default: {config.DEFAULT_LOG_LEVEL})",
    )

    log_parser = commands.add_parser(
        "log",
        help="inspect a data directory (read-only; safe on a running broker's)",
        description="Inspect a data directory read-only; safe on a running broker's directory.",
    )
    log_commands = log_parser.add_subparsers(dest="log_command", metavar="COMMAND", required=True)

    stat = log_commands.add_parser(
        "stat", help="topics, queues, segments, checkpoint", description="Summarize a data dir."
    )
    stat.add_argument("data_dir", metavar="DIR")
    _add_shard(stat)
    stat.add_argument("--json", action="store_true", help="print JSON")

    dump = log_commands.add_parser(
        "dump",
        help="print records",
        description=(
            "Print records, one a line. With --topic: that topic's queues (or --queue N) by "
            "offset, --from being a queue offset. Without: every record in commit-log order, "
            "--from being a commit-log position and --queue filtering by queue number."
        ),
    )
    dump.add_argument("data_dir", metavar="DIR")
    _add_shard(dump)
    dump.add_argument("--topic", help="read this topic's queues by offset")
    dump.add_argument("--queue", type=_non_negative, metavar="N", help="only queue N")
    dump.add_argument(
        "--from",
        dest="start",
        type=_non_negative,
        metavar="OFFSET",
        help="first queue offset (with --topic) or commit-log position (without)",
    )
    dump.add_argument("--limit", type=_non_negative, metavar="N", help="at most N records")
    dump.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_max_body(dump, 100)

    verify = log_commands.add_parser(
        "verify",
        help="check every record's CRC; exit 1 if any is corrupt",
        description="Check the length, magic and CRC32C of every commit-log frame.",
    )
    verify.add_argument("data_dir", metavar="DIR")
    _add_shard(verify)

    tail = commands.add_parser(
        "tail",
        help="print a topic's records live, from every protocol, with their origin",
        description=(
            "Follow TOPIC in a data directory (read-only; safe beside a running broker) and "
            "print each record as it becomes visible, with protocol, client and address. "
            "Stops on Ctrl-C, or after --limit records."
        ),
    )
    tail.add_argument("topic", metavar="TOPIC")
    tail.add_argument(
        "--data-dir",
        default=config.DEFAULT_DATA_DIR,
        metavar="DIR",
        help=f"data directory (default: {config.DEFAULT_DATA_DIR})",
    )
    _add_shard(tail)
    tail.add_argument(
        "--last",
        type=_non_negative,
        metavar="N",
        help="first show the last N records of each queue (default: only new ones)",
    )
    tail.add_argument("--limit", type=_non_negative, metavar="N", help="exit after N records")
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument(
        "--include-aborted",
        action="store_true",
        help="also show records of aborted Kafka transactions (default: committed ones only)",
    )
    _add_max_body(tail, 200)
    from braid import admin

    admin.build_user_parser(commands)
    admin.build_permission_parser(commands)
    from braid import admin_resources

    admin_resources.build_resource_parsers(commands)
    from braid import admin_nouns

    admin_nouns.build_noun_parsers(commands)
    from braid import cluster_cli

    cluster_cli.build_cluster_parser(commands)
    tail.add_argument(
        "--interval-ms",
        type=_non_negative,
        metavar="MS",
        help="how often to look for new records (default: 100)",
    )
    return parser


def _add_shard(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--shard",
        type=_non_negative,
        metavar="N",
        help="on a cluster's data root: only shard N (default: every shard)",
    )


def _serve(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        settings = config.ServerSettings()
        if args.config is not None:
            settings = config.settings_from_mapping(
                config.read_config_file(args.config), f"config file {args.config}"
            )
        settings = config.override(
            settings,
            data_dir=args.data_dir,
            log_level=args.log_level,
            listeners={
                "host": args.host,
                **{dest: getattr(args, dest) for _, dest, _, _ in PORT_FLAGS},
                "kafka_advertised_host": args.kafka_advertised_host,
                "kafka_advertised_port": args.kafka_advertised_port,
            },
            tls={
                **{dest: getattr(args, f"tls_{dest}") for _, dest, _ in TLS_FILE_FLAGS},
                "verify_peer": args.tls_verify_peer,
                "fail_if_no_peer_cert": args.tls_fail_if_no_peer_cert,
            },
            cluster={
                "url": args.cluster_url,
                "node_id": args.node_id,
                "advertised_host": args.advertised_host,
                "cluster_port": args.cluster_port,
                "expect_nodes": args.expect_nodes,
                "workers": args.workers,
                "shards": args.shards,
                "supervised": args.supervised or None,
                "kafka_worker_port_base": args.kafka_worker_port_base,
                "kafka_worker_tls_port_base": args.kafka_worker_tls_port_base,
            },
        )
        config.validate(settings, "settings")
    except config.ConfigError as error:
        print(f"braid serve: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=settings.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True
    )
    # kio registers Hypothesis strategies for its schema types at import time whenever
    # Hypothesis is importable (it is in test installs). The broker never uses them, and the
    # registration cost ~0.8 s of start-up CPU per process; hide Hypothesis from this process.
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    if settings.cluster.supervisor:
        from braid import workers  # a supervisor: no broker, no listeners of its own

        return workers.run(settings, argv)
    from braid import server  # imports uvloop and, later, the gateways: only for serve

    return server.run(settings)


def _log(args: argparse.Namespace) -> int:
    from braid import logtool

    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        if args.log_command == "stat":
            return logtool.stat(args.data_dir, as_json=args.json, out=sys.stdout, shard=args.shard)
        if args.log_command == "dump":
            return logtool.dump(
                args.data_dir,
                topic=args.topic,
                queue=args.queue,
                start=args.start,
                limit=args.limit,
                as_json=args.json,
                max_body=logtool.DEFAULT_MAX_BODY if args.max_body is None else args.max_body,
                out=sys.stdout,
                err=sys.stderr,
                shard=args.shard,
            )
        return logtool.verify(args.data_dir, out=sys.stdout, shard=args.shard)
    except logtool.NotALogError as error:
        print(f"braid log {args.log_command}: error: {error}", file=sys.stderr)
        return logtool.EXIT_NOT_A_LOG
    except BrokenPipeError:
        # The reader went away (`braid log dump ... | head`): not an error. Point stdout at
        # /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _tail(args: argparse.Namespace) -> int:
    from braid import logtool, tail

    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        return tail.tail(
            args.data_dir,
            args.topic,
            last=args.last,
            limit=args.limit,
            as_json=args.json,
            max_body=tail.DEFAULT_MAX_BODY if args.max_body is None else args.max_body,
            interval_ms=tail.DEFAULT_INTERVAL_MS if args.interval_ms is None else args.interval_ms,
            out=sys.stdout,
            err=sys.stderr,
            include_aborted=args.include_aborted,
            shard=args.shard,
        )
    except logtool.NotALogError as error:
        print(f"braid tail: error: {error}", file=sys.stderr)
        return logtool.EXIT_NOT_A_LOG
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version, usage errors
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    if args.command == "serve":
        return _serve(args, argv)
    if args.command == "tail":
        return _tail(args)
    if args.command in ("user", "permission"):
        from braid import admin

        return admin.run(args)
    if args.command in ("queue", "exchange", "binding", "consumer", "definitions"):
        from braid import admin_resources

        return admin_resources.run(args)
    if args.command == "cluster":
        from braid import cluster_cli

        return cluster_cli.run(args)
    if args.command in ("connection", "group", "session", "dlq"):
        from braid import admin_nouns

        return admin_nouns.run(args)
    return _log(args)
