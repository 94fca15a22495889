"""The plugin beside the node daemon: started before it serves, stopped after it stops."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from adaptor.dra.checkpoint import Checkpoint
from adaptor.dra.server import PluginServer
from adaptor.dra.settings import DraPluginSettings
from adaptor.dra.state import DeviceState

__all__ = ["with_plugin"]

log = logging.getLogger(__name__)


async def with_plugin(daemon: Coroutine[Any, Any, None], settings: DraPluginSettings) -> None:
    """Serve the kubelet plugin for as long as `daemon` runs (the plugin's client reads claims
    and slices with the node's credentials, in-cluster or KUBECONFIG)."""
    from providers.clouds.kube import KubeClient, load_config

    client = KubeClient(load_config())
    state = DeviceState(client.get, Checkpoint(settings.checkpoint_path), settings.dra_cdi_dir)
    server = PluginServer(state, settings.dra_registry_dir, settings.dra_plugin_dir)
    try:
        await server.start()
        log.info("kubelet plugin gpu.peerpods.io serving at %s", server.plugin_socket)
        await daemon
    finally:
        await server.stop()
        client.close()
