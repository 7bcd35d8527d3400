"""The layout holds: no import circle in src/foco, no arrow from backbones/ or decompose/ back up to world/, a thin
CLI, a public API whose every name resolves, and `python -m foco` as `foco`."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "foco"
FORBIDDEN = (("foco.backbones", "foco.world"), ("foco.decompose", "foco.world"), ("foco.edits", "foco.world"))  # (importer, imported) prefixes


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The foco modules `name` imports (function-level imports too), resolved to the longest known module."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            while c and c not in modules:
                c = c.rsplit(".", 1)[0] if "." in c else ""
            if c and c != name:
                found.add(c)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_src():
    assert _cycles(_graph()) == []


def test_nothing_climbs_back_to_world():
    bad = [(m, t) for m, targets in _graph().items() for t in targets for src, dst in FORBIDDEN
           if (m == src or m.startswith(src + ".")) and (t == dst or t.startswith(dst + "."))]
    assert bad == []


def test_cli_is_thin():
    for path in (SRC / "cli").glob("*.py"):
        lines = path.read_text().splitlines()
        assert len(lines) <= 250, (path.name, len(lines))
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= 60, (path.name, node.name, length)


def test_public_api_resolves():
    import foco
    for name in foco.__all__:
        assert getattr(foco, name) is not None, name
    with pytest.raises(AttributeError):
        foco.no_such_name  # noqa: B018


def test_python_m_foco_is_foco():
    out = subprocess.run([sys.executable, "-m", "foco", "eval", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--benchmark" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "foco", "eval", "--methods", "sum"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--benchmark NAME --root PATH" in bad.stderr
