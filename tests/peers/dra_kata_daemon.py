"""`peerpods serve --dra-plugin` as its command wires it (the kubelet plugin beside the daemon,
the VM planned from the prepared claims), on the aws provider against a moto EC2 server; every
pod VM's forwarder is dialled at the test's pod VM agent on loopback, and no address off this
host is ever dialled (an audit hook refuses it).

    python -m tests.peers.dra_kata_daemon ROOT MOTO_PORT AGENT_PORT STATUS_PORT KUBELET_ROOT CDI_DIR

KUBECONFIG names the cluster the plugin reads claims from.
"""

from __future__ import annotations

import sys
from pathlib import Path

from adaptor.dra import Checkpoint
from adaptor.dra.run import with_plugin
from adaptor.dra.settings import DraPluginSettings
from adaptor.hypervisor.dra_claims import DraClaimsHook
from adaptor.node.daemon import serve
from adaptor.runtime.logs import configure
from adaptor.ttrpc.loop import run as run_loop
from providers.core.base import Instance
from tests.adaptor.moto_daemon import _loopback_only, moto_aws, moto_settings

OWNER = "dra-kata-owner"


def main(root: Path, moto_port: int, agent_port: int, status_port: int, kubelet_root: Path,
         cdi_dir: Path) -> None:  # fmt: skip
    sys.addaudithook(_loopback_only)
    configure("debug", "text")
    provider = moto_aws(moto_port, OWNER, zones=("us-east-1a",))

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", agent_port

    settings = moto_settings(
        root,
        OWNER,
        status_address=f"127.0.0.1:{status_port}",
        gc_interval_seconds=0,
        shutdown_grace_seconds=1,
    )
    plugin = DraPluginSettings(
        dra_plugin=True,
        dra_registry_dir=kubelet_root / "plugins_registry",
        dra_plugin_dir=kubelet_root / "plugins" / "gpu.peerpods.io",
        dra_cdi_dir=cdi_dir,
    )
    # as adaptor.cli.serve.run does with --dra-plugin
    hooks = (DraClaimsHook(Checkpoint(plugin.checkpoint_path)),)
    daemon = serve(settings, provider=provider, resolve_endpoint=resolve, hooks=hooks)
    run_loop(with_plugin(daemon, plugin))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
         Path(sys.argv[5]), Path(sys.argv[6]))  # fmt: skip
