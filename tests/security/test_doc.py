"""docs/security.md shows the mapping table exactly as core/security/mapping.py has it."""

from __future__ import annotations

from pathlib import Path

from core.security.mapping import OPERATION_LIST

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_documented_table_is_the_mapping_table():
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[1].startswith("`"):
            rows.append(tuple(cells))
    expected = [
        (
            rule.protocol,
            f"`{rule.operation}`",
            rule.resource,
            rule.permission,
            rule.kafka_operation,
            "yes" if rule.routing_key else "",
        )
        for rule in OPERATION_LIST
    ]
    assert rows == expected
