"""How containers' CDI devices are named and resolved."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from providers.core.settings import Flag, Section


class CdiNames(Section):
    """The CDI names of a pod VM's devices, as templates (`peerpods plan` takes them too)."""

    cdi_gpu_name: Annotated[str, Flag("--cdi-gpu-name")] = Field(
        "peerpods.io/gpu=gpu{index}",
        description="CDI name template of a whole GPU ({index}: its index in the VM)",
    )
    cdi_mig_name: Annotated[str, Flag("--cdi-mig-name")] = Field(
        "peerpods.io/gpu=gpu{gpu}-mig{mig}",
        description="CDI name template of a MIG device ({gpu}, {mig}: GPU and MIG index)",
    )
    cdi_rdma_name: Annotated[str, Flag("--cdi-rdma-name")] = Field(
        "rdma.peerpods.io/hca={index}",
        description="CDI name template of an RDMA device ({index}: its index)",
    )


class CdiSettings(CdiNames):
    """Who resolves the names: kata-agent in the pod VM, or the adaptor from spec files."""

    cdi_mode: Annotated[Literal["annotations", "edits"], Flag("--cdi-mode")] = Field(
        "annotations",
        description="annotations: kata-agent resolves cdi.k8s.io/* against the pod VM's CDI "
        "specs; edits: the adaptor applies the --cdi-spec-dir specs into the OCI spec itself",
    )
    cdi_spec_dir: Annotated[str, Flag("--cdi-spec-dir")] = Field(
        "/etc/peerpods/cdi",
        description="CDI spec dirs for edits mode, comma-separated, lowest priority first",
    )
