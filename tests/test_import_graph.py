"""The package's floors hold: no import circles, no upward import but the allowed ones.

scripts/import_graph.py draws the graph (every import counts: module level, inside
functions and under TYPE_CHECKING alike); its FLOORS and ALLOWED_UPWARD are the rules,
docs/architecture.md explains them.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph() -> SimpleNamespace:
    """scripts/import_graph.py's names (it is a script, not a module of the package)."""
    return SimpleNamespace(**runpy.run_path(str(ROOT / "scripts" / "import_graph.py")))


@pytest.fixture(scope="module")
def loaded(graph: SimpleNamespace) -> tuple[set[str], dict[str, list[tuple[str, int]]]]:
    return graph.load(str(ROOT / "radixlm"))  # type: ignore[no-any-return]


def _upward(graph: SimpleNamespace,
            edges: dict[str, list[tuple[str, int]]]) -> set[tuple[str, str]]:
    return {(src, dst) for src, targets in edges.items() for dst, _ in targets
            if graph.floor_of(src) >= 0 and graph.floor_of(dst) > graph.floor_of(src)}


def test_no_import_circles(graph: SimpleNamespace, loaded: tuple) -> None:
    nodes, edges = loaded
    found = graph.circles(nodes, edges)
    assert found == [], "modules that import each other: " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_upward_import_but_the_allowed_ones(graph: SimpleNamespace, loaded: tuple) -> None:
    _, edges = loaded
    upward = _upward(graph, edges)
    unexpected = sorted(upward - set(graph.ALLOWED_UPWARD))
    assert not unexpected, (
        "imports from a lower floor to a higher one (move the code to its floor, or add the "
        "pair to ALLOWED_UPWARD with its reason and to docs/architecture.md): "
        + ", ".join(f"{src} -> {dst}" for src, dst in unexpected))
    stale = sorted(set(graph.ALLOWED_UPWARD) - upward)
    assert not stale, f"ALLOWED_UPWARD names imports that are gone: {stale}"


def test_every_module_has_a_floor(graph: SimpleNamespace, loaded: tuple) -> None:
    nodes, _ = loaded
    unplaced = sorted(m for m in nodes if graph.floor_of(m) < 0 and m != "radixlm")
    assert not unplaced, f"modules on no floor (add them to FLOORS): {unplaced}"


def test_allowed_upward_imports_are_documented(graph: SimpleNamespace) -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    for src, dst in graph.ALLOWED_UPWARD:
        assert f"{src} -> {dst}" in text or f"`{src}` → `{dst}`" in text, (
            f"docs/architecture.md does not name the allowed upward import {src} -> {dst}")


def test_the_graph_sees_every_kind_of_import(graph: SimpleNamespace, tmp_path: Path) -> None:
    """A function-level and a TYPE_CHECKING import count like a module-level one, and a
    circle made of them is found (the check cannot pass by not looking)."""
    pkg = tmp_path / "radixlm"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from radixlm.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from radixlm.low.a import x\n")
    nodes, edges = graph.load(str(pkg))
    assert graph.circles(nodes, edges) == [["radixlm.low.a", "radixlm.low.b"]]
