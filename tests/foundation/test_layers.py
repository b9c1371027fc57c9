"""The house rules, checked on the source: layers import only downwards, no import cycles, modules stay readable.

Layers, bottom to top (a module may import its own layer and any layer below it):

    0  ids, text, errors, settings, pagination, observability (logging, metrics), tool_calls (plain data), request_model
    1  db (models, repositories), embeddings, provenance, client (the SDK stands alone)
    2  engine (the only package that knows tokens and caches), memory, tenants
    3  runtime (one transition's mechanics)
    4  sessions (the session service: turns, compaction, locking)
    5  forget, policies (the context policy objects: their turn, forget and provenance halves, one registry)
    6  webhooks
    7  api, openai_compat, mcp, console, container (HTTP and the composition root)
    8  main, cli, serving (the processes), openapi_spec

Imports under `if TYPE_CHECKING:` count: a cycle hidden from the interpreter is still a cycle for the reader.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400

LAYERS: dict[str, int] = {
    "app.ids": 0, "app.text": 0, "app.errors": 0, "app.settings": 0, "app.pagination": 0, "app.observability": 0,
    "app.tool_calls": 0, "app.request_model": 0,
    "app.db": 1, "app.embeddings": 1, "app.provenance": 1, "app.client": 1,
    "app.engine": 2, "app.memory": 2, "app.tenants": 2,
    "app.runtime": 3,
    "app.sessions": 4,
    "app.forget": 5, "app.policies": 5,
    "app.webhooks": 6,
    "app.api": 7, "app.openai_compat": 7, "app.mcp": 7, "app.console": 7, "app.container": 7,
    "app.main": 8, "app.cli": 8, "app.serving": 8, "app.openapi_spec": 8, "app.__main__": 8,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "app").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _layer(module: str) -> int | None:
    """The layer of the longest registered package that holds `module`."""
    best: tuple[int, int] | None = None
    for package, level in LAYERS.items():
        if (module == package or module.startswith(package + ".")) and (best is None or len(package) > best[0]):
            best = (len(package), level)
    return None if best is None else best[1]


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            candidates: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from app.forget import regenerate` imports the submodule, not the package.
                candidates = [*(f"{node.module}.{alias.name}" for alias in node.names), node.module]
            elif isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            for target in candidates:
                if target in modules and target != name:
                    graph[name].add(target)
                    break
    return graph


def _cycles(graph: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in _modules() if m != "app" and _layer(m) is None)
    assert unplaced == [], f"give these a layer in LAYERS: {unplaced}"


def test_no_module_imports_a_higher_layer() -> None:
    modules = _modules()
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in _imports(modules).items()
        for target in targets
        if (a := _layer(source)) is not None and (b := _layer(target)) is not None and b > a
    )
    assert upward == []


def test_no_import_cycles() -> None:
    modules = _modules()
    assert _cycles(_imports(modules), sorted(modules)) == []


def test_modules_stay_readable_in_one_sitting() -> None:
    long = sorted(
        (len(path.read_text().splitlines()), name)
        for name, path in _modules().items()
        if len(path.read_text().splitlines()) > MAX_LINES
    )
    assert long == [], f"split these modules (over {MAX_LINES} lines): {long}"


def test_the_checker_sees_a_planted_cycle_and_an_upward_import() -> None:
    """The checks above can fail: the same functions flag a cycle and an upward import when there is one."""
    graph = {"app.runtime.a": {"app.forget.b"}, "app.forget.b": {"app.runtime.a"}}
    assert _cycles(graph, sorted(graph)) == [["app.forget.b", "app.runtime.a"]]
    a, b = _layer("app.runtime.a"), _layer("app.forget.b")
    assert a is not None and b is not None and b > a
