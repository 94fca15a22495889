"""`peerpods webhook` (placeholder until its issue lands: it refuses to run)."""

from __future__ import annotations

import argparse

from providers.errors import PeerpodsError


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags."""


def run(args: argparse.Namespace) -> int:
    raise PeerpodsError("webhook is not available in this build")
