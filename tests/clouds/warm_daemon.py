"""`peerpods serve` with a warm pool on the aws provider against a moto EC2 server, behind the
latency-modelled cloud, as a process a test can kill -9. The warm VMs' guests are played by the
test (tests.clouds.latency.Guests), outside this process; every pod VM's forwarder is dialled
at a loopback port where nothing listens, so a StartVM stays in flight after its adoption.

    python -m tests.clouds.warm_daemon ROOT MOTO_PORT CONFIG_JSON

CONFIG_JSON: {"model": {LatencyModel fields}, "settings": {ServeSettings fields}}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from adaptor.node.daemon import serve
from adaptor.runtime.logs import configure
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.core.base import Instance
from tests.adaptor.moto_daemon import IMAGE, _loopback_only, closed_port, moto_settings
from tests.clouds.latency import LatencyCloud, LatencyModel

OWNER = "warm-kill9"
ZONE = "us-east-1a"
TYPE = "m5.large"  # the one allowed type: every pod's placement chooses it first


def main(root: Path, moto_port: int, config: dict[str, object]) -> None:
    sys.addaudithook(_loopback_only)
    configure("debug", "text")
    provider = AwsProvider(
        AwsConfig(
            region="us-east-1",
            image_id=IMAGE,
            zones=(ZONE,),
            allowed_instance_types=(TYPE,),
            endpoint_url=f"http://127.0.0.1:{moto_port}",
            poll_interval_seconds=0.05,
        ),
        OWNER,
    )
    cloud = LatencyCloud(provider, LatencyModel(**config["model"]), guests=False)  # type: ignore[arg-type]
    nowhere = closed_port()

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", nowhere

    settings = moto_settings(root, OWNER, **config["settings"])  # type: ignore[arg-type]
    asyncio.run(serve(settings, provider=cloud, resolve_endpoint=resolve))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
