"""The ownership table as data (`state/ownership.py`) and as words (`docs/architecture.md`) agree."""

from __future__ import annotations

import re
from pathlib import Path

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.state.kinds import register_kinds
from gpuyard.state.ownership import (
    BACKENDS,
    IDENTITIES,
    JOB,
    OPERATOR,
    OWNERSHIP,
    PARTS,
    SCHEDULER,
    USER,
    allowed,
    owners,
)
from gpuyard.state.store import Store

DOC = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
SECTION = "## Ownership: one writer per object and field"

Row = tuple[str, str, str, tuple[str, ...]]  # (kind, part, writer, backends)


def doc_rules() -> set[Row]:
    """The rows of the section's table, one per part."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "the ownership table is missing"
    out: set[Row] = set()
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        kind = cells[0].strip("`")
        writer = re.findall(r"`([^`]+)`", cells[2])[0]
        backends = BACKENDS if cells[3] == "both" else (cells[3],)
        for part in (p.strip() for p in cells[1].split(",")):
            out.add((kind, part, writer, backends))
    return out


def code_rules() -> set[Row]:
    return {(r.kind, r.part, r.writer, r.backends) for r in OWNERSHIP}


def test_the_docs_table_is_the_code_table() -> None:
    doc, code = doc_rules(), code_rules()
    assert not doc - code, f"in docs/architecture.md, not in state/ownership.py: {sorted(doc - code)}"
    assert not code - doc, f"in state/ownership.py, not in docs/architecture.md: {sorted(code - doc)}"


def test_every_rule_names_a_known_identity_part_and_backend() -> None:
    for rule in OWNERSHIP:
        assert rule.writer in IDENTITIES and rule.part in PARTS, rule
        assert rule.backends and set(rule.backends) <= set(BACKENDS), rule


def test_every_stored_kind_has_a_creator_on_each_backend() -> None:
    store = Store()
    register_kinds(store)
    for kind in store.kinds():
        if kind == "Node":  # on Kubernetes the kubelets', never gpuyard's
            assert owners(kind, "create", backend="kubernetes") == frozenset()
            continue
        for backend in BACKENDS:
            assert owners(kind, "create", backend=backend), f"nobody creates {kind} on {backend}"


def test_the_main_lines_of_the_table() -> None:
    for kind in KIND_INFO:
        assert owners(kind, "status", backend="fake") == {OPERATOR}
        assert owners(kind, "update", backend="kubernetes") == {USER}
    assert owners(JOB, "status", backend="fake") == {OPERATOR}
    assert owners("PodGroup", "status", backend="kubernetes") == {SCHEDULER}
    assert owners("PodGroup", "update", backend="fake") == {OPERATOR}
    assert not allowed(OPERATOR, "Reservation", "create", backend="fake")
    assert not allowed(SCHEDULER, "Pod", "delete", backend="kubernetes")
    assert owners("ResourceQuota", "status", backend="kubernetes") == frozenset()
