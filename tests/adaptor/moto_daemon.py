"""`peerpods serve`'s daemon on the aws provider against a moto EC2 server, as a process a test
can kill -9. Every pod VM's forwarder is dialled at a loopback port where nothing listens, so a
StartVM stays in flight (waiting for the forwarder) after its VM exists; no address off this
host is ever dialled (an audit hook refuses it).

    python -m tests.adaptor.moto_daemon ROOT MOTO_PORT REAP_GRACE_SECONDS
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

from adaptor.node.daemon import serve
from adaptor.node.settings import ServeSettings
from adaptor.runtime.logs import configure
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.core.base import Instance

OWNER = "kill9-owner"
IMAGE = "ami-0a1b2c3d4e5f60718"


def _loopback_only(event: str, args: tuple[Any, ...]) -> None:
    if event != "socket.connect" or not isinstance(args[1], tuple):
        return
    host = str(args[1][0])
    if ipaddress.ip_address(host.split("%", 1)[0]).is_loopback:
        return
    raise ConnectionRefusedError(f"moto_daemon: refusing non-loopback address {host!r}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def moto_aws(moto_port: int, owner: str, *, zones: tuple[str, ...]) -> AwsProvider:
    """The aws provider against the moto server on `moto_port`, polling fast."""
    return AwsProvider(
        AwsConfig(
            region="us-east-1",
            image_id=IMAGE,
            zones=zones,
            endpoint_url=f"http://127.0.0.1:{moto_port}",
            poll_interval_seconds=0.05,
        ),
        owner,
    )


def moto_settings(root: Path, owner: str, **overrides: Any) -> ServeSettings:
    """Daemon settings under `root` for the aws provider, agent TLS off.

    pods_dir is kept short: <pods>/<64 hex>/agent.ttrpc and its temporary bind name must fit a
    unix socket path (107 bytes), as under the default /run/peerpod/pods.
    """
    return ServeSettings.build(
        socket=root / "hv.sock",
        pods_dir=root / "p",
        state_dir=root / "state",
        agent_tls={"enabled": False},
        provider="aws",
        owner_id=owner,
        **{"status_address": "", **overrides},  # no status API unless asked
    )


def main(root: Path, moto_port: int, reap_grace: float) -> None:
    sys.addaudithook(_loopback_only)
    configure("debug", "text")
    provider = moto_aws(moto_port, OWNER, zones=("us-east-1a",))
    nowhere = closed_port()

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", nowhere

    settings = moto_settings(
        root,
        OWNER,
        proxy_timeout_seconds=120,
        reap_grace_seconds=reap_grace,
        gc_interval_seconds=0,
        shutdown_grace_seconds=1,
    )
    asyncio.run(serve(settings, provider=provider, resolve_endpoint=resolve))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
