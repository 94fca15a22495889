"""`peerpods dra publish`: the pools of driver gpu.peerpods.io, from the provider's catalog.

`--once` publishes and exits; without it the command is the publisher's controller (the
Deployment in config/deploy/dra), re-publishing every `--resync` (a catalog reload, a limit or a
quota change is a new pool generation), leader-elected with `--leader-elect`. `--delete` removes
the pool's slices and exits (uninstall); `--delete-on-exit` does so when the controller stops.
`--print` writes the slices as YAML and touches no cluster.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from adaptor.cli import flags
from adaptor.cli.settings import CatalogChoice, CatalogSource
from providers.core.settings import Flag, Names

if TYPE_CHECKING:
    from providers.clouds.kube import KubeClient
    from providers.core.account_quota import AccountQuota
    from providers.core.catalog import Catalog
    from providers.dra import Pool


class DraPublishSettings(CatalogChoice, CatalogSource):
    """`peerpods dra publish`: which pools, bounded how, written how often and by whom."""

    gpu_limit: Annotated[Names, Flag("--gpu-limit", metavar="MODEL=N[,...]", repeated=True)] = (
        Field(
            (),
            description="devices per GPU model (any alias: h100=2 limits each H100 model to 2); a "
            "model without one gets the account's GPU quota for it, else 8",
        )
    )
    arch: Annotated[Literal["x86_64", "arm64"], Flag("--arch")] = Field(
        "x86_64", description="the pod VM image's architecture: only its types are published"
    )
    account_quotas: Annotated[bool, Flag("--account-quotas")] = Field(
        False,
        description="aws: read the account's EC2 vCPU quotas (Service Quotas, default "
        "credentials) each round and publish them as the pool's account counters",
    )
    once: Annotated[bool, Flag("--once")] = Field(
        False, description="publish once and exit (else run as the controller)"
    )
    delete: Annotated[bool, Flag("--delete")] = Field(
        False, description="delete the pool's slices and exit (uninstall)"
    )
    delete_on_exit: Annotated[bool, Flag("--delete-on-exit")] = Field(
        False,
        description="the controller deletes the pool's slices when it stops (off: a rolling "
        "update would leave the scheduler without the pool between two replicas)",
    )
    print_only: Annotated[bool, Flag("--print")] = Field(
        False, description="print the slices as YAML; no cluster is contacted"
    )
    resync_seconds: Annotated[float, Flag("--resync", duration=True)] = Field(
        30.0, gt=0, description="how often the controller rebuilds and re-publishes (duration)"
    )
    leader_elect: Annotated[bool, Flag("--leader-elect")] = Field(
        False, description="hold a coordination.k8s.io Lease; only its holder publishes"
    )
    lease_namespace: Annotated[str, Flag("--lease-namespace")] = Field(
        "peerpods-system", description="namespace of the publisher's Lease"
    )
    lease_name: Annotated[str, Flag("--lease-name")] = Field(
        "gpu.peerpods.io-publisher", description="name of the publisher's Lease"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `publish` action and its flags."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    publish = sub.add_parser(
        "publish",
        help="publish the cloud's GPUs as ResourceSlices of driver gpu.peerpods.io",
        description="Publish the provider region's GPUs as the pool of driver gpu.peerpods.io "
        "(docs/dra.md).",
    )
    flags.add_settings(publish, DraPublishSettings)


def _pool(settings: DraPublishSettings) -> Pool:
    from providers.core.snapshots import CatalogLoader
    from providers.dra import build_pool, parse_gpu_limits

    loader = CatalogLoader(Path(settings.catalog_dir) if settings.catalog_dir else None)
    catalog = loader.load(settings.provider, settings.region or None)
    limits = parse_gpu_limits(settings.gpu_limit)
    quota = _account_quota(catalog) if settings.account_quotas else None
    return build_pool(catalog, limits, quota, arch=settings.arch)


def _account_quota(catalog: Catalog) -> AccountQuota:
    """The account's quotas as the cloud reports them now (AWS: EC2's vCPU quotas per class)."""
    from providers.clouds.quotas import aws_quota
    from providers.core.errors import InvalidRequest

    if catalog.cloud != "aws":
        raise InvalidRequest(
            f"--account-quotas reads AWS accounts only; for {catalog.cloud} bound the pool with "
            "--gpu-limit"
        )
    try:
        import boto3

        ec2 = boto3.client("ec2", region_name=catalog.region)
        quotas = boto3.client("service-quotas", region_name=catalog.region)
        vcpus = {t.name: t.vcpus for t in catalog.types}
        return aws_quota(catalog.region, ec2, quotas, vcpus)
    except ImportError:
        raise InvalidRequest("--account-quotas needs boto3: pip install 'peerpods[aws]'") from None
    except Exception as exc:  # credentials, the network, the API: one line, no traceback
        raise InvalidRequest(f"reading the AWS account's quotas: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Print, delete, publish once, or run the controller."""
    import yaml

    settings = flags.section(DraPublishSettings, args)
    pool = _pool(settings)  # bad limits or a missing catalog: one line, before any API call
    if settings.print_only:
        yaml.safe_dump_all(pool.slices(1), sys.stdout, sort_keys=False)
        return 0
    from providers.clouds.kube import KubeClient, load_config
    from providers.dra.publisher import delete_pool, publish

    client = KubeClient(load_config())
    try:
        if settings.delete:
            deleted = delete_pool(client, pool.name)
            print(f"pool {pool.name}: {len(deleted)} slices deleted")
            return 0
        if settings.once:
            done = publish(client, pool)
            what = (
                f"{len(done.created)} created, {len(done.replaced)} replaced, "
                f"{len(done.deleted)} deleted"
                if done.changed
                else "unchanged"
            )
            print(
                f"pool {pool.name} generation {done.generation}: {len(pool.devices)} devices, "
                f"{what}"
            )
            for note in pool.notes:
                print(f"  {note}", file=sys.stderr)
            return 0
        _controller(settings, client)
        return 0
    finally:
        client.close()


def _controller(settings: DraPublishSettings, client: KubeClient) -> None:
    import asyncio
    import signal

    from providers.dra.publisher import LeaseElector, run_controller

    elector = None
    if settings.leader_elect:
        identity = os.environ.get("POD_NAME") or socket.gethostname()
        elector = LeaseElector(client, settings.lease_namespace, settings.lease_name, identity)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_controller(
            client,
            lambda: _pool(settings),
            stop,
            resync_seconds=settings.resync_seconds,
            elector=elector,
            delete_on_exit=settings.delete_on_exit,
        )

    asyncio.run(main())
