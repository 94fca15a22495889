"""`peerpods serve` with a warm pool on the aws provider against a moto EC2 server (or the gcp or
azure provider against the repository's fake, served by the test: tests.clouds.fake_relay),
behind the latency-modelled cloud, as a process a test can kill -9. The warm VMs' guests are
played by the test (tests.clouds.latency.Guests), outside this process; every pod VM's
forwarder is dialled at a loopback port where nothing listens, so a StartVM stays in flight
after its adoption.

    python -m tests.clouds.warm_daemon ROOT PORT CONFIG_JSON

PORT: moto's, or the fake cloud's. CONFIG_JSON: {"cloud": "aws" | "gcp" | "azure" (default
aws), "model": {LatencyModel fields}, "settings": {ServeSettings fields}}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from adaptor.node.daemon import serve
from adaptor.runtime.logs import configure
from providers.clouds.aws import AwsConfig, AwsProvider
from providers.core.base import Instance
from tests.adaptor.moto_daemon import IMAGE, _loopback_only, closed_port, moto_settings
from tests.clouds.fake_relay import Relay
from tests.clouds.latency import LatencyCloud, LatencyModel

OWNER = "warm-kill9"
ZONE = "us-east-1a"
TYPE = "m5.large"  # the one allowed type: every pod's placement chooses it first
# cloud -> (its one allowed type, of the pods' shape in its bundled catalog; the pool's zone)
PLACES = {
    "aws": (TYPE, ZONE),
    "gcp": ("e2-standard-2", "us-central1-a"),
    "azure": ("Standard_D2s_v5", "1"),
}
AZURE_SUBNET = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/peerpods-rg/providers"
    "/Microsoft.Network/virtualNetworks/vnet/subnets/pods"
)


def provider_for(cloud: str, port: int) -> Any:
    """The cloud's provider, its API at the loopback port (moto's, or the fake's)."""
    instance_type, zone = PLACES[cloud]
    if cloud == "aws":
        return AwsProvider(
            AwsConfig(
                region="us-east-1",
                image_id=IMAGE,
                zones=(zone,),
                allowed_instance_types=(instance_type,),
                endpoint_url=f"http://127.0.0.1:{port}",
                poll_interval_seconds=0.05,
            ),
            OWNER,
        )
    relay: Any = Relay(port)  # mounted on the SDKs' sessions where the fakes would be
    if cloud == "gcp":
        from google.cloud import compute_v1

        from providers.clouds.gcp import GcpConfig, GcpProvider
        from tests.providers.fakes.gcp import PROJECT, client

        gcp = GcpConfig(
            project=PROJECT,
            zones=(zone,),
            image="projects/peerpods/global/images/podvm",
            allowed_instance_types=(instance_type,),
        )
        return GcpProvider(gcp, OWNER, client=client(relay, compute_v1.InstancesClient))
    from providers.clouds.azure import AzureConfig, AzureProvider
    from tests.providers.fakes.azure import SUBSCRIPTION, compute_client, network_client

    azure = AzureConfig(
        subscription_id=SUBSCRIPTION,
        resource_group="peerpods-rg",
        location="eastus",
        subnet_id=AZURE_SUBNET,
        image_id="/subscriptions/x/resourceGroups/img/providers/Microsoft.Compute/images/podvm",
        allowed_instance_types=(instance_type,),
        zones=(zone,),
    )
    return AzureProvider(azure, OWNER, compute=compute_client(relay), network=network_client(relay))


def main(root: Path, port: int, config: dict[str, Any]) -> None:
    sys.addaudithook(_loopback_only)
    configure("debug", "text")
    provider = provider_for(str(config.get("cloud", "aws")), port)
    cloud = LatencyCloud(provider, LatencyModel(**config["model"]), guests=False)
    nowhere = closed_port()

    def resolve(instance: Instance) -> tuple[str, int]:
        return "127.0.0.1", nowhere

    settings = moto_settings(root, OWNER, **config["settings"])
    asyncio.run(serve(settings, provider=cloud, resolve_endpoint=resolve))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
