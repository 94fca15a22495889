"""`peerpods warm-pool list` and `peerpods warm-pool drain`: the warm pools' VMs in the cloud
account, listed or deleted from anywhere with the cloud's credentials (an uninstall, after the
adaptors are gone: a serve that still runs refills its pools).

The cloud is configured by serve's own flags and env twins (`--provider`, `--aws-region`,
`--gcp-project`, `--azure-resource-group`, ...), so a shell with the adaptor's ConfigMap in its
environment needs none. Whose VMs: `--owner`, each node's owner id (serve's `--owner-id`),
default what serve would use here. The listing and the deletes are the providers' own
(`warm_vms`, `delete`); `adaptor.warmpool.inventory` says what is never deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from adaptor.cli import flags
from adaptor.cli.table import aligned
from providers.clouds import registry
from providers.clouds.sdk import CloudCalls
from providers.core.errors import InvalidRequest
from providers.core.warm import WarmCapable

CLOUDS = ("aws", "azure", "gcp")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add `list` and `drain` with their flags (cheap: the declarations only)."""
    from adaptor.cli.settings import WarmPoolDrainSettings, WarmPoolTarget

    actions = parser.add_subparsers(dest="warm_pool_action", metavar="ACTION", required=True)
    clouds = [registry.section(name) for name in CLOUDS]
    sections = [c for c in clouds if c is not None]
    for name, model, summary in (
        ("list", WarmPoolTarget, "the owners' pool VMs: type, zone, state, slot, owner, age"),
        ("drain", WarmPoolDrainSettings, "delete the owners' pool VMs (never an adopted one)"),
    ):
        child = actions.add_parser(name, help=summary, description=summary)
        flags.add_settings(child, model, *sections)


def default_owner(environ: dict[str, str] | None = None) -> str:
    """The owner id serve would use here: PEERPODS_OWNER_ID, else peerpods-<hostname>."""
    environ = dict(os.environ) if environ is None else environ
    return environ.get(flags.env_name("--owner-id"), "").strip() or (
        f"peerpods-{socket.gethostname()}"
    )


def run(args: argparse.Namespace) -> int:
    from adaptor.cli.settings import WarmPoolDrainSettings, WarmPoolTarget

    drain = args.warm_pool_action == "drain"
    settings = flags.section(WarmPoolDrainSettings if drain else WarmPoolTarget, args)
    if not settings.provider:
        raise InvalidRequest(
            "--provider is required: aws, azure or gcp (env PEERPODS_PROVIDER, as for serve)"
        )
    cloud = registry.section(settings.provider)
    assert cloud is not None  # a cloud provider, by the flag's choices
    cloud_settings = flags.section(cloud, args)
    owners = tuple(dict.fromkeys(o for o in settings.owner if o)) or (default_owner(),)
    if isinstance(settings, WarmPoolDrainSettings):
        return asyncio.run(_drain(settings, cloud_settings, owners))
    return asyncio.run(_list(settings, cloud_settings, owners))


async def _list(settings: Any, cloud_settings: Any, owners: Sequence[str]) -> int:
    from adaptor.warmpool.inventory import pool_vms

    providers, calls = build(settings.provider, cloud_settings, owners)
    try:
        vms = await pool_vms(providers)
    finally:
        await calls.shutdown(0)
    if settings.print_json:
        print(json.dumps({"vms": [vm.as_json() for vm in vms]}, indent=2))
    else:
        print(_table(vms))
    return 0


async def _drain(settings: Any, cloud_settings: Any, owners: Sequence[str]) -> int:
    from adaptor.warmpool.inventory import drain

    providers, calls = build(settings.provider, cloud_settings, owners)
    try:
        report = await drain(
            providers, settings.instance_type, settings.zone, dry_run=settings.dry_run
        )
    finally:
        await calls.shutdown(0)
    verb = "would delete" if settings.dry_run else "deleted"
    if settings.print_json:
        out = {
            "dry_run": settings.dry_run,
            "deleted": [vm.as_json() for vm in report.deleted],
            "kept": [{**vm.as_json(), "why": why} for vm, why in report.kept],
            "failed": [{**vm.as_json(), "error": why} for vm, why in report.failed],
        }
        print(json.dumps(out, indent=2))
    else:
        for vm in report.deleted:
            print(f"{verb} {vm.vm_id} ({vm.instance_type} in {vm.zone}, {vm.owner} {vm.slot})")
        for vm, why in report.kept:
            print(f"kept {vm.vm_id}: {why}")
        for vm, why in report.failed:
            print(f"failed {vm.vm_id}: {why}", file=sys.stderr)
        if not (report.deleted or report.kept or report.failed):
            print(f"no pool VM of {', '.join(owners)} matches")
    return 1 if report.failed else 0


def build(name: str, settings: Any, owners: Sequence[str]) -> tuple[list[WarmCapable], CloudCalls]:
    """One provider per owner over one SDK client and one set of SDK threads (returned, to be
    shut down). Built from the cloud's configuration alone: no pod VM image and no instance
    metadata is needed to list or delete."""
    registry.load(name)  # an SDK that is not installed: one line with the install hint
    calls = CloudCalls()
    first: Any
    try:
        # the first provider checks the settings and makes the SDK client, the others share it
        if name == "aws":
            from providers.clouds import aws

            config = aws.config_from_settings(settings)
            first = aws.AwsProvider(config, owners[0], calls=calls)
            found = [first] + [
                aws.AwsProvider(config, o, client=first.client, calls=calls) for o in owners[1:]
            ]
        elif name == "gcp":
            from providers.clouds import gcp

            gcp_config = gcp.config_from_settings(settings)
            first = gcp.GcpProvider(gcp_config, owners[0], calls=calls)
            found = [first] + [
                gcp.GcpProvider(gcp_config, o, client=first.client, calls=calls) for o in owners[1:]
            ]
        else:
            from providers.clouds import azure

            azure_config = azure.config_from_settings(settings)
            first = azure.AzureProvider(azure_config, owners[0], calls=calls)
            found = [first] + [
                azure.AzureProvider(
                    azure_config, o, compute=first.compute, network=first.network, calls=calls
                )
                for o in owners[1:]
            ]
    except ModuleNotFoundError as exc:
        raise InvalidRequest(
            f"provider {name!r} needs the {exc.name} package: pip install 'peerpods[{name}]'"
        ) from None
    return found, calls


def _table(vms: Sequence[Any]) -> str:
    if not vms:
        return "no pool VM"
    rows = [("OWNER", "SLOT", "VM", "TYPE", "ZONE", "STATE", "AGE", "SANDBOX")]
    for vm in vms:
        age = vm.age_seconds()
        rows.append(
            (
                vm.owner,
                vm.slot,
                vm.vm_id,
                vm.instance_type,
                vm.zone,
                vm.state,
                "-" if age is None else _age(age),
                vm.sandbox or "-",
            )
        )
    return "\n".join(aligned(rows))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
