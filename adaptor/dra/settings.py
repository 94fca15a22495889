"""The kubelet plugin's settings (`peerpods serve --dra-plugin`), declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from providers.core.settings import Flag, Section

__all__ = ["DraPluginSettings"]


class DraPluginSettings(Section):
    """Where the kubelet finds the plugin, where the plugin keeps its state and CDI specs."""

    dra_plugin: Annotated[bool, Flag("--dra-plugin")] = Field(
        False,
        description="serve the kubelet plugin of driver gpu.peerpods.io (the DRA-driver mode, "
        "docs/dra.md)",
    )
    dra_registry_dir: Annotated[Path, Flag("--dra-registry-dir")] = Field(
        Path("/var/lib/kubelet/plugins_registry"),
        description="the kubelet's plugin registry directory (its registration socket goes here)",
    )
    dra_plugin_dir: Annotated[Path, Flag("--dra-plugin-dir")] = Field(
        Path("/var/lib/kubelet/plugins/gpu.peerpods.io"),
        description="the plugin's own directory: its dra.sock and the prepared-claims checkpoint",
    )
    dra_cdi_dir: Annotated[Path, Flag("--dra-cdi-dir")] = Field(
        Path("/var/run/cdi"),
        description="where the per-claim transient CDI specs are written (containerd reads them)",
    )

    @property
    def checkpoint_path(self) -> Path:
        return self.dra_plugin_dir / "checkpoint.json"
