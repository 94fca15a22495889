"""`peerpods` entry point: builds every subcommand's parser (cheap) and imports the chosen
subcommand's implementation only when it runs, so `peerpods select --provider aws` never imports
the Azure SDK."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from adaptor.runtime import logs
from providers.core.errors import PeerpodsError

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
    "node": (
        "adaptor.cli.node",
        "on a worker node: install or remove the kata-remote runtime (Kata and containerd)",
    ),
    "dra": (
        "adaptor.cli.dra",
        "the DRA driver gpu.peerpods.io: publish the cloud's GPUs as ResourceSlices",
    ),
    "podvm": (
        "adaptor.cli.podvm",
        "in the pod VM: create the planned devices, write their CDI specs",
    ),
    "warm-pool": (
        "adaptor.cli.warm_pool",
        "list or drain the warm pools' VMs in the cloud account (an uninstall)",
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


class _Parser(argparse.ArgumentParser):
    """The top-level parser: once the command line is parsed, every setting it did not give is
    filled from its env twin or its default (`flags.resolve`, only the chosen command's); an
    invalid env value exits 2 with one line naming the variable."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        from adaptor.cli import flags

        parsed, rest = super().parse_known_args(args, namespace)
        try:
            flags.resolve(parsed)
        except PeerpodsError as exc:
            self.exit(2, f"peerpods {getattr(parsed, 'command', '')}: {exc}\n")
        return parsed, rest


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="peerpods",
        description="Peer-pods cloud-API adaptor with GPU-aware instance selection.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, help="print the package version and exit"
    )
    _log_flags(parser, top=True)
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=argparse.ArgumentParser
    )
    for name, (module_name, summary) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        child = sub.add_parser(name, help=summary, description=summary)
        module.configure(child)
        _log_flags(child, top=False)
        child.set_defaults(_module=module_name)
    return parser


def _log_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """`--log-level` and `--log-format`, before or after the subcommand, with env twins.

    Both copies come from `LogSettings`; whichever the command line gives wins, and neither
    given, the env twin or the default fills them in (`flags.resolve`).
    """
    from adaptor.cli import flags
    from adaptor.cli.settings import LogSettings

    flags.add_settings(parser, LogSettings, help=None if top else "as before the subcommand")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # an invalid flag or env twin value exits 2 here
    try:
        logs.configure(args.log_level, args.log_format)
        module = importlib.import_module(args._module)
        return int(module.run(args))
    except PeerpodsError as exc:
        print(f"peerpods {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except OSError as exc:
        print(
            f"peerpods {args.command}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
            file=sys.stderr,
        )
        return 1


def _reader_gone() -> int:
    """The reader of stdout went away (`peerpods plan POD | head -1`): stop quietly, as a
    program killed by SIGPIPE does (exit 141), and send what is still buffered, which would
    fail again at exit, to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (a test's capture): nothing to flush
        pass
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
