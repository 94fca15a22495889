"""JSON Patch (RFC 6902) from two JSON documents: the minimal ops that turn one into the other.

Objects are compared key by key, so an annotation added to a pod without annotations becomes one
`add` of the whole map (a path under a missing map would not apply). Lists of equal length are
compared element-wise (containers keep their indexes); anything else is replaced whole.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def escape(token: str) -> str:
    """A JSON Pointer reference token: "~" is "~0", "/" is "~1" (in that order)."""
    return token.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[Op]:
    """Ops turning `old` into `new` (empty when equal)."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Op] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in new.items():
            where = f"{path}/{escape(key)}"
            if key not in old:
                ops.append({"op": "add", "path": where, "value": value})
            else:
                ops.extend(diff(old[key], value, where))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        ops = []
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            ops.extend(diff(a, b, f"{path}/{index}"))
        return ops
    if type(old) is type(new) and old == new:
        return []
    return [{"op": "replace", "path": path, "value": new}]
