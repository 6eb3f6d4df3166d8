"""The package's layers import one way: no module imports a package above its own, lazily or not.

The order, from the bottom, is `LAYERS`; the modules at the top of `specpilot/` (errors, env,
config) form the lowest layer together, `cli` the highest. An import inside a function counts
the same as one at the top of a file: a lazy import still ties the two packages together.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specpilot"

LAYERS = ("errors", "env", "config", "w12", "kernels", "models", "engine", "guard", "bench", "control",
          "memory", "loop", "cli")
RANK = {name: i for i, name in enumerate(LAYERS)}
RANK.update(errors=0, env=0, config=0, __init__=0, __main__=len(LAYERS))


def layer_of(path: Path, package: Path) -> str:
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_layers(path: Path, package: Path) -> set[tuple[str, int]]:
    """(layer, line) for every specpilot import in the file, relative imports resolved."""
    found = set()
    rel = path.relative_to(package).parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["specpilot", *rel[: len(rel) - node.level]]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
            if names[0] == "specpilot":  # from specpilot import x: a layer, or a name of the package root
                names = [f"specpilot.{a.name}" if a.name in RANK else "specpilot.__init__" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "specpilot" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def upward_imports(package: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(package.rglob("*.py")):
        own = layer_of(path, package)
        where = path.relative_to(package.parent)
        for target, line in sorted(imported_layers(path, package), key=lambda t: t[1]):
            if target not in RANK:
                bad.append(f"{where}:{line}: imports unknown layer {target!r}")
            elif target != own and RANK[target] > RANK[own]:
                bad.append(f"{where}:{line}: {own} imports {target} (a layer above it)")
    return bad


def test_every_subpackage_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert packages | modules <= set(RANK), sorted((packages | modules) - set(RANK))


def test_no_package_imports_a_layer_above_it():
    assert upward_imports() == []


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    """The walker is not blind: lazy and relative upward imports inside a function are reported."""
    pkg = tmp_path / "specpilot"
    (pkg / "w12").mkdir(parents=True)
    (pkg / "w12" / "x.py").write_text("from specpilot import errors, __version__\n"
                                      "def f():\n    from specpilot.loop import run\n    from ..cli import main\n")
    assert upward_imports(pkg) == ["specpilot/w12/x.py:3: w12 imports loop (a layer above it)",
                                   "specpilot/w12/x.py:4: w12 imports cli (a layer above it)"]
