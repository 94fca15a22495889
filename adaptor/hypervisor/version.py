"""The package version Version() answers: installed metadata, else the source tree's pyproject."""

from __future__ import annotations

import importlib.metadata
import tomllib
from functools import cache
from pathlib import Path

UNKNOWN = "0.0.0+unknown"


@cache
def package_version() -> str:
    """`peerpods`'s version string."""
    try:
        return importlib.metadata.version("peerpods")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        with pyproject.open("rb") as handle:
            return str(tomllib.load(handle)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return UNKNOWN
