"""Go's `filepath.Match`, which containerd's `imports` globs use: `*` and `?` never match `/`,
a class is `[...]` negated by `^`, and `\\` escapes. Python's fnmatch differs on all three (its
`*` crosses directories), so `/etc/containerd/*.toml` would seem to cover a drop-in in
`/etc/containerd/conf.d/` that containerd never reads."""

from __future__ import annotations

import re
from functools import lru_cache


class BadPattern(ValueError):
    """Go's filepath.ErrBadPattern: containerd refuses to start on such an import."""


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    at = 0
    while at < len(pattern):
        char = pattern[at]
        at += 1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "\\":
            if at >= len(pattern):
                raise BadPattern(pattern)
            out.append(re.escape(pattern[at]))
            at += 1
        elif char == "[":
            at = _klass(pattern, at, out)
        else:
            out.append(re.escape(char))
    return re.compile("".join(out))


def _klass(pattern: str, at: int, out: list[str]) -> int:
    negate = at < len(pattern) and pattern[at] == "^"
    at += negate
    ranges: list[str] = []
    first = True
    while True:
        if at >= len(pattern):
            raise BadPattern(pattern)
        if pattern[at] == "]" and not first:
            at += 1
            break
        first = False
        low, at = _class_char(pattern, at)
        high = low
        if at < len(pattern) and pattern[at] == "-":
            high, at = _class_char(pattern, at + 1)
            if high < low:
                raise BadPattern(pattern)
        ranges.append(re.escape(low) if low == high else f"{re.escape(low)}-{re.escape(high)}")
    # Go: a negated class never matches the separator either
    body = "".join(ranges)
    out.append(f"[^/{body}]" if negate else f"(?!/)[{body}]")
    return at


def _class_char(pattern: str, at: int) -> tuple[str, int]:
    if at >= len(pattern) or pattern[at] in "-]":
        raise BadPattern(pattern)
    if pattern[at] == "\\":
        at += 1
        if at >= len(pattern):
            raise BadPattern(pattern)
    return pattern[at], at + 1


def match(pattern: str, name: str) -> bool:
    """Go's filepath.Match(pattern, name) on Linux (BadPattern for a malformed pattern)."""
    return _compile(pattern).fullmatch(name) is not None


def is_glob(pattern: str) -> bool:
    """Whether containerd expands an import (filepath.Glob) rather than taking it as a path:
    only one with a `*` in it."""
    return "*" in pattern
