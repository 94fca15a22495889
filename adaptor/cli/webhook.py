"""`peerpods webhook`: the admission webhook (HTTPS, POST /mutate, GET /healthz)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from adaptor.cli import flags

if TYPE_CHECKING:
    from webhook import Admission, ServerConfig


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
    from providers.core.capacity import CapacityType
    from providers.core.catalog import Catalog
    from providers.core.snapshots import CatalogLoader
    from webhook import (
        Admission,
        CapacityPolicy,
        KubeResolver,
        Settings,
        VmChoices,
        load_seal_keys,
        parse_namespace_policy,
    )

    seal_keys = load_seal_keys(Path(args.seal_key_dir))  # before anything starts
    settings = Settings(
        runtime_classes=frozenset(args.runtime_classes),
        allowed_machine_types=frozenset(args.allowed_machine_types),
        impossible=args.impossible,
        capacity=CapacityPolicy(
            CapacityType(args.default_capacity_type),
            parse_namespace_policy(args.namespace_capacity_types),
        ),
        seal_key=seal_keys.current,
        accepted_seal_keys=seal_keys.accepted,
    )
    loader = CatalogLoader(Path(args.catalog_dir) if args.catalog_dir else None)

    def catalog() -> Catalog | None:
        if not args.provider:
            return None
        return loader.load(args.provider, args.region or None)

    catalog()  # fail at start, with one line, when the snapshot is missing
    return Admission(
        settings,
        catalog,
        KubeResolver(ttl_seconds=args.cache_ttl),
        cel_timeout_seconds=args.cel_timeout,
        vm_choices=VmChoices(
            namespaces=frozenset(args.vm_image_namespaces),
            images=frozenset(args.allowed_vm_images),
        ),
    )


def _server_config(args: argparse.Namespace) -> ServerConfig:
    """Where and how the server listens: address, TLS files, the connection and time bounds."""
    from webhook import ServerConfig

    return ServerConfig(
        host=args.host,
        port=args.port,
        cert_file=Path(args.tls_cert_file),
        key_file=Path(args.tls_key_file),
        max_request_bytes=args.max_request_bytes,
        reload_seconds=args.tls_reload_seconds,
        max_connections=args.max_connections,
        header_timeout_seconds=args.header_timeout,
        body_timeout_seconds=args.body_timeout,
        cel_workers=max(0, args.cel_workers),
        max_connections_per_source=args.max_connections_per_source,
        reserved_connections=max(0, args.reserved_connections),
        api_server_networks=tuple(args.api_server_cidrs),
        client_ca_file=Path(args.client_ca_file) if args.client_ca_file else None,
    )
