"""The CDI flags of `peerpods serve` (with env twins); `adaptor.devices.config` reads them."""

from __future__ import annotations

import argparse

from adaptor.cli import flags
from adaptor.devices.config import DEFAULT_EDITS_SPEC_DIR
from adaptor.devices.naming import CdiNaming


def add_cdi_flags(parser: argparse.ArgumentParser) -> None:
    """Add --cdi-mode, --cdi-spec-dir and the CDI name templates to a parser."""
    default = CdiNaming()
    flags.add(
        parser,
        "--cdi-mode",
        choices=["annotations", "edits"],
        default="annotations",
        help="annotations: kata-agent resolves cdi.k8s.io/* against the pod VM's CDI specs; "
        "edits: the adaptor applies the --cdi-spec-dir specs into the OCI spec itself",
    )
    flags.add(
        parser,
        "--cdi-spec-dir",
        default=DEFAULT_EDITS_SPEC_DIR,
        help="CDI spec dirs for edits mode, comma-separated, lowest priority first",
    )
    flags.add(
        parser,
        "--cdi-gpu-name",
        default=default.gpu,
        help="CDI name template of a whole GPU ({index}: its index in the VM)",
    )
    flags.add(
        parser,
        "--cdi-mig-name",
        default=default.mig,
        help="CDI name template of a MIG device ({gpu}, {mig}: GPU and MIG index)",
    )
    flags.add(
        parser,
        "--cdi-rdma-name",
        default=default.rdma,
        help="CDI name template of an RDMA device ({index}: its index)",
    )
