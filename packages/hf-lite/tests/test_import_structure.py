"""hf-lite's modules depend on each other one way: no import circle, at module level or inside a function (a
deferred import that only hides a circle counts too). Package ``__init__`` files that re-export their modules are
left out of the graph: importing a name from the package is importing it from the module that defines it."""

import ast
import os

import hf_lite

ROOT = os.path.dirname(hf_lite.__file__)


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    rel = rel.removesuffix(".__init__").removesuffix("__init__")
    return "hf_lite" + (f".{rel}" if rel else "")


def _resolve(current: str, is_package: bool, level: int, module: str | None) -> str:
    parts = current.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                modules[_module_name(path)] = path
    graph = {}
    for mod, path in modules.items():
        is_package = path.endswith("__init__.py")
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom) and node.level:
                target = _resolve(mod, is_package, node.level, node.module)
                for alias in node.names:  # `from . import logging` names a module
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("hf_lite"))
        graph[mod] = {d for d in deps if d in modules and d != mod}
    packages = {m for m, p in modules.items() if p.endswith("__init__.py")}
    return {m: d - packages for m, d in graph.items() if m not in packages}


def _cycles(graph):
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_circles():
    graph = import_graph()
    assert "hf_lite.generation.beam_search" in graph and "hf_lite.tokenization_gpt2" in graph
    assert _cycles(graph) == []
