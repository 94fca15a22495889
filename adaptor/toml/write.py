"""TOML out: the subset containerd and Kata configurations use (tables, strings, integers,
floats, booleans, arrays of scalars), written so that `tomllib` reads back the same document.

The standard library only reads TOML; the node installer writes a few small files, which does not
justify a dependency.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps(document: Mapping[str, Any]) -> str:
    """The document as TOML: its plain keys first, then each table, depth first."""
    lines: list[str] = []
    _table(document, (), lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def key(name: str) -> str:
    """A key as TOML writes it: bare when it can be, else a basic string."""
    return name if _BARE.match(name) else _string(name)


def value(item: Any) -> str:
    """A value as TOML writes it (scalars and arrays of scalars)."""
    return _value(item, ())


def _table(table: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)]
    tables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if path and (plain or not tables):
        lines.append("")
        lines.append("[" + ".".join(key(p) for p in path) + "]")
    for name, value in plain:
        lines.append(f"{key(name)} = {_value(value, (*path, name))}")
    for name, value in tables:
        _table(value, (*path, name), lines)


def _value(value: Any, where: tuple[str, ...]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{'.'.join(where)}: {value} has no TOML spelling here")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Sequence):
        if any(isinstance(item, Mapping) for item in value):
            raise ValueError(f"{'.'.join(where)}: arrays of tables are not written")
        return "[" + ", ".join(_value(item, where) for item in value) + "]"
    raise ValueError(f"{'.'.join(where)}: {type(value).__name__} is not a TOML value")


def _string(text: str) -> str:
    # A JSON string is a TOML basic string (JSON never writes \/), but for DEL, which TOML
    # wants escaped and JSON leaves as it is.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
