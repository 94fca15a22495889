"""Flags with environment twins: `--proxy-timeout` can also be set as PEERPODS_PROXY_TIMEOUT."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(h|ms|m|s))+$", re.ASCII)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)", re.ASCII)
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def env_name(flag: str) -> str:
    """The environment twin of a long flag: --static-endpoints -> PEERPODS_STATIC_ENDPOINTS."""
    return "PEERPODS_" + flag.lstrip("-").upper().replace("-", "_")


def add(parser: argparse.ArgumentParser, flag: str, **kwargs: Any) -> argparse.Action:
    """Add a long flag whose default comes from its env twin; the help names the twin."""
    env = env_name(flag)
    raw = os.environ.get(env)
    action = kwargs.get("action")
    if raw is not None:
        if action == "store_true" or isinstance(action, type):
            kwargs["default"] = raw.strip().lower() in ("1", "true", "yes", "on")
        elif "type" in kwargs and callable(kwargs["type"]):
            try:
                kwargs["default"] = kwargs["type"](raw)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                parser.error(f"{env}: {exc}")
        else:
            kwargs["default"] = raw
    help_text = kwargs.get("help", "")
    default = kwargs.get("default")
    suffix = f" [env {env}]"
    if default not in (None, "", False) and "%(default)" not in help_text:
        suffix = f" (default: %(default)s) [env {env}]"
    kwargs["help"] = help_text + suffix
    return parser.add_argument(flag, **kwargs)


def add_default_capacity_type(parser: argparse.ArgumentParser, help_text: str) -> None:
    """--default-capacity-type, as the webhook and `peerpods plan` both take it."""
    from providers.core.capacity import CapacityType

    add(
        parser,
        "--default-capacity-type",
        default=CapacityType.ON_DEMAND.value,
        choices=[kind.value for kind in CapacityType],
        help=help_text,
    )


def duration(text: str) -> float:
    """A CAA-style duration (`30s`, `5m`, `1h30m`, `250ms`) in seconds."""
    text = text.strip()
    if not _DURATION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (use e.g. 30s, 5m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))
