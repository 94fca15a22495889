"""Each package's public names come from its `__init__` (a sorted `__all__` of names that exist),
and no code outside a package reaches into its private `_modules`."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SURFACES = [
    "adaptor.cdi",
    "adaptor.devices",
    "adaptor.podnet",
    "adaptor.podvm",
    "adaptor.runtime",
    "adaptor.status",
    "providers.clouds.loaders",
]


@pytest.mark.parametrize("package", SURFACES)
def test_all_is_sorted_and_every_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    exported = module.__all__
    assert exported == sorted(exported, key=_isort_order)
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


def _isort_order(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions, each alphabetical (ruff's order for `__all__`)."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name


def _private_reaches(root: Path, path: Path) -> list[str]:
    """`a.b._c` imported by a module outside package `a.b`, as `file:line a.b._c`."""
    relative = path.relative_to(root).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    package = ".".join(parts if relative.name == "__init__" else parts[:-1])
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            pieces = name.split(".")
            for depth, piece in enumerate(pieces[1:], start=1):
                if piece.startswith("_") and not piece.startswith("__"):
                    owner = ".".join(pieces[:depth])
                    reach = f"{relative}:{node.lineno} {'.'.join(pieces[: depth + 1])}"
                    outside = package != owner and not package.startswith(owner + ".")
                    if outside and reach not in found:
                        found.append(reach)
                    break
    return found


def test_no_code_outside_a_package_imports_its_private_modules() -> None:
    reaches = [
        reach
        for top in ("adaptor", "providers", "webhook")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "gen" not in path.relative_to(ROOT).parts
        for reach in _private_reaches(ROOT, path)
    ]
    assert reaches == []


def test_the_check_sees_a_reach_into_a_private_module(tmp_path: Path) -> None:
    """The walk above finds what it looks for (a file that reaches in, and one that may)."""
    text = "from adaptor.podnet._model import Tunnel\n"
    outside = tmp_path / "adaptor" / "cli" / "probe.py"
    inside = tmp_path / "adaptor" / "podnet" / "_probe.py"
    for path in (outside, inside):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert _private_reaches(tmp_path, outside) == ["adaptor/cli/probe:1 adaptor.podnet._model"]
    assert _private_reaches(tmp_path, inside) == []
