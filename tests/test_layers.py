"""The import rules of ARCHITECTURE.md, checked on the source tree.

- A gateway imports from ``core`` only the Broker API (``core.api``): never ``core.log``,
  ``core.state`` or any other part under it.
- One protocol's gateway never imports another's. What the three share sits beside them
  (``SHARED_GATEWAY_MODULES``: the transport base) and imports none of them.
- A codec (bytes in, frames out) imports no asyncio and nothing of the core.
- ``core`` never imports ``gateway``, ``spark`` or ``braid``; ``spark`` imports of the core only
  the read side of ``core.log``.

Every import counts, also one inside a function or under ``TYPE_CHECKING``. The last test runs
the same check over a copy of the tree with one bad import added, so the check is seen to fail.

No import cycles among the modules of ``core``, ``gateway``, ``spark`` and ``braid``: an import
inside a function counts as much as one at the top (it only hides the cycle until the call).
Imports under ``if TYPE_CHECKING:`` do not count: they never run, so they cannot make one
module's import wait for another's, and annotations need them (``from __future__ import
annotations`` keeps them strings).

And the Broker API's "who is calling" rule (``core/api/__init__.py``): every public method of
``BrokerAPI`` takes ``context: ClientContext`` first, but the plumbing that docstring lists by
name, and that list names only methods without one.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
from pathlib import Path

import pytest

import core.api
from core.api import BrokerAPI

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ("amqp", "mqtt", "kafka")
GATEWAY_MAY_IMPORT_FROM_CORE = ("core.api",)
# Modules beside the protocol packages that all three use; they import no protocol's package.
SHARED_GATEWAY_MODULES = ("gateway.transport",)
# The sans-IO codec modules of each gateway: bytes in, frames/events out, and back.
CODEC_MODULES = {
    "amqp": ("codec", "constants", "errors", "events", "fieldtable", "properties"),
    "mqtt": (
        "codec",
        "decoder",
        "encoder",
        "errors",
        "packets",
        "packet_types",
        "properties",
        "reason_codes",
        "_frozen",
        "_wire",
    ),
    "kafka": ("codec", "wire", "lenient", "errors", "apis"),
}
# What spark/ may read of the core: the log's read API and its names.
SPARK_MAY_IMPORT_FROM_CORE = (
    "core.log",
    "core.log.reader",
    "core.log.record",
    "core.log.batches",
    "core.log.names",
    "core.log.consumequeue",
    "core.log.tags",
    "core.log.txnindex",  # which Kafka transactions committed: pure reads of the log
)


# A gateway never reaches through the API into the broker's parts.
REACH_THROUGH = re.compile(
    r"\b(?:broker|node|api)\.(?:_broker|_node|store|topics|flow|bindings|ack_queues|offsets"
    r"|groups|transactions|half_messages|timers|shard|shards)\b"
)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import in ``path``; ``from a import b`` gives ``a.b`` as
    well as ``a`` so that ``from core import log`` is seen as ``core.log``, except where ``a``
    is the Broker API itself (``from core.api import Message`` names a value, not a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module not in GATEWAY_MAY_IMPORT_FROM_CORE:
                found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_violations(root: Path) -> list[str]:
    """Every import in the tree under ``root`` that breaks a rule, as ``file:line: why``."""
    problems: list[str] = []

    def report(path: Path, line: int, why: str) -> None:
        problems.append(f"{path.relative_to(root)}:{line}: {why}")

    for path in sorted((root / "gateway").rglob("*.py")):
        parts = path.relative_to(root / "gateway").parts
        own = parts[0] if len(parts) > 1 else None
        is_codec = own is not None and path.stem in CODEC_MODULES.get(own, ())
        for line, module in _imports(path):
            if _within(module, "core") and module != "core":
                # The package's own modules (core/api/base.py, ...) are not for gateways.
                if module not in GATEWAY_MAY_IMPORT_FROM_CORE:
                    report(path, line, f"a gateway imports {module} (only core.api)")
                elif is_codec:
                    report(path, line, f"a codec imports {module}")
            for other in PROTOCOLS:
                if other != own and _within(module, f"gateway.{other}"):
                    who = f"gateway.{own}" if own is not None else f"gateway.{path.stem}"
                    report(path, line, f"{who} imports {module}")
            if is_codec and _within(module, "asyncio"):
                report(path, line, "a codec imports asyncio")
            if is_codec and module in SHARED_GATEWAY_MODULES:
                report(path, line, f"a codec imports {module}")
        for number, text in enumerate(path.read_text().splitlines(), 1):
            for reach in REACH_THROUGH.findall(text):
                report(path, number, f"a gateway reaches through the broker: {reach}")
    for path in sorted((root / "core").rglob("*.py")):
        for line, module in _imports(path):
            for upper in ("gateway", "spark", "braid"):
                if _within(module, upper):
                    report(path, line, f"core imports {module}")
    for path in sorted((root / "spark").rglob("*.py")):
        for line, module in _imports(path):
            if _within(module, "gateway") or _within(module, "braid"):
                report(path, line, f"spark imports {module}")
            elif (
                _within(module, "core")
                and module != "core"
                and module not in SPARK_MAY_IMPORT_FROM_CORE
                and module.rsplit(".", 1)[0] not in SPARK_MAY_IMPORT_FROM_CORE
            ):
                report(path, line, f"spark imports {module} (only core.log's read side)")
    return problems


def test_the_tree_keeps_the_layers() -> None:
    assert layer_violations(ROOT) == []


def test_every_shared_gateway_module_named_here_exists() -> None:
    for name in SHARED_GATEWAY_MODULES:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


def test_every_codec_module_named_here_exists() -> None:
    for protocol, modules in CODEC_MODULES.items():
        for name in modules:
            assert (ROOT / "gateway" / protocol / f"{name}.py").is_file(), (protocol, name)


@pytest.mark.parametrize(
    ("file", "line", "expected"),
    [
        ("gateway/amqp/channel.py", "from core.log.store import LogStore", "imports core.log"),
        ("gateway/kafka/fetch.py", "import core.state", "imports core.state"),
        ("gateway/mqtt/hub.py", "from core import broker", "imports core.broker"),
        (
            "gateway/amqp/vhost.py",
            "from core.api.queues import QueueCalls",
            "imports core.api.queues",
        ),
        ("gateway/mqtt/session.py", "from gateway.amqp import codec", "imports gateway.amqp"),
        ("gateway/amqp/codec.py", "import asyncio", "a codec imports asyncio"),
        ("gateway/kafka/fetch.py", "api._broker.store.read(0)", "reaches through the broker"),
        ("gateway/amqp/vhost.py", "api._node.shard.store.read(0)", "reaches through the broker"),
        ("core/log/store.py", "from gateway.kafka import wire", "core imports gateway"),
        ("spark/source.py", "from core.broker import Node", "spark imports core.broker"),
        ("gateway/transport.py", "from gateway.mqtt import hub", "imports gateway.mqtt"),
        ("gateway/mqtt/decoder.py", "import gateway.transport", "a codec imports gateway.tr"),
    ],
)
def test_the_check_fails_on_a_bad_import(
    tmp_path: Path, file: str, line: str, expected: str
) -> None:
    copy = tmp_path / "tree"
    for top in ("core", "gateway", "spark"):
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / file
    target.write_text(target.read_text() + f"\n\ndef _late(api) -> None:\n    {line}\n")
    problems = layer_violations(copy)
    assert any(expected in problem and problem.startswith(file) for problem in problems), problems


def calls_without_context(api: type) -> set[str]:
    """The public methods of ``api`` whose first parameter after ``self`` is not
    ``context: ClientContext``."""
    found = set()
    for name, method in inspect.getmembers(api, inspect.isfunction):
        if name.startswith("_"):
            continue
        params = list(inspect.signature(method).parameters.values())[1:]
        first = params[0] if params else None
        if first is None or first.name != "context" or first.annotation != "ClientContext":
            found.add(name)
    return found


def plumbing_listed(docstring: str) -> set[str]:
    """The names (in double backquotes) of the list of calls without a context."""
    start = docstring.index("The calls without")
    end = docstring.index("``tests/test_layers.py``", start)
    return set(re.findall(r"``(\w+)``", docstring[start:end]))


def test_every_api_call_takes_the_client_context_but_the_plumbing_listed() -> None:
    listed = plumbing_listed(core.api.__doc__ or "")
    methods = {name for name, _ in inspect.getmembers(BrokerAPI, inspect.isfunction)}
    assert listed <= methods, listed - methods  # a name that is no method
    assert calls_without_context(BrokerAPI) == listed


def test_a_call_without_context_is_reported() -> None:
    class Wider(BrokerAPI):
        def new_lookup(self, name: str) -> bool:
            return bool(name)

    assert calls_without_context(Wider) - calls_without_context(BrokerAPI) == {"new_lookup"}


# -- import cycles ------------------------------------------------------------------------------

CYCLE_PACKAGES = ("core", "gateway", "spark", "braid")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:`` (``typing.TYPE_CHECKING`` too)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for statement in node.body:
                    hidden.update(id(inner) for inner in ast.walk(statement))
    return hidden


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``CYCLE_PACKAGES`` it imports (anywhere in it, but under
    ``TYPE_CHECKING``). ``from a import b`` is an edge to ``a.b`` when that is a module, else
    to ``a``; relative imports are resolved."""
    paths = {
        _module_name(path, root): path
        for top in CYCLE_PACKAGES
        for path in sorted((root / top).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        hidden = _type_checking_nodes(tree)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    if f"{source}.{alias.name}" in paths:
                        edges.add(f"{source}.{alias.name}")
                    elif source in paths:
                        edges.add(source)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycles() -> None:
    assert import_cycles(import_graph(ROOT)) == []


@pytest.mark.parametrize(
    ("file", "line", "cycle"),
    [
        # a function-level import counts
        (
            "core/log/recovery.py",
            "    from core.log.store import LogStore",
            ["core.log.recovery", "core.log.store"],
        ),
        # so does a relative one
        (
            "gateway/amqp/channel.py",
            "    from .session import Session",
            ["gateway.amqp.channel", "gateway.amqp.session"],
        ),
    ],
)
def test_the_cycle_check_finds_an_added_cycle(
    tmp_path: Path, file: str, line: str, cycle: list[str]
) -> None:
    copy = tmp_path / "tree"
    for top in CYCLE_PACKAGES:
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / file
    target.write_text(target.read_text() + f"\n\ndef _late() -> None:\n{line}\n")
    assert any(set(cycle) <= set(found) for found in import_cycles(import_graph(copy)))


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "a.py").write_text("from core import b\n")
    (tmp_path / "core" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core import a\n"
    )
    for top in CYCLE_PACKAGES[1:]:
        (tmp_path / top).mkdir()
    assert import_cycles(import_graph(tmp_path)) == []
    (tmp_path / "core" / "b.py").write_text("def later() -> None:\n    from core import a\n")
    assert import_cycles(import_graph(tmp_path)) == [["core.a", "core.b"]]
