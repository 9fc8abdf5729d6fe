"""``braid user ...`` and ``braid permission ...``: users and permissions of a running broker,
changed over its HTTP management API (braid/web/management.py), as ``rabbitmqctl`` and
``rabbitmqadmin`` do against RabbitMQ.

    braid user add NAME [--password-stdin] [--tags administrator,management]
    braid user passwd NAME [--password-stdin]
    braid user delete NAME
    braid user list [--json]
    braid permission set USER [--vhost /] [--configure RE] [--write RE] [--read RE]
    braid permission clear USER [--vhost /]
    braid permission list [--vhost V] [--json]

Common options: ``--url`` (default ``http://127.0.0.1:8080``, or ``BRAID_URL``), and the
administrator to act as: ``--admin-user`` / ``BRAID_ADMIN_USER`` (default ``guest``) with its
password from ``BRAID_ADMIN_PASSWORD`` (default ``guest``), so no password has to be on a
command line (where ``ps`` shows it). A new password is asked for on the terminal, or read from
the first line of standard input with ``--password-stdin``.

Exit codes: 0 done; 1 the broker refused (the message is its reason) or cannot be reached;
2 usage.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any, Final, TextIO
from urllib.parse import quote

DEFAULT_URL: Final = "http://127.0.0.1:8080"
DEFAULT_ADMIN: Final = "guest"
TIMEOUT_S: Final = 30.0
EXIT_FAILED: Final = 1


class AdminError(Exception):
    """The broker refused, or could not be reached; the message says why."""


class ManagementClient:
    """The few calls of the management API the CLI needs (urllib; no dependency)."""

    def __init__(self, url: str, user: str, password: str) -> None:
        self.url = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: object | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self.headers
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise AdminError(f"{method} {path}: {error.code} {_reason(error)}") from None
        except (urllib.error.URLError, OSError) as error:
            raise AdminError(f"cannot reach the broker at {self.url}: {error}") from None
        return json.loads(raw) if raw else None


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(error.read() or b"{}")
    except ValueError:
        return str(error.reason)
    return str(payload.get("reason") or payload.get("error") or error.reason)


def segment(value: str) -> str:
    """One path segment, percent-encoded ("/" too: the vhost "/" is "%2F")."""
    return quote(value, safe="")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("BRAID_URL", DEFAULT_URL),
        help=f"the broker's HTTP listener (default: $BRAID_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "--admin-user",
        default=os.environ.get("BRAID_ADMIN_USER", DEFAULT_ADMIN),
        metavar="NAME",
        help="administrator to act as (default: $BRAID_ADMIN_USER or guest; its password "
        "from $BRAID_ADMIN_PASSWORD, default guest)",
    )


def build_user_parser(commands: Any) -> None:
    user = commands.add_parser(
        "user", help="add, delete, list users of a running broker; change a password"
    )
    verbs = user.add_subparsers(dest="user_command", metavar="COMMAND", required=True)
    add = verbs.add_parser("add", help="create a user (or replace its password and tags)")
    add.add_argument("name", metavar="NAME")
    add.add_argument("--tags", default="", help="comma-separated: administrator, management...")
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    passwd = verbs.add_parser("passwd", help="change a user's password")
    passwd.add_argument("name", metavar="NAME")
    passwd.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    delete = verbs.add_parser("delete", help="delete a user and its permissions")
    delete.add_argument("name", metavar="NAME")
    listing = verbs.add_parser("list", help="list users and their tags")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for verb in (add, passwd, delete, listing):
        add_common_options(verb)


def build_permission_parser(commands: Any) -> None:
    permission = commands.add_parser(
        "permission", help="set, clear, list vhost permissions of a running broker"
    )
    verbs = permission.add_subparsers(dest="permission_command", metavar="COMMAND", required=True)
    set_ = verbs.add_parser(
        "set",
        help="set a user's configure/write/read expressions in a vhost",
        description=(
            "RabbitMQ's set_permissions: each expression is searched in resource names "
            "(anchor it: ^alice\\.); an empty one grants nothing."
        ),
    )
    set_.add_argument("user", metavar="USER")
    set_.add_argument("--vhost", default="/", help="default: /")
    set_.add_argument("--configure", default="", metavar="RE", help="default: nothing")
    set_.add_argument("--write", default="", metavar="RE", help="default: nothing")
    set_.add_argument("--read", default="", metavar="RE", help="default: nothing")
    clear = verbs.add_parser("clear", help="remove a user's permissions in a vhost")
    clear.add_argument("user", metavar="USER")
    clear.add_argument("--vhost", default="/", help="default: /")
    listing = verbs.add_parser("list", help="list permissions")
    listing.add_argument("--vhost", help="only this vhost")
    listing.add_argument("--json", action="store_true", help="print JSON")
    for verb in (set_, clear, listing):
        add_common_options(verb)


def client_for(args: argparse.Namespace) -> ManagementClient:
    """The client the options and ``BRAID_ADMIN_PASSWORD`` say (braid/admin_resources.py too)."""
    password = os.environ.get("BRAID_ADMIN_PASSWORD", "guest")
    return ManagementClient(args.url, args.admin_user, password)


def _new_password(args: argparse.Namespace, stdin: TextIO) -> str:
    if args.password_stdin:
        return stdin.readline().rstrip("\r\n")
    first = getpass.getpass(f"password for {args.name}: ")
    if getpass.getpass("again: ") != first:
        raise AdminError("the passwords differ")
    return first


def run_user(args: argparse.Namespace, out: TextIO, stdin: TextIO = sys.stdin) -> int:
    client = client_for(args)
    command = args.user_command
    if command == "list":
        users = client.call("GET", "/api/users")
        if args.json:
            print(json.dumps(users), file=out)
        else:
            for user in users:
                print(f"{user['name']}\t{','.join(user['tags'])}", file=out)
        return 0
    path = f"/api/users/{segment(args.name)}"
    if command == "delete":
        client.call("DELETE", path)
        print(f"deleted user {args.name}", file=out)
        return 0
    if command == "passwd":
        user = client.call("GET", path)
        client.call("PUT", path, {"password": _new_password(args, stdin), "tags": user["tags"]})
        print(f"changed the password of {args.name}", file=out)
        return 0
    client.call("PUT", path, {"password": _new_password(args, stdin), "tags": args.tags})
    print(f"added user {args.name}", file=out)
    return 0


def run_permission(args: argparse.Namespace, out: TextIO) -> int:
    client = client_for(args)
    command = args.permission_command
    if command == "list":
        permissions = client.call("GET", "/api/permissions")
        if args.vhost is not None:
            permissions = [p for p in permissions if p["vhost"] == args.vhost]
        if args.json:
            print(json.dumps(permissions), file=out)
        else:
            for p in permissions:
                row = (p["vhost"], p["user"], p["configure"], p["write"], p["read"])
                print("\t".join(row), file=out)
        return 0
    path = f"/api/permissions/{segment(args.vhost)}/{segment(args.user)}"
    if command == "clear":
        client.call("DELETE", path)
        print(f"cleared the permissions of {args.user} in {args.vhost}", file=out)
        return 0
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    client.call("PUT", path, body)
    print(f"set the permissions of {args.user} in {args.vhost}", file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "user":
            return run_user(args, sys.stdout)
        return run_permission(args, sys.stdout)
    except AdminError as error:
        print(f"braid {args.command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
