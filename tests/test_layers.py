"""The import direction of the packages, read from the source (every import statement, also
those inside functions): sidrec/ (the ground floor) → models/ → tasks/ → flows/ → the CLI
and bench/. Stage modules never import each other; shared stage helpers live in tasks/shared/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sidrec", "models", "tasks", "flows", "bench")
TOP_FLOOR = {"sidrec.cli", "sidrec.__main__"}
"""The CLI may start flows and call any layer."""
NEVER = {
    "sidrec": {"models", "tasks", "flows", "bench"},
    "models": {"tasks", "flows", "bench"},
    "tasks": {"flows", "bench"},
    "flows": {"bench"},
}
"""Packages a module of the key's package must not import."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(path: Path) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts as ``a.b``, or as
    ``a.b.c`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in PACKAGES and _is_module(n)}
    return found


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


GRAPH = {
    module_name(p): project_imports(p)
    for package in PACKAGES
    for p in sorted((ROOT / package).rglob("*.py"))
}


def test_the_graph_sees_the_packages() -> None:
    assert {"sidrec.config", "models.recommender", "tasks.sft", "flows.retrain"} <= set(GRAPH)
    assert "tasks.shared.inputs" in GRAPH["tasks.sft"]


@pytest.mark.parametrize("package", sorted(NEVER))
def test_no_import_goes_up_a_floor(package: str) -> None:
    broken = sorted(
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package and module not in TOP_FLOOR
        for target in targets
        if target.split(".")[0] in NEVER[package]
    )
    assert not broken, f"{package}/ imports a higher floor: {broken}"


def test_no_stage_module_imports_another() -> None:
    stage_modules = {m for m in GRAPH if m.count(".") == 1 and m.startswith("tasks.")}
    broken = sorted(
        f"{module} → {target}"
        for module, targets in GRAPH.items()
        if module.startswith("tasks.")
        for target in targets & stage_modules
        if target != module
    )
    assert not broken, f"stage modules import each other (use tasks/shared/): {broken}"


def test_no_import_cycle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, f"import cycles: {[' → '.join(c) for c in cycles]}"
