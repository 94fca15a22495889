"""`peerpods webhook`: the admission webhook (HTTPS, POST /mutate, GET /healthz)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from adaptor.cli import flags

if TYPE_CHECKING:
    from webhook import Admission, ServerConfig

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags (from `WebhookSettings`)."""
    from adaptor.cli.settings import WebhookSettings

    flags.add_settings(parser, WebhookSettings)


def run(args: argparse.Namespace) -> int:
    """Build the admission logic and the server from the settings, then serve until stopped."""
    import asyncio

    from webhook import WebhookServer

    admission = _admission(args)
    config = _server_config(args)

    async def main() -> None:
        server = WebhookServer(admission, config)
        await server.serve()

    asyncio.run(main())
    return 0


def _admission(args: argparse.Namespace) -> Admission:
    """The admission decisions: policy, seal keys, the catalog (checked now), the resolver."""
    from adaptor.cli.region import catalog_region
    from providers.core.catalog import Catalog
    from providers.core.errors import PeerpodsError
    from providers.core.snapshots import CatalogLoader
    from webhook import Admission, KubeResolver, Settings, VmChoices, WebhookPolicy, load_seal_keys

    policy = flags.section(WebhookPolicy, args)
    seal_keys = load_seal_keys(Path(policy.seal_key_dir))  # before anything starts
    loader = CatalogLoader(Path(args.catalog_dir) if args.catalog_dir else None)
    region = catalog_region(args.provider, args.region) if args.provider else ""

    def catalog() -> Catalog | None:
        if not args.provider:
            return None
        return loader.load(args.provider, region or None)

    try:
        catalog()
    except PeerpodsError as exc:
        # a region whose catalog the refresh job has not written yet: serve, not ready (/readyz
        # says why), and ready once the file appears, rather than exit and crash-loop
        log.warning("webhook not ready until its catalog loads: %s", exc)
    return Admission(
        Settings.of(policy, seal_keys),
        catalog,
        KubeResolver(ttl_seconds=policy.cache_ttl_seconds),
        cel_timeout_seconds=policy.cel_timeout_seconds,
        vm_choices=VmChoices(
            namespaces=policy.vm_image_namespaces, images=policy.allowed_vm_images
        ),
    )


def _server_config(args: argparse.Namespace) -> ServerConfig:
    """Where and how the server listens: address, TLS files, the connection and time bounds."""
    from webhook import ServerConfig

    return flags.section(ServerConfig, args)
