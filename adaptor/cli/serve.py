"""`peerpods serve`: the node daemon Kata's remote hypervisor talks to.

Every flag comes from a setting declaration: `ServeSettings` (with the sections it inherits),
`AgentTls`, `CdiSettings`, `DraPluginSettings` (the kubelet plugin) and each cloud provider's
section (`providers.clouds.settings`).
"""

from __future__ import annotations

import argparse

from adaptor.cli import flags
from providers.clouds import registry


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (cheap: the declarations only, no daemon code)."""
    from adaptor.dra.settings import DraPluginSettings
    from adaptor.node.settings import ServeSettings
    from adaptor.settings import AgentTls, CdiSettings

    flags.add_settings(
        parser, ServeSettings, AgentTls, CdiSettings, DraPluginSettings, *registry.sections()
    )


def run(args: argparse.Namespace) -> int:
    """Validate the settings, then serve until SIGTERM/SIGINT."""
    from adaptor.devices import cdi_config
    from adaptor.dra.settings import DraPluginSettings
    from adaptor.node.daemon import serve
    from adaptor.node.settings import ServeSettings
    from adaptor.settings import AgentTls, CdiSettings
    from adaptor.ttrpc.loop import run as run_loop

    settings = flags.section(ServeSettings, args, agent_tls=flags.section(AgentTls, args))
    cdi = cdi_config(flags.section(CdiSettings, args))
    cloud = registry.section(settings.provider)
    provider_settings = flags.section(cloud, args) if cloud is not None else None
    plugin = flags.section(DraPluginSettings, args)
    if not plugin.dra_plugin:
        run_loop(serve(settings, provider_settings=provider_settings, cdi=cdi))
        return 0
    from adaptor.dra import Checkpoint
    from adaptor.dra.run import with_plugin
    from adaptor.hypervisor.dra_claims import DraClaimsHook

    # the VM of a pod with claims is planned from what the plugin prepared for it
    hooks = (DraClaimsHook(Checkpoint(plugin.checkpoint_path)),)
    daemon = serve(settings, provider_settings=provider_settings, cdi=cdi, hooks=hooks)
    run_loop(with_plugin(daemon, plugin))
    return 0
