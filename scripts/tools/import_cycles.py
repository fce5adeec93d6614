"""Import cycles between longctx's modules, function-level imports included.

    .venv/bin/python scripts/tools/import_cycles.py            # prints each cycle; exit 1 if there is one
    .venv/bin/python scripts/tools/import_cycles.py --edges    # and the imports that close each cycle

Static: every `import` / `from ... import` in a module's source, at any depth (inside functions
too: a lazy import still ties two modules together), except under `if TYPE_CHECKING:` (never run).
`from pkg import name` counts as an import of pkg.name where that is a module, else of pkg; the
package __init__ that Python runs on the way is not counted (it is not what the code asked for).
A cycle is a strongly connected component of more than one module; the count printed is the
number of such components.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "longctx"


def module_names(root: Path) -> dict[str, Path]:
    """{dotted module name: its file} for every module of the package."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, skipping `if TYPE_CHECKING:` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """{module of the package that `name` imports: the line of the first such import}."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in modules:  # `import a.b.c` of a non-module attribute: its module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    add(alias.name, node.lineno)
            continue
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source.split(".")[0] != PACKAGE:
            continue
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            add(sub if sub in modules else source, node.lineno)
    return found


def graph(root: Path = ROOT) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    modules = module_names(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}, modules


def components(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
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
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return sorted(out)


def a_cycle(group: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """One shortest cycle through the group's first module (breadth first), for the message."""
    members, first = set(group), group[0]
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node]):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [first] + path[::-1][1:] + [first] if len(path) > 1 else [first, node, first]
                if child in members and child not in previous and child != first:
                    previous[child] = node
                    nxt.append(child)
        frontier = nxt
    return group


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--edges", action="store_true", help="print the imports (file:line) inside each cycle")
    args = p.parse_args(argv)
    edges, modules = graph()
    groups = components(edges)
    for group in groups:
        print(f"cycle of {len(group)} modules: " + " -> ".join(a_cycle(group, edges)))
        if args.edges:
            members = set(group)
            for name in group:
                for target, line in sorted(edges[name].items()):
                    if target in members:
                        print(f"    {modules[name].relative_to(ROOT)}:{line}: {name} imports {target}")
    print(f"{len(groups)} import cycle{'s' if len(groups) != 1 else ''} among {len(modules)} modules "
          "(function-level imports counted)")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())
