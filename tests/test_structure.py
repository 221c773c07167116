"""The import graph of the project's own modules, deferred imports included: no circle between
modules (a lazy import inside a function hid the enroot pair's), the layers point one way
(runtime <- deploy <- toolchain <- tasks.py), and the Ray agent does not load the launcher."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "deploy", "toolchain")
LAYER = {"runtime": 0, "deploy": 1, "toolchain": 2, "tasks": 3}


def modules() -> dict[str, Path]:
    found = {"tasks": ROOT / "tasks.py"}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules PATH imports, anywhere in the file; `from P import name` is the module P.name
    when that is a module, else P."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in known:
                    out.add(full)
                elif node.module in known:
                    out.add(node.module)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_around_a_circle():
    assert cycles(graph()) == []


def test_the_layers_point_one_way():
    backwards = [f"{m} -> {d}" for m, deps in graph().items() for d in deps
                 if LAYER[d.split(".")[0]] > LAYER[m.split(".")[0]]]
    assert backwards == []


def test_the_ray_agent_does_not_load_the_launcher():
    g = graph()
    reach, todo = set(), ["runtime.cluster.ray_agent"]
    while todo:
        for d in g[todo.pop()]:
            if d not in reach:
                reach.add(d)
                todo.append(d)
    assert "runtime.cluster.launch" not in reach


def test_the_checker_finds_a_circle():
    """The check itself can fail: a made-up circle is found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
