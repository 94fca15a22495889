"""The layers stay layers: every import points down (or sideways inside one layer), modules import
each other in no cycle, and `docs/architecture.md` names exactly the layers the code has.

The layer order is read from the architecture page's layer picture, so the page and the code
cannot drift apart: a new sub-package must be placed in the picture before its first import
passes this test. Imports are read from the source with `ast`, so an import inside a function
or under `TYPE_CHECKING` counts exactly like one at the top of a module.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("adaptor", "providers", "webhook")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
# Generated protobuf code is not ours to layer.
SKIP = ("adaptor.ttrpc.gen",)
# The adaptor reaches the webhook only where the CLI runs the webhook's decision offline.
WEBHOOK_IMPORTERS = ("adaptor.cli",)


def documented_layers() -> list[str]:
    """The layers, bottom first, from the picture between the layer markers of the page."""
    text = ARCHITECTURE.read_text()
    match = re.search(r"<!-- layers:begin -->\n```text\n(.*?)```\n<!-- layers:end -->", text, re.S)
    assert match, "docs/architecture.md has no layer picture between its layer markers"
    names = re.findall(r"^\s*([a-z_]+(?:\.[a-z_]+)*)\s", match.group(1), re.M)
    return list(reversed(names))  # the picture draws the top layer first


def module_names() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not name.startswith(SKIP):
                modules[name] = path
    return modules


MODULES = module_names()


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every project module `module` imports, with its line, wherever the import stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield (candidate if candidate in MODULES else base), node.lineno


def project_imports() -> dict[str, set[tuple[str, int]]]:
    graph: dict[str, set[tuple[str, int]]] = {}
    for module, path in MODULES.items():
        graph[module] = {
            (target, line)
            for target, line in imported(module, path)
            if target.split(".")[0] in PACKAGES and target in MODULES and target != module
        }
    return graph


def layer_of(module: str, layers: list[str]) -> int | None:
    matches = [
        i for i, layer in enumerate(layers) if module == layer or module.startswith(layer + ".")
    ]
    return max(matches, key=lambda i: len(layers[i])) if matches else None


def test_the_page_names_every_package_the_code_has_and_no_other() -> None:
    layers = documented_layers()
    assert len(layers) == len(set(layers)), "a layer is named twice in docs/architecture.md"
    missing = [layer for layer in layers if layer not in MODULES]
    assert not missing, f"docs/architecture.md names packages that do not exist: {missing}"
    unplaced = [m for m in MODULES if m not in PACKAGES and layer_of(m, layers) is None]
    assert not unplaced, f"modules in no documented layer: {unplaced}"
    top_packages = sorted(
        m for m in MODULES if m.count(".") == 1 and (ROOT / m.replace(".", "/")).is_dir()
    )
    undocumented = [p for p in top_packages if p not in layers and not p.startswith(SKIP)]
    assert not undocumented, f"sub-packages missing from docs/architecture.md: {undocumented}"


def test_every_import_points_down() -> None:
    layers = documented_layers()
    upward: list[str] = []
    for module, targets in project_imports().items():
        here = layer_of(module, layers)
        for target, line in sorted(targets):
            there = layer_of(target, layers)
            if here is None or there is None:
                continue  # the top-level packages' own (empty) __init__ modules
            if there > here:
                upward.append(f"{module}:{line} imports {target} ({layers[there]} is above)")
            if (
                target.startswith("webhook")
                and module.startswith("adaptor")
                and not module.startswith(WEBHOOK_IMPORTERS)
            ):
                upward.append(f"{module}:{line} imports {target} outside the CLI")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: every component of more than one module is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
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


def without_facades(graph: dict[str, set[tuple[str, int]]]) -> dict[str, set[str]]:
    """The graph where a package's `__init__` re-exporting its private modules is not an edge
    back: `pkg/_a.py` importing `pkg` (for a sibling it exports) reads as importing the package's
    public surface, which Python resolves after `_a` itself."""
    simple: dict[str, set[str]] = {}
    for module, targets in graph.items():
        simple[module] = {target for target, _ in targets if not module.startswith(target + ".")}
    return simple


def test_no_module_cycle() -> None:
    cycles = strongly_connected(without_facades(project_imports()))
    assert not cycles, "modules that import each other: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from adaptor.cli import main\n", {"adaptor.cli.main"}),
        ("def f():\n    from providers.clouds import aws\n", {"providers.clouds.aws"}),
        ("if TYPE_CHECKING:\n    import webhook\n", {"webhook"}),
    ],
)
def test_imports_are_found_wherever_they_stand(
    tmp_path: Path, source: str, expected: set[str]
) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert {target for target, _ in imported("providers.core.probe", path)} == expected


def test_an_upward_import_is_caught() -> None:
    layers = documented_layers()
    assert layer_of("providers.core.errors", layers) is not None
    low = layer_of("providers.core.errors", layers)
    high = layer_of("adaptor.cli.main", layers)
    assert low is not None and high is not None and low < high
