"""docs/architecture.md names real code: every ``path.py:name`` step it gives exists.

A step is written ``path/to/module.py:function`` or ``path/to/module.py:Class.method`` in
backticks. The test parses each module (no import) and looks the name up among its top-level
functions and classes, and the methods and nested functions of those classes. A renamed or
moved function then fails here until the page is updated.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
STEP = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py):([A-Za-z_][\w.]*)`")


def steps(text: str) -> list[tuple[str, str]]:
    return STEP.findall(text)


def defined_names(path: Path) -> set[str]:
    """``name`` and ``Class.name`` for every function and class of ``path``, at any depth of
    classes (``Outer.Inner.method``)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(prefix + t.id for t in targets if isinstance(t, ast.Name))

    visit(ast.parse(path.read_text()).body, "")
    return names


def missing_steps(text: str, root: Path) -> list[str]:
    missing = []
    for file, name in steps(text):
        path = root / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif name not in defined_names(path):
            missing.append(f"{file}:{name}")
    return missing


def test_every_step_of_the_architecture_page_exists() -> None:
    text = DOC.read_text()
    assert len(steps(text)) >= 30, "the page gives the publish and delivery path per protocol"
    assert missing_steps(text, ROOT) == []


@pytest.mark.parametrize("protocol", ["AMQP", "MQTT", "Kafka"])
def test_the_page_gives_both_paths_of_each_protocol(protocol: str) -> None:
    text = DOC.read_text()
    for path in ("publish", "delivery"):
        heading = re.search(rf"^#+ {protocol}: {path}\b.*$", text, re.M | re.I)
        assert heading is not None, f"no '{protocol}: {path}' section"


def test_a_wrong_name_is_reported(tmp_path: Path) -> None:
    module = tmp_path / "pkg" / "mod.py"
    module.parent.mkdir()
    module.write_text("class A:\n    def run(self):\n        pass\n\ndef top():\n    pass\n")
    text = "`pkg/mod.py:A.run` `pkg/mod.py:top` `pkg/mod.py:A.gone` `pkg/none.py:x`"
    assert missing_steps(text, tmp_path) == ["pkg/mod.py:A.gone", "pkg/none.py (no such file)"]
