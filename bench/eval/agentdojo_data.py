"""AgentDojo's environments, injection vectors, attack template and injection goals, read at run time from the
installed `agentdojo` package (never copied into this repository).

The package is installed with --no-deps (its runtime pulls in openai, anthropic, langchain, google-genai...), so
nothing here imports it: the YAML files are parsed with pyyaml (with AgentDojo's `!include` tag), and the attack
template and each injection task's GOAL are read from the Python sources with `ast` (string constants and f-strings
over module and class constants only; a goal that needs anything else is skipped)."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

SUITES = ("banking", "slack", "travel", "workspace")
# The identifiers an injection plants: IBANs, e-mail addresses, links. The attacker's identifier is the target.
IDENTIFIER = re.compile(
    r"\b[A-Z]{2}\d{12,32}\b|[\w.+-]+@[\w-]+\.[\w.]+\w|(?:https?://|www\.)[\w./-]+\w", re.IGNORECASE
)


class AgentDojoMissing(RuntimeError):
    """`agentdojo` is not installed (the `eval` extra: `pip install --no-deps agentdojo`)."""


@dataclass(frozen=True)
class InjectionGoal:
    suite: str
    task: str  # the injection task's class name
    goal: str
    identifier: str  # the attacker's identifier the goal names


@dataclass(frozen=True)
class Vector:
    suite: str
    name: str  # the injection vector (placeholder) name
    description: str
    document: str  # the environment item holding it, rendered as text, with `{name}` still in it


def package_dir() -> Path:
    spec = importlib.util.find_spec("agentdojo")  # finds the package without running its __init__
    if spec is None or spec.origin is None:
        raise AgentDojoMissing("the agentdojo package is not installed: pip install --no-deps agentdojo")
    return Path(spec.origin).parent


class _IncludeLoader(yaml.SafeLoader):
    """AgentDojo's environment files use `!include other.yaml` (relative to the including file)."""

    root: Path = Path(".")


def _include(loader: _IncludeLoader, node: yaml.Node) -> Any:
    path = loader.root / str(loader.construct_scalar(node))  # type: ignore[arg-type]
    return load_yaml(path)


_IncludeLoader.add_constructor("!include", _include)


def load_yaml(path: Path) -> Any:
    class Loader(_IncludeLoader):
        root = path.parent

    with open(path) as stream:
        handle: IO[str] = stream
        return yaml.load(handle, Loader=Loader)


def attack_template(root: Path) -> str:
    """The `important_instructions` attack's jailbreak string (the attack the AgentDojo paper reports first)."""
    tree = ast.parse((root / "attacks" / "important_instructions_attacks.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ImportantInstructionsAttack":
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "_JB_STRING" for t in stmt.targets
                ):
                    return str(ast.literal_eval(stmt.value))
    raise AgentDojoMissing("agentdojo's ImportantInstructionsAttack._JB_STRING was not found")


def _constants(body: list[ast.stmt], outer: dict[str, str]) -> dict[str, str]:
    out = dict(outer)
    for stmt in body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
            stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        )
        value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and value is not None:
            text = _string(value, out)
            if text is not None:
                out[target.id] = text
    return out


def _string(node: ast.expr, names: dict[str, str]) -> str | None:
    """A string constant or an f-string over known names; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                if value.value.id not in names:
                    return None
                parts.append(names[value.value.id])
            else:
                return None
        return "".join(parts)
    return None


def injection_goals(root: Path, suite: str, version: str = "v1") -> list[InjectionGoal]:
    tree = ast.parse((root / "default_suites" / version / suite / "injection_tasks.py").read_text())
    module = _constants(tree.body, {})
    goals: list[InjectionGoal] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        names = _constants(node.body, module)
        goal = names.get("GOAL")
        if goal is None:
            continue
        found = IDENTIFIER.search(goal)
        if found:
            goals.append(InjectionGoal(suite, node.name, goal, found.group(0).rstrip(".")))
    return goals


def _holders(
    node: Any, placeholder: re.Pattern[str], path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], Any]]:
    """Every smallest environment item (a dict in a list, or a string leaf) that holds an injection placeholder."""
    found: list[tuple[tuple[str, ...], Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _holders(value, placeholder, (*path, str(key)))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            inner = _holders(item, placeholder, (*path, str(i)))
            if inner and isinstance(item, dict):
                found.append(((*path, str(i)), item))
            else:
                found += inner
    elif isinstance(node, str) and placeholder.search(node):
        found.append((path, node))
    return found


def _filler(keep: str, defaults: dict[str, str]) -> Callable[[re.Match[str]], str]:
    """Keep `{keep}` as a placeholder; every other one becomes its default."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return "{" + name + "}" if name == keep else defaults.get(name, "")

    return fill


def vectors(root: Path, suite: str, max_chars: int = 700, min_chars: int = 60) -> list[Vector]:
    """The suite's injection vectors, each with the environment item it sits in as a document (other placeholders
    filled with their defaults, as AgentDojo does for a task without that injection)."""
    base = root / "data" / "suites" / suite
    environment = load_yaml(base / "environment.yaml")
    specs: dict[str, Any] = load_yaml(base / "injection_vectors.yaml") or {}
    # A placeholder is `{name}` for a name the suite's injection_vectors.yaml declares.
    placeholder = re.compile(r"\{(" + "|".join(re.escape(k) for k in specs) + r")\}")
    out: list[Vector] = []
    for path, item in _holders(environment, placeholder):
        text = item if isinstance(item, str) else yaml.safe_dump(item, sort_keys=False, allow_unicode=True)
        for name in dict.fromkeys(placeholder.findall(text)):
            if name not in specs:
                continue
            others = {k: str((specs.get(k) or {}).get("default", "")) for k in placeholder.findall(text) if k != name}
            rendered = placeholder.sub(_filler(name, others), text)
            if len(rendered) > max_chars:  # keep the CPU runs short: cut around the placeholder
                at = rendered.index("{" + name + "}")
                start = max(0, at - max_chars // 2)
                rendered = rendered[start: start + max_chars]
                if "{" + name + "}" not in rendered:
                    continue
            if len(rendered) < min_chars:  # a bare channel name is no document to read
                continue
            header = f"{suite} environment, {'/'.join(path)}"
            out.append(Vector(suite, name, str((specs[name] or {}).get("description", "")), f"[{header}]\n{rendered}"))
    return out
