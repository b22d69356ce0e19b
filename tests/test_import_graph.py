"""The import graph of the lab's packages: one-way between packages, no cycle between modules (issue 18)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("hdrope", "trainer", "sweeps", "analysis")
# which packages each package may import (data flows spec -> sweeps -> trainer -> hdrope; analysis reads results)
ALLOWED = {"hdrope": set(), "trainer": {"hdrope"}, "sweeps": {"trainer", "hdrope"},
           "analysis": {"sweeps", "trainer", "hdrope"}}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every lab module `path` imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES and m != module}


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    return {m: {i for i in _imports(p, m) if i in files} for m, p in files.items()}


def test_packages_import_only_downstream():
    wrong = [(m, i) for m, deps in _graph().items() for i in deps
             if i.split(".")[0] != m.split(".")[0] and i.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert not wrong


def test_no_module_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1 and not m.startswith(f"{d}."):  # a package's __init__ is its modules' parent
                cycles.append([*stack[stack.index(d):], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles


@pytest.mark.parametrize("config_module", ["trainer.config", "trainer.model.args", "trainer.run.optim"])
def test_configs_import_no_model_code(config_module):
    """A config module never imports the decoder (trainer.model.llama) nor builds what it configures."""
    path = REPO / (config_module.replace(".", "/") + ".py")
    assert "trainer.model.llama" not in _imports(path, config_module)


def _defined_names(path: Path) -> set[str]:
    """Names a module defines at top level, plus those it exports lazily through an `_EXPORTS` dict."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))  # a, b = ... too
            exports = any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets)
            if exports and isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):  # TYPE_CHECKING blocks and guarded imports
            for sub in node.body:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def test_every_lab_import_names_something_that_exists():
    """An import of a lab module or name that does not exist fails here, not first in a user's hands."""
    files = {_module(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    missing = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                missing += [(module, a.name) for a in node.names
                            if a.name.split(".")[0] in PACKAGES and a.name not in files]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in PACKAGES:
                if node.module not in files:
                    missing.append((module, node.module))
                    continue
                defined = _defined_names(files[node.module])
                missing += [(module, f"{node.module}.{a.name}") for a in node.names
                            if a.name != "*" and f"{node.module}.{a.name}" not in files and a.name not in defined]
    assert not missing


def test_importing_the_config_tree_loads_no_torch_and_no_encoding():
    """`import trainer.config` (and the `model:` and `optim:` sections it reads) stays light: the encoding registry
    and torch load when a config is made or checked, not on import."""
    import subprocess
    import sys

    code = ("import sys, trainer.config\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('trainer.model.position', "
            "'trainer.model.encodings', 'trainer.model.llama'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"
