"""Flag helpers the cloud providers share: env twins, comma lists, booleans, common flags.

Kept in `providers` because providers never import the adaptor; the convention is the one of
`adaptor.cli.flags` (every flag has a `PEERPODS_<FLAG>` env twin).
"""

from __future__ import annotations

import argparse
import os

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def csv(text: str) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def truthy(text: object) -> bool:
    """A boolean flag value written as text (1/true/yes/on, any case)."""
    return str(text).strip().lower() in TRUE_WORDS


def env_name(flag: str) -> str:
    """`--aws-region` -> `PEERPODS_AWS_REGION`."""
    return "PEERPODS_" + flag.lstrip("-").upper().replace("-", "_")


def add_flag(parser: argparse.ArgumentParser, flag: str, default: str, help: str) -> None:
    """A string flag with its env twin (PEERPODS_<FLAG>); a flag already added is left alone."""
    if flag in parser._option_string_actions:
        return
    env = env_name(flag)
    value = os.environ.get(env, default)
    shown = f" (default: {default})" if default else ""
    parser.add_argument(flag, default=value, help=f"{help}{shown} [env {env}]")


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every cloud provider shares (CAA names); safe to call once per provider."""
    add_flag(parser, "--instance-type", default="", help="instance type when selection gives none")
    add_flag(
        parser,
        "--allowed-instance-types",
        default="",
        help="comma-separated instance type globs pod VMs may use, e.g. g6.*,p5.48xlarge "
        "(empty: any)",
    )
    add_flag(
        parser, "--pod-vm-image", default="", help="pod VM image (a pod annotation may override)"
    )
