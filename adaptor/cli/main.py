"""`peerpods` entry point: builds every subcommand's parser (cheap) and imports the chosen
subcommand's implementation only when it runs, so `peerpods select --provider aws` never imports
the Azure SDK."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from adaptor import logs
from providers.errors import PeerpodsError

# subcommand -> module under adaptor.cli with `configure(parser)` and `run(args) -> int`
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("adaptor.cli.serve", "run the node daemon Kata's remote hypervisor talks to"),
    "webhook": ("adaptor.cli.webhook", "run the admission webhook"),
    "select": ("adaptor.cli.select", "which instance type a request gets, and why"),
    "plan": ("adaptor.cli.plan", "the whole decision for a pod manifest, without a cluster"),
    "cdi": ("adaptor.cli.cdi", "validate, list and apply CDI specs"),
    "catalog": (
        "adaptor.cli.catalog",
        "refresh a catalog snapshot with types and prices from the cloud's public sources",
    ),
    "podvm": (
        "adaptor.cli.podvm",
        "in the pod VM: create the planned devices, write their CDI specs",
    ),
}


class _VersionAction(argparse.Action):
    """`--version`: the installed package's version (its metadata), looked up only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("nargs", 0)
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        from adaptor.hypervisor.version import package_version

        print(f"{parser.prog} {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peerpods",
        description="Peer-pods cloud-API adaptor with GPU-aware instance selection.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the package version and exit"
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--log-format", default="json", choices=["json", "text"], help="log line format (stderr)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, summary) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=summary, description=summary)
        module.configure(child)
        child.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args))
    except PeerpodsError as exc:
        print(f"peerpods {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(
            f"peerpods {args.command}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
