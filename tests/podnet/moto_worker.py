"""`peerpods serve` on the aws provider against a moto EC2 server, run as a worker node's daemon
(the test starts it inside the worker netns, where moto listens on loopback too). Every pod VM's
forwarder is dialled at one loopback port where the test's kata-agent listens; the tunnels go to
the VMs' own (moto) addresses.

    python -m tests.podnet.moto_worker ROOT MOTO_PORT AGENT_PORT RECONNECT_GRACE_SECONDS
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from adaptor.node.daemon import serve
from adaptor.runtime.logs import configure
from providers.core.base import Instance
from tests.adaptor.moto_daemon import moto_aws, moto_settings

OWNER = "restart-owner"


def main(root: Path, moto_port: int, agent_port: int, reconnect_grace: float) -> None:
    configure("debug", "text")
    provider = moto_aws(moto_port, OWNER, zones=("us-east-1a",))

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", agent_port

    settings = moto_settings(
        root,
        OWNER,
        proxy_timeout_seconds=30,
        reconnect_grace_seconds=reconnect_grace,
        shutdown_drain_seconds=10,
        shutdown_grace_seconds=2,
        gc_interval_seconds=0,
        status_address="127.0.0.1:0",
    )
    asyncio.run(serve(settings, provider=provider, resolve_endpoint=resolve))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
