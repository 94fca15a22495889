"""scripts/make_catalogs.py loaded as a module, so tests call the snapshot maker itself (it is a
script, not part of an installed package)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_catalogs.py"


@functools.cache
def make_catalogs() -> ModuleType:
    """The script's module, loaded once (registered first: its dataclasses look themselves up)."""
    spec = importlib.util.spec_from_file_location("make_catalogs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_catalogs", module)
    spec.loader.exec_module(module)
    return module
