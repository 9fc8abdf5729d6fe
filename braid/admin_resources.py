"""``braid queue``, ``braid exchange``, ``braid binding``, ``braid consumer`` and
``braid definitions``: a running broker's AMQP resources at a terminal, a thin client of the
RabbitMQ management API subset (braid/web/rabbit.py), as ``rabbitmqadmin`` is for RabbitMQ.

    braid queue list [--vhost V] [--json]
    braid queue purge NAME [--vhost /]
    braid queue delete NAME [--vhost /] [--if-unused] [--if-empty]
    braid exchange list [--vhost V] [--json]
    braid binding list [--vhost V] [--json]
    braid consumer list [--vhost V] [--json]
    braid definitions export [FILE] [--vhost V]
    braid definitions import FILE [--vhost V]        (FILE "-": standard input)

Lists are aligned tables with a header by default, the API's JSON with ``--json``. The
connection options and the administrator to act as are ``braid user``'s (braid/admin.py:
``--url``, ``--admin-user``, ``BRAID_ADMIN_PASSWORD``); the exit codes are its too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from braid.admin import EXIT_FAILED, AdminError, ManagementClient, add_common_options, client_for
from braid.admin import segment as path_segment

NOUNS: Final = ("queue", "exchange", "binding", "consumer", "definitions")
# rabbitmqctl's name for the nameless default exchange; only the table shows it (JSON keeps "").
DEFAULT_EXCHANGE_LABEL: Final = "(AMQP default)"

Row = Sequence[object]


def print_table(headers: Sequence[str], rows: Sequence[Row], out: TextIO) -> None:
    """Columns padded to their widest cell, so a terminal reads them; no trailing spaces."""
    cells = [list(headers)] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(line[column]) for line in cells) for column in range(len(headers))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True) if value else ""
    return "" if value is None else str(value)


def _vhost_path(collection: str, vhost: str | None) -> str:
    """``/api/queues`` for every visible vhost, ``/api/queues/%2F`` for one."""
    if vhost is None:
        return f"/api/{collection}"
    return f"/api/{collection}/{path_segment(vhost)}"


# -- the parsers ---------------------------------------------------------------------------


def _list_verb(verbs: Any, what: str) -> argparse.ArgumentParser:
    listing: argparse.ArgumentParser = verbs.add_parser("list", help=f"list {what}")
    listing.add_argument("--vhost", help="only this vhost (default: every vhost you may see)")
    listing.add_argument("--json", action="store_true", help="print the API's JSON")
    return listing


def build_resource_parsers(commands: Any) -> None:
    """Register the nouns of this module on ``braid``'s subcommands."""
    queue = commands.add_parser("queue", help="list, purge, delete AMQP queues of a running broker")
    verbs = queue.add_subparsers(dest="queue_command", metavar="COMMAND", required=True)
    listing = _list_verb(verbs, "queues with their message and consumer counts")
    purge = verbs.add_parser("purge", help="drop a queue's ready messages")
    purge.add_argument("name", metavar="NAME")
    purge.add_argument("--vhost", default="/", help="default: /")
    delete = verbs.add_parser("delete", help="delete a queue and its messages")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--vhost", default="/", help="default: /")
    delete.add_argument(
        "--if-unused", action="store_true", help="refuse if the queue has consumers"
    )
    delete.add_argument("--if-empty", action="store_true", help="refuse if it holds messages")
    for verb in (listing, purge, delete):
        add_common_options(verb)

    for noun, what in (
        ("exchange", "AMQP exchanges"),
        ("binding", "AMQP bindings (exchange to queue, exchange to exchange)"),
        ("consumer", "AMQP consumers"),
    ):
        parser = commands.add_parser(noun, help=f"list the {what} of a running broker")
        noun_verbs = parser.add_subparsers(dest=f"{noun}_command", metavar="COMMAND", required=True)
        add_common_options(_list_verb(noun_verbs, what))

    definitions = commands.add_parser(
        "definitions",
        help="export or import users, permissions, exchanges, queues, bindings (RabbitMQ's format)",
    )
    verbs = definitions.add_subparsers(dest="definitions_command", metavar="COMMAND", required=True)
    export = verbs.add_parser("export", help="write the definitions as JSON")
    export.add_argument(
        "file", nargs="?", metavar="FILE", help="where to write (default: standard output)"
    )
    export.add_argument("--vhost", help="only this vhost's objects")
    import_ = verbs.add_parser(
        "import",
        help="load definitions (from braid or RabbitMQ)",
        description=(
            "POST the document to /api/definitions: users keep their password hashes, so "
            "a RabbitMQ set-up moves over with one export and one import."
        ),
    )
    import_.add_argument("file", metavar="FILE", help='a JSON file, or "-" for standard input')
    import_.add_argument("--vhost", help="load every object into this vhost")
    for verb in (export, import_):
        add_common_options(verb)


# -- the verbs -----------------------------------------------------------------------------


def _listing(
    args: argparse.Namespace,
    out: TextIO,
    items: list[dict[str, Any]],
    headers: Sequence[str],
    row: Callable[[dict[str, Any]], Row],
) -> int:
    if args.json:
        print(json.dumps(items), file=out)
    else:
        print_table(headers, [row(item) for item in items], out)
    return 0


def run_queue(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    command = args.queue_command
    if command == "list":
        queues = client.call("GET", _vhost_path("queues", args.vhost))
        return _listing(
            args,
            out,
            queues,
            ("VHOST", "NAME", "MESSAGES", "READY", "UNACKED", "CONSUMERS", "DURABLE"),
            lambda q: (
                q["vhost"],
                q["name"],
                q["messages"],
                q["messages_ready"],
                q["messages_unacknowledged"],
                q["consumers"],
                q["durable"],
            ),
        )
    path = f"/api/queues/{path_segment(args.vhost)}/{path_segment(args.name)}"
    if command == "purge":
        client.call("DELETE", path + "/contents")
        print(f"purged queue {args.name} in vhost {args.vhost}", file=out)
        return 0
    conditions = [
        f"{flag}=true"
        for flag, wanted in (("if-unused", args.if_unused), ("if-empty", args.if_empty))
        if wanted
    ]
    client.call("DELETE", path + ("?" + "&".join(conditions) if conditions else ""))
    print(f"deleted queue {args.name} in vhost {args.vhost}", file=out)
    return 0


def run_exchange(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    exchanges = client.call("GET", _vhost_path("exchanges", args.vhost))
    return _listing(
        args,
        out,
        exchanges,
        ("VHOST", "NAME", "TYPE", "DURABLE", "AUTO_DELETE", "INTERNAL"),
        lambda e: (
            e["vhost"],
            e["name"] or DEFAULT_EXCHANGE_LABEL,
            e["type"],
            e["durable"],
            e["auto_delete"],
            e["internal"],
        ),
    )


def run_binding(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    bindings = client.call("GET", _vhost_path("bindings", args.vhost))
    return _listing(
        args,
        out,
        bindings,
        ("VHOST", "SOURCE", "DESTINATION", "TYPE", "ROUTING_KEY", "ARGUMENTS"),
        lambda b: (
            b["vhost"],
            b["source"] or DEFAULT_EXCHANGE_LABEL,
            b["destination"],
            b["destination_type"],
            b["routing_key"],
            b["arguments"],
        ),
    )


def run_consumer(args: argparse.Namespace, client: ManagementClient, out: TextIO) -> int:
    consumers = client.call("GET", _vhost_path("consumers", args.vhost))
    return _listing(
        args,
        out,
        consumers,
        ("VHOST", "QUEUE", "CONSUMER_TAG", "ACK_REQUIRED", "PREFETCH"),
        lambda c: (
            c["queue"]["vhost"],
            c["queue"]["name"],
            c["consumer_tag"],
            c["ack_required"],
            c["prefetch_count"],
        ),
    )


def run_definitions(
    args: argparse.Namespace, client: ManagementClient, out: TextIO, stdin: TextIO
) -> int:
    path = _vhost_path("definitions", args.vhost)
    if args.definitions_command == "export":
        document = json.dumps(client.call("GET", path), indent=2) + "\n"
        if args.file is None:
            out.write(document)
        else:
            Path(args.file).write_text(document, encoding="utf-8")
            print(f"exported the definitions to {args.file}", file=out)
        return 0
    try:
        text = stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        body = json.loads(text)
    except OSError as error:
        raise AdminError(f"cannot read {args.file}: {error.strerror}") from None
    except ValueError as error:
        raise AdminError(f"{args.file} is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise AdminError(f"{args.file} is not a definitions document (a JSON object)")
    client.call("POST", path, body)
    print(f"imported the definitions from {args.file}", file=out)
    return 0


def run(args: argparse.Namespace, out: TextIO = sys.stdout, stdin: TextIO = sys.stdin) -> int:
    try:
        client = client_for(args)
        if args.command == "queue":
            return run_queue(args, client, out)
        if args.command == "exchange":
            return run_exchange(args, client, out)
        if args.command == "binding":
            return run_binding(args, client, out)
        if args.command == "consumer":
            return run_consumer(args, client, out)
        return run_definitions(args, client, out, stdin)
    except AdminError as error:
        print(f"braid {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
