"""No state in the process where an object should hold it: in `providers` and `webhook`, no
`global` statement, no module-level ContextVar or thread pool, and no empty container made at
module level to be filled later (a cache, a registry of observers). Caches and pools live on the
objects that own them (`Selector`, `CatalogLoader`, `CloudCalls`, `CatalogView`), built once and
passed in."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("providers", "webhook")
MAKERS = {"dict", "list", "set", "OrderedDict", "defaultdict", "WeakValueDictionary",
          "WeakKeyDictionary", "ContextVar", "ThreadPoolExecutor",
          "ProcessPoolExecutor"}  # fmt: skip


def _called(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _findings(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    found = [f"{where}:{n.lineno}: global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is None:
            continue
        empty = (isinstance(value, ast.Dict) and not value.keys) or (
            isinstance(value, ast.List | ast.Set) and not value.elts
        )
        maker = _called(value)
        if empty or (maker in MAKERS and not (maker in ("dict", "list", "set") and value.args)):
            found.append(f"{where}:{node.lineno}: module-level {maker or 'empty container'}")
    return found


def test_no_process_wide_state_in_providers_and_webhook() -> None:
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += _findings(path)
    assert found == []


def test_the_check_sees_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    text = (
        "import contextvars\n_CACHE: dict[str, int] = {}\n_SEEN = []\n"
        "_LIMITS = contextvars.ContextVar('x')\nTABLE = {'a': 1}\n"
        "def f() -> None:\n    global _SEEN\n"
    )
    sample.write_text(text)
    found = _findings(sample, tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "global", "module-level empty container", "module-level empty container",
        "module-level ContextVar",
    ]  # fmt: skip
