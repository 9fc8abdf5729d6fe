"""``braid connection``, ``braid group``, ``braid session`` and ``braid dlq``: who is connected
to a running broker, over every protocol, how far behind its Kafka consumer groups and MQTT
sessions are, and its dead letters; a thin client of the management API (``/api/connections``,
``/api/braid/...``), as ``braid/admin_resources.py`` is for the AMQP resources.

    braid connection list [--vhost V] [--json]      every protocol's open connections
    braid connection close NAME [--reason TEXT]     AMQP 320, MQTT 5.0 DISCONNECT 0x98, Kafka:
                                                    the socket closed
    braid group list [--json]                       Kafka consumer groups: state, members, lag
    braid group describe GROUP [--json]             its members and per partition the committed
                                                    offset, the log end and the lag
    braid session list [--json]                     MQTT sessions: connected and persistent
                                                    ones, with their queued messages
    braid dlq list [--json]                         dead-letter queues: depth, the queues that
                                                    dead-letter into them, through which DLX
    braid dlq redrive QUEUE [--vhost V] [--count N] move dead letters back to the queue each
                                                    died in (administrator)

Tables with a header by default, the API's JSON with ``--json``; the connection options, the
user to act as and the exit codes are ``braid user``'s (braid/admin.py). A user lists and closes
its own connections (``monitoring``: lists all; ``administrator``: closes any); groups,
sessions and dead-letter queues need ``monitoring``, a redrive ``administrator``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final, TextIO

from braid.admin import EXIT_FAILED, AdminError, ManagementClient, add_common_options, client_for
from braid.admin import segment as path_segment
from braid.admin_resources import print_table

NOUNS: Final = ("connection", "group", "session", "dlq")
# RabbitMQ's management UI and rabbitmqadmin send the reason a connection is closed for in
# this header; the broker tells the client (AMQP connection.close text, MQTT Reason String).
REASON_HEADER: Final = "X-Reason"


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def build_noun_parsers(commands: Any) -> None:
    """Register this module's nouns on ``braid``'s subcommands."""
    connection = commands.add_parser(
        "connection", help="list or close the client connections of a running broker"
    )
    verbs = connection.add_subparsers(dest="connection_command", metavar="COMMAND", required=True)
    listing = verbs.add_parser("list", help="open connections of every protocol")
    listing.add_argument("--vhost", help="only this vhost (default: every vhost you may see)")
    _json_option(listing)
    close = verbs.add_parser("close", help="close one connection (its NAME as listed)")
    close.add_argument("name", metavar="NAME")
    close.add_argument("--reason", help="told to the client (default: the broker's)")
    for verb in (listing, close):
        add_common_options(verb)

    group = commands.add_parser(
        "group", help="list or describe the Kafka consumer groups of a running broker"
    )
    verbs = group.add_subparsers(dest="group_command", metavar="COMMAND", required=True)
    listing = verbs.add_parser("list", help="groups with their state, members and total lag")
    _json_option(listing)
    describe = verbs.add_parser("describe", help="one group's members and per-partition lag")
    describe.add_argument("group", metavar="GROUP")
    _json_option(describe)
    for verb in (listing, describe):
        add_common_options(verb)

    session = commands.add_parser("session", help="list the MQTT sessions of a running broker")
    verbs = session.add_subparsers(dest="session_command", metavar="COMMAND", required=True)
    listing = verbs.add_parser("list", help="connected clients and persistent sessions")
    _json_option(listing)
    add_common_options(listing)

    dlq = commands.add_parser(
        "dlq", help="list the dead-letter queues of a running broker, or redrive one"
    )
    verbs = dlq.add_subparsers(dest="dlq_command", metavar="COMMAND", required=True)
    listing = verbs.add_parser("list", help="dead-letter queues with their depth and sources")
    _json_option(listing)
    redrive = verbs.add_parser(
        "redrive", help="move a dead-letter queue's records back to the queues they died in"
    )
    redrive.add_argument("queue", metavar="QUEUE", help="the dead-letter queue")
    redrive.add_argument("--vhost", default="/", help="its vhost (default: /)")
    redrive.add_argument(
        "--count",
        type=_positive,
        help="at most this many, from its head (default: the broker's, 10,000)",
    )
    _json_option(redrive)
    for verb in (listing, redrive):
        add_common_options(verb)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


# -- the verbs -------------------------------------------------------------------------------


def _shown(value: object) -> object:
    """A cell that is never blank (an anonymous client has no user name), so that the
    columns of a row stay apart for a reader and for ``awk``."""
    return "-" if value is None or value == "" else value


def _client_label(connection: dict[str, Any]) -> str:
    """What the client called itself: its MQTT client id or Kafka client.id, the AMQP
    connection_name, else the AMQP client library's product name."""
    properties = connection.get("client_properties") or {}
    if not isinstance(properties, dict):
        return ""
    for key in ("client_id", "connection_name", "product"):
        value = properties.get(key)
        if value:
            return str(value)
    return ""


def run_connection(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    if args.connection_command == "list":
        path = (
            "/api/connections"
            if args.vhost is None
            else f"/api/vhosts/{path_segment(args.vhost)}/connections"
        )
        connections = client.call("GET", path)
        if args.json:
            print(json.dumps(connections), file=out)
            return 0
        print_table(
            ("NAME", "PROTOCOL", "USER", "VHOST", "CLIENT", "PEER", "CHANNELS"),
            [
                (
                    c["name"],
                    c["protocol"],
                    _shown(c["user"]),
                    c["vhost"],
                    _shown(_client_label(c)),
                    f"{c['peer_host']}:{c['peer_port']}",
                    c["channels"],
                )
                for c in connections
            ],
            out,
        )
        return 0
    if args.reason:
        client.headers = {**client.headers, REASON_HEADER: args.reason}
    client.call("DELETE", f"/api/connections/{path_segment(args.name)}")
    print(f"closed connection {args.name}", file=out)
    return 0


def run_group(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    if args.group_command == "list":
        groups = client.call("GET", "/api/braid/kafka/groups")
        if args.json:
            print(json.dumps(groups), file=out)
            return 0
        print_table(
            ("GROUP", "STATE", "PROTOCOL_TYPE", "MEMBERS", "LAG"),
            [
                (
                    g["group_id"],
                    g["state"],
                    _shown(g["protocol_type"]),
                    len(g["members"]),
                    g["lag"],
                )
                for g in groups
            ],
            out,
        )
        return 0
    group = client.call("GET", f"/api/braid/kafka/groups/{path_segment(args.group)}")
    if args.json:
        print(json.dumps(group), file=out)
        return 0
    print(
        f"group {group['group_id']}  state {group['state']}  "
        f"protocol type {group['protocol_type'] or '-'}  lag {group['lag']}",
        file=out,
    )
    print(file=out)
    print_table(
        ("MEMBER", "CLIENT_ID", "CLIENT_HOST"),
        [
            (m["member_id"], _shown(m["client_id"]), _shown(m["client_host"]))
            for m in group["members"]
        ],
        out,
    )
    print(file=out)
    print_table(
        ("TOPIC", "PARTITION", "COMMITTED", "LOG_START", "LOG_END", "LAG"),
        [
            (
                p["topic"],
                p["partition"],
                p["committed_offset"],
                p["log_start_offset"],
                p["log_end_offset"],
                p["lag"],
            )
            for p in group["partitions"]
        ],
        out,
    )
    return 0


def run_session(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    sessions = client.call("GET", "/api/braid/mqtt/sessions")
    if args.json:
        print(json.dumps(sessions), file=out)
        return 0
    print_table(
        ("CLIENT_ID", "CONNECTED", "PERSISTENT", "PROTOCOL", "USER", "READY", "UNACKED"),
        [
            (
                s["client_id"],
                s["connected"],
                s["persistent"],
                _shown(s["protocol"]),
                _shown(s["user"]),
                s["messages_ready"],
                s["messages_unacknowledged"],
            )
            for s in sessions
        ],
        out,
    )
    return 0


def run_dlq(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    if args.dlq_command == "list":
        queues = client.call("GET", "/api/braid/dead-letters")
        if args.json:
            print(json.dumps(queues), file=out)
            return 0
        print_table(
            ("VHOST", "QUEUE", "MESSAGES", "READY", "UNACKED", "FROM", "THROUGH"),
            [
                (
                    _shown(q["vhost"]),
                    q["queue"] or q["topic"],  # a Kafka topic's partition has no queue name
                    q["messages"],
                    q["messages_ready"],
                    q["messages_unacknowledged"],
                    _shown(",".join(q["dead_lettered_from"])),
                    _shown(",".join(q["dead_letter_exchanges"])),
                )
                for q in queues
            ],
            out,
        )
        return 0
    body = {} if args.count is None else {"count": args.count}
    path = f"/api/braid/dead-letters/{path_segment(args.vhost)}/{path_segment(args.queue)}/redrive"
    result = client.call("POST", path, body)
    if args.json:
        print(json.dumps(result), file=out)
        return 0
    print(f"moved {result['moved']} dead letter(s) from {args.queue}", file=out)
    if result["to"]:
        print(file=out)
        print_table(
            ("TO_VHOST", "TO_QUEUE", "MESSAGES"),
            [(_shown(t["vhost"]), t["queue"] or t["topic"], t["messages"]) for t in result["to"]],
            out,
        )
    if result["left"]:
        print(file=out)
        print_table(
            ("LEFT_OFFSET", "REASON"),
            [(left["offset"], left["reason"]) for left in result["left"]],
            out,
        )
    return 0


def run(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    try:
        client = client_for(args)
        if args.command == "connection":
            return run_connection(args, client, out)
        if args.command == "group":
            return run_group(args, client, out)
        if args.command == "dlq":
            return run_dlq(args, client, out)
        return run_session(args, client, out)
    except AdminError as error:
        print(f"braid {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
