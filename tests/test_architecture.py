"""The architecture as rules a test can check: imports flow one way through the layers of docs (DESIGN: commands /
widgets -> plots -> records / timing -> backends -> kernels -> plan -> reference -> quant -> config), no import cycle,
no demo main() in the library, modules under 600 lines, the live knobs only, no history in the code, experiments on
the public API, and data/INDEX.csv naming every recorded file."""

from __future__ import annotations

import ast
import csv
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "mlalab"

#: The layer of each top-level part of the library; a module may import its own layer or lower ones only.
LAYERS = {
    "config": 0, "checks": 0, "io": 0, "inputs": 0,
    "quant": 1,
    "reference": 2, "traffic": 2, "": 2,  # ("": the package root re-exports config, inputs and reference)
    "plan": 3,
    "kernels": 4,
    "backends": 5,
    "records": 6, "timing": 6, "accuracy": 6,
    "plots": 7,
    "report": 8,
    "widgets": 9, "commands": 9, "__main__": 9,
}  # fmt: skip


def _modules() -> dict[str, Path]:
    mods = {}
    for p in LIB.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every mlalab module `name` imports, at any depth of its code (function-level imports included)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `from .x import name`: the module x; `from . import x`: the module x
                t = t.rpartition(".")[0]
            # (a module's own ancestor packages are already being imported when it runs: not an edge)
            if t.startswith("mlalab") and t != name and not name.startswith(t + "."):
                out.add(t)
    return out


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    return LAYERS[part]


def test_no_import_cycle_and_imports_flow_down_the_layers() -> None:
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    upward = [(m, t) for m, ts in graph.items() for t in ts if _layer(t) > _layer(m)]
    assert not upward, f"imports against the layers (importer -> imported): {sorted(upward)}"
    # cycles: Tarjan-free check by depth-first search with colours
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(t) :] + [t])}")
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_cycle_check_can_fail() -> None:
    """The walker sees function-level imports (the way an earlier cycle hid)."""
    src = "def f():\n    from ..plots.timeline import x\n"
    p = ROOT / "test-artifacts" / "cyc.py"
    p.parent.mkdir(exist_ok=True)
    p.write_text(src)
    try:
        assert _imports("mlalab.kernels.cyc", p, {"mlalab.plots.timeline", "mlalab.plots"}) == {"mlalab.plots.timeline"}
    finally:
        p.unlink()


def test_library_modules_are_small_and_have_no_demo_main() -> None:
    for name, p in _modules().items():
        text = p.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 600, f"{name}: {len(text.splitlines())} lines (keep modules under 600)"
        if name != "mlalab.__main__":
            assert "\ndef main(" not in text and '__name__ == "__main__"' not in text, f"{name} has a demo main()"


def test_the_code_says_what_it_does_now() -> None:
    """No numbered log labels (work periods, runs) and no paths outside the repository in the library."""
    label = re.compile(r"\bsession \d+|\(run ?\d+\)|\brun \d+\b|\bsession\s*\d+", re.IGNORECASE)
    outside = re.compile(r"/(work|home|root)/")
    for name, p in _modules().items():
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            assert not label.search(line), f"{name}:{i}: a log label in library code: {line.strip()}"
            assert not outside.search(line), f"{name}:{i}: a path outside the repository: {line.strip()}"


def test_kernel_config_holds_only_live_knobs() -> None:
    from mlalab.kernels import KernelConfig

    assert len(dataclasses.fields(KernelConfig)) <= 10


def test_experiments_use_the_public_api() -> None:
    for p in sorted((ROOT / "experiments").glob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree) and ast.get_docstring(tree).startswith("Question:"), p.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlalab"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{p.name} imports private {private} from {node.module}"
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                raise AssertionError(f"{p.name}:{node.lineno}: assigns an attribute (monkeypatching?)")


def test_docs_sizes() -> None:
    assert (ROOT / "README.md").stat().st_size <= 12 * 1024, "README.md: keep it <= 12 KB, for users"
    assert (ROOT / "data" / "README.md").stat().st_size <= 10 * 1024, "data/README.md: keep it <= 10 KB"
    for doc in ("kernels.md", "journal.md", "aiter.md"):
        assert (ROOT / "docs" / doc).exists(), doc


def test_data_index_names_every_recorded_file() -> None:
    with open(ROOT / "data" / "INDEX.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and list(rows[0]) == ["file", "kind", "date", "commit", "question"]
    indexed = [r["file"] for r in rows]
    on_disk = sorted(str(p.relative_to(ROOT / "data")) for p in (ROOT / "data").rglob("*")
                     if p.is_file() and p.name not in ("README.md", "INDEX.csv"))  # fmt: skip
    assert sorted(indexed) == on_disk, (sorted(set(on_disk) - set(indexed)), sorted(set(indexed) - set(on_disk)))
    assert indexed == sorted(indexed), "INDEX.csv: one row per file, sorted by file"
    for r in rows:
        assert r["kind"] == r["file"].split("/")[0], r
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]) and r["question"].strip(), r


@pytest.mark.parametrize("path", ["notebooks", "tests", "experiments"])
def test_no_path_outside_the_repository(path: str) -> None:
    for p in (ROOT / path).rglob("*"):
        if p.suffix in (".py", ".ipynb"):
            assert not re.search(r"/(work|home|root)/", p.read_text(encoding="utf-8")), p
