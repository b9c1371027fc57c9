"""The house rules, checked on the source: layers import only downwards, no import cycles between modules or between
the units of the layer map, modules stay readable.

Layers, bottom to top (a module may import its own layer and any layer below it):

    0  ids, text, errors, settings, pagination, observability (logging, metrics), tool_calls (plain data),
       request_model, registry (the one shape of a registry)
    1  db (the database, models, replicas), embeddings, keys (envelope encryption and the key provider, used by
       repositories), and every domain's repositories (all SQL lives there)
    2  engine (the only package that knows tokens and caches), memory, tenants
    3  runtime (one transition's mechanics)
    4  sessions (the session service: committing transitions, compaction, locking)
    5  forget, policies (the context policy objects: their turn, forget and provenance halves), and the sessions'
       API shapes (a turn's answer can be a forget plan)
    6  webhooks, openai_compat (the OpenAI-compatible objects over sessions and forgets), keys.admin (the operator's
       key commands: they settle forgets' pending shreds, and check every domain's sealed columns)
    7  container (the composition root: builds every service once, injects the policy registry)
    8  web (the HTTP plumbing both front doors share: SSE, consistency, deps, problems, middleware)
    9  the front doors: every domain's endpoints, openai_compat's streaming, mcp, console, health
    10 main, cli, serving (the processes), openapi_spec

A domain's schemas (its API shapes) sit with its service, as in Polar: a service takes and returns them.

A unit is an entry of the layer map (the longest one holding a module): `app.sessions.endpoints` and `app.sessions`
are different units. Units must not import each other in a cycle either, even on one layer: a cycle between two
packages of one layer hides from a check of layers and of module cycles alone.

All SQL lives in repositories (`<domain>/repository.py`, `<domain>/repositories/`) and in app/db.

Imports under `if TYPE_CHECKING:` count: a cycle hidden from the interpreter is still a cycle for the reader.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400

DOMAINS = (
    "sessions", "forget", "memory", "webhooks", "tenants", "openai_compat", "threads", "subjects", "holds", "retention",
)
LAYERS: dict[str, int] = {
    "app.ids": 0, "app.text": 0, "app.errors": 0, "app.settings": 0, "app.pagination": 0, "app.observability": 0,
    "app.tool_calls": 0, "app.request_model": 0, "app.registry": 0,
    "app.db": 1, "app.embeddings": 1, "app.keys": 1,
    "app.sessions.repositories": 1, "app.forget.repositories": 1, "app.memory.repositories": 1,
    "app.tenants.repository": 1, "app.openai_compat.repository": 1, "app.threads.repositories": 1,
    "app.subjects.repository": 1, "app.holds.repository": 1, "app.holds.guard": 1,
    "app.retention.repository": 1,
    "app.engine": 2, "app.memory": 2, "app.tenants": 2, "app.threads": 2,
    "app.runtime": 3,
    "app.sessions": 4,
    "app.forget": 5, "app.policies": 5, "app.sessions.schemas": 5,
    "app.webhooks": 6, "app.openai_compat": 6, "app.keys.admin": 6, "app.subjects": 6,
    "app.holds": 6, "app.retention": 6,
    "app.container": 7,
    "app.web": 8,
    **{f"app.{domain}.endpoints": 9 for domain in DOMAINS},
    "app.openai_compat.streaming": 9, "app.mcp": 9, "app.console": 9, "app.health": 9,
    "app.main": 10, "app.cli": 10, "app.serving": 10, "app.openapi_spec": 10, "app.__main__": 10,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "app").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _unit(module: str) -> str | None:
    """The longest entry of the layer map that holds `module`."""
    best: str | None = None
    for package in LAYERS:
        if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best)):
            best = package
    return best


def _layer(module: str) -> int | None:
    unit = _unit(module)
    return None if unit is None else LAYERS[unit]


def _unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        a = _unit(source)
        for target in targets:
            b = _unit(target)
            if a is not None and b is not None and a != b:
                units[a].add(b)
    return units


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


def test_no_cycles_between_units() -> None:
    units = _unit_graph(_imports(_modules()))
    assert _cycles(units, sorted(LAYERS)) == []


SQL_BUILDERS = frozenset({"select", "insert", "update", "delete", "text", "func", "literal_column", "bindparam"})


def _writes_sql(tree: ast.AST) -> list[str]:
    """What in a module writes SQL: SQLAlchemy's statement builders imported, or a `Statement` built."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sqlalchemy"):
            found += [f"imports {a.name}" for a in node.names if a.name in SQL_BUILDERS]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Statement":
            found.append("builds a Statement")
    return found


def _may_write_sql(module: str) -> bool:
    """Repositories, and app/db for the database's own operations (migrations, health, the WAL position)."""
    return module.startswith("app.db.") or ".repositories." in module or module.endswith(".repository")


def test_sql_lives_in_repositories() -> None:
    outside = {
        name: found
        for name, path in _modules().items()
        if not _may_write_sql(name) and (found := _writes_sql(ast.parse(path.read_text())))
    }
    assert outside == {}


def test_the_sql_check_sees_sql_outside_a_repository() -> None:
    tree = ast.parse("from sqlalchemy import select\nQ = Statement('SELECT 1')\n")
    assert _writes_sql(tree) == ["imports select", "builds a Statement"]
    assert not _may_write_sql("app.memory.catalog") and _may_write_sql("app.memory.repositories.records")


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
    # Two units of one layer importing each other through different modules: no module cycle, no upward import,
    # still a cycle (the forget machinery importing the registry that joins its halves).
    same_layer = {"app.forget.executor": {"app.policies"}, "app.policies": {"app.forget.per_policy"}}
    assert _cycles(same_layer, sorted(same_layer)) == []
    assert _cycles(_unit_graph(same_layer), sorted(LAYERS)) == [["app.forget", "app.policies"]]
