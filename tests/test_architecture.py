"""The layout holds: no import circle in src/foco, every import as docs/architecture.md's room table allows (no
arrow from backbones/ or decompose/ back up to world/ among them), a thin CLI, a public API whose every name
resolves, and `python -m foco` as `foco`."""
from __future__ import annotations

import ast
import re
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


ARCHITECTURE = SRC.parent.parent / "docs" / "architecture.md"


def _rooms() -> list[tuple[str, set[str] | None]]:
    """docs/architecture.md's room table, bottom up: (room key, the rooms its "may import" column names; None for
    "anything", i.e. every room before it). A remark in parentheses is prose, not a rule."""
    text = ARCHITECTURE.read_text()
    rows = re.findall(r"^\| `([^`]+)` \| .*? \| (.*?) \|$", text[text.index("## The rooms"):], re.M)
    keys = [room.rstrip("/").removesuffix(".py") for room, _ in rows]
    out = []
    for (room, col), key in zip(rows, keys):
        col = re.sub(r"\([^)]*\)", "", col).strip()
        if col.startswith("nothing") or not col:
            named: set[str] | None = set()
        elif "anything" in col or "everything" in col:
            named = None
        else:
            named = {w.strip().split()[0].split("'")[0] for w in re.split(r"[,;]| and ", col) if w.strip()}
            unknown = named - set(keys)
            assert not unknown, f"{ARCHITECTURE.name}: room {room} may import {sorted(unknown)}, which are not rooms"
        out.append((key, named))
    return out


def _room_of(module: str, keys: list[str]) -> int:
    rel = module[len("foco."):] if module != "foco" else "__init__"
    found = [i for i, k in enumerate(keys) if rel == k.replace("/", ".") or rel.startswith(k.replace("/", ".") + ".")]
    assert found, f"{module} belongs to no room of {ARCHITECTURE.name}'s table: add its row"
    return max(found)


def test_every_import_follows_the_room_table():
    """Every import goes to the importer's own room or one listed before it, and to one its "may import" column
    names (where it names them); the package's __init__ imports lazily only (no foco import at module level)."""
    rooms = _rooms()
    keys = [k for k, _ in rooms]
    assert len(keys) > 20 and keys.index("utils") < keys.index("backbones") < keys.index("cli")
    bad = []
    for module, targets in _graph().items():
        a = _room_of(module, keys)
        for target in targets:
            b = _room_of(target, keys)
            if a == b or keys[a] == "__init__":
                continue
            if b > a or (rooms[a][1] is not None and keys[b] not in rooms[a][1]):
                bad.append(f"{module} -> {target} ({keys[a]} may not import {keys[b]})")
    assert bad == [], "\n".join(bad)
    init = ast.parse((SRC / "__init__.py").read_text())
    eager = [n.lineno for n in init.body
             if (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("foco")))
             or (isinstance(n, ast.Import) and any(a.name.startswith("foco") for a in n.names))]
    assert eager == [], f"foco/__init__.py imports foco at module level (lines {eager}): it is lazy only"


def test_the_room_rules_catch_a_planted_climb(monkeypatch):
    import test_architecture as me
    graph = _graph()
    graph["foco.utils.io"] = graph["foco.utils.io"] | {"foco.train.loop"}  # utils reaching up to train
    monkeypatch.setattr(me, "_graph", lambda: graph)
    with pytest.raises(AssertionError, match="foco.utils.io -> foco.train.loop"):
        test_every_import_follows_the_room_table()


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
