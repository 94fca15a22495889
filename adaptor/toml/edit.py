"""Surgical edits of a TOML file someone else wrote (containerd's, Kata's): set a few keys and
leave every other byte as it was, comments and layout included, so that operators can diff the
file against its origin and `unmark` can take exactly the edits back out.

Every line an edit adds ends with MARK; a line it replaces follows it, commented out with WAS in
front. `unmark` drops the marked lines and uncomments what they replaced. Each edit is checked by
reading the result back with `tomllib`: it must be the original document with exactly the keys
set, or the edit is refused (TomlEditError) and nothing is written.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from adaptor.toml.write import key as toml_key
from adaptor.toml.write import value as toml_value

MARK = "# added by peerpods node install"
WAS = "#peerpods-was: "
_LEGACY_WAS = "# was: "
_BARE = re.compile(r"[A-Za-z0-9_-]+")


class TomlEditError(ValueError):
    """The file cannot be edited in place as asked (its layout or content is in the way)."""


@dataclass(frozen=True)
class Edit:
    """Set `key` of the table at `table` (() is the top level) to `value`."""

    table: tuple[str, ...]
    key: str
    value: Any


@dataclass
class _Entry:
    kind: str  # "header", "kv" or "other"
    start: int
    end: int  # last line, inclusive
    path: tuple[str, ...] = ()
    array: bool = False


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t":
        at += 1
    return at


def _parse_key(text: str, at: int) -> tuple[tuple[str, ...], int]:
    """A dotted key starting at `at`: its parts and where it ends."""
    parts: list[str] = []
    while True:
        at = _skip_space(text, at)
        if at < len(text) and text[at] == '"':
            end = at + 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            parts.append(json.loads(text[at : end + 1]))
            at = end + 1
        elif at < len(text) and text[at] == "'":
            end = text.find("'", at + 1)
            if end == -1:
                raise TomlEditError("an unterminated key")
            parts.append(text[at + 1 : end])
            at = end + 1
        else:
            match = _BARE.match(text, at)
            if match is None:
                raise TomlEditError(f"cannot read a key at {text[at : at + 20]!r}")
            parts.append(match.group(0))
            at = match.end()
        at = _skip_space(text, at)
        if at < len(text) and text[at] == ".":
            at += 1
            continue
        return tuple(parts), at


def _value_end(text: str, at: int) -> int:
    """Where the value starting at `at` ends: the newline after it (or the end of text)."""
    depth = 0
    while at < len(text):
        char = text[at]
        if text.startswith('"""', at) or text.startswith("'''", at):
            quote = text[at : at + 3]
            close = text.find(quote, at + 3)
            while close != -1 and quote == '"""' and _escaped(text, close):
                close = text.find(quote, close + 1)
            if close == -1:
                raise TomlEditError("an unterminated multi-line string")
            at = close + 3
            while at < len(text) and text[at] == quote[0]:
                at += 1  # up to two quotes may end the string's content
            continue
        if char == '"':
            at += 1
            while at < len(text) and text[at] != '"':
                at += 2 if text[at] == "\\" else 1
        elif char == "'":
            at = text.find("'", at + 1)
            if at == -1:
                raise TomlEditError("an unterminated string")
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "#":
            newline = text.find("\n", at)
            at = len(text) if newline == -1 else newline
            continue
        elif char == "\n" and depth <= 0:
            return at
        at += 1
    return at


def _escaped(text: str, at: int) -> bool:
    backslashes = 0
    while at - backslashes - 1 >= 0 and text[at - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _layout(lines: list[str]) -> list[_Entry]:
    """The file's lines grouped: table headers, key/value pairs (with all their lines), rest."""
    text = "\n".join(lines)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    entries: list[_Entry] = []
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if not stripped or stripped.startswith("#"):
            entries.append(_Entry("other", index, index))
            index += 1
            continue
        offset = starts[index] + len(lines[index]) - len(lines[index].lstrip())
        if stripped.startswith("["):
            array = stripped.startswith("[[")
            path, _ = _parse_key(text, offset + (2 if array else 1))
            entries.append(_Entry("header", index, index, path, array))
            index += 1
            continue
        path, at = _parse_key(text, offset)
        if at >= len(text) or text[at] != "=":
            raise TomlEditError(f"line {index + 1}: not a key = value line")
        end = _value_end(text, at + 1)
        last = index
        while last + 1 < len(lines) and starts[last + 1] <= end:
            last += 1
        entries.append(_Entry("kv", index, last, path))
        index = last + 1
    return entries


def _region(entries: list[_Entry], table: tuple[str, ...]) -> tuple[int, int, int] | None:
    """(header line, first entry index, end entry index) of `table`; the top level has no
    header (-1); None when no header defines it."""
    if not table:
        end = next((i for i, e in enumerate(entries) if e.kind == "header"), len(entries))
        return -1, 0, end
    for number, entry in enumerate(entries):
        if entry.kind == "header" and not entry.array and entry.path == table:
            end = next(
                (i for i in range(number + 1, len(entries)) if entries[i].kind == "header"),
                len(entries),
            )
            return entry.start, number + 1, end
    return None


def _indent(lines: list[str], entries: list[_Entry], first: int, end: int, header: int) -> str:
    for entry in entries[first:end]:
        if entry.kind == "kv":
            line = lines[entry.start]
            return line[: len(line) - len(line.lstrip())]
    if header >= 0:
        line = lines[header]
        return line[: len(line) - len(line.lstrip())]
    return ""


def _apply(lines: list[str], edit: Edit, mark: str = MARK) -> list[str]:
    entries = _layout(lines)
    assignment = f"{toml_key(edit.key)} = {toml_value(edit.value)}"
    region = _region(entries, edit.table)
    if region is None:
        header = "[" + ".".join(toml_key(part) for part in edit.table) + "]"
        block = [mark, f"{header} {mark}", f"{assignment} {mark}"]
        if lines and lines[-1] == "":  # keep the final newline last
            return [*lines[:-1], *block, ""]
        return [*lines, *block]
    header_line, first, end = region
    indent = _indent(lines, entries, first, end, header_line)
    for entry in entries[first:end]:
        if entry.kind == "kv" and entry.path == (edit.key,):
            old = lines[entry.start : entry.end + 1]
            own = old[0][: len(old[0]) - len(old[0].lstrip())]
            if old[0].endswith(mark):  # ours already: what it replaced stays noted below it
                replaced = [f"{own}{assignment} {mark}"]
            else:
                replaced = [f"{own}{assignment} {mark}", *(WAS + line for line in old)]
            return [*lines[: entry.start], *replaced, *lines[entry.end + 1 :]]
    kvs = [e for e in entries[first:end] if e.kind == "kv"]
    if kvs:
        after = kvs[-1].end + 1
    elif header_line >= 0:
        after = header_line + 1
    else:
        after = 0
    return [*lines[:after], f"{indent}{assignment} {mark}", *lines[after:]]


def _expected(document: dict[str, Any], edits: Iterable[Edit]) -> dict[str, Any]:
    result = copy.deepcopy(document)
    for edit in edits:
        table = result
        for part in edit.table:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise TomlEditError(f"{'.'.join(edit.table)} is not a table")
        table[edit.key] = edit.value
    return result


def apply(text: str, edits: list[Edit], mark: str = MARK) -> str:
    """`text` with every edit made, or TomlEditError; unchanged text when nothing differs.
    Each added line ends with `mark` (another tool's edits name that tool: `unmark` and
    `marked` know the node installer's alone)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlEditError(f"not TOML: {exc}") from None
    wanted = _expected(document, edits)
    if wanted == document:
        return text
    lines = text.split("\n")
    for edit in edits:
        if _expected(tomllib.loads("\n".join(lines)), [edit]) != tomllib.loads("\n".join(lines)):
            lines = _apply(lines, edit, mark)
    result = "\n".join(lines)
    try:
        read_back = tomllib.loads(result)
    except tomllib.TOMLDecodeError as exc:
        raise TomlEditError(f"the edit would not be TOML ({exc})") from None
    if read_back != wanted:
        raise TomlEditError("the edit would change more than the keys it sets")
    return result


def unmark(text: str) -> str:
    """`text` with every marked line removed and what it replaced put back."""
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.endswith(MARK):
            index += 1
            while index < len(lines) and lines[index].startswith(WAS):
                out.append(lines[index].removeprefix(WAS))
                index += 1
            # the first installer's imports line kept what it replaced as "# was: "
            legacy = index < len(lines) and lines[index].startswith(_LEGACY_WAS + "imports")
            if line.startswith("imports =") and legacy:
                out.append(lines[index].removeprefix(_LEGACY_WAS))
                index += 1
            continue
        out.append(line)
        index += 1
    return "\n".join(out)


def marked(text: str) -> bool:
    """Whether `text` holds an edit of ours."""
    return any(line.endswith(MARK) for line in text.split("\n"))
