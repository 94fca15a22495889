"""`peerpods webhook`: the admission webhook (HTTPS, POST /mutate, GET /healthz)."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

from adaptor.cli import flags
from providers.core.catalog import CLOUDS


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def _networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    try:
        return tuple(ipaddress.ip_network(n.strip()) for n in text.split(",") if n.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Add this subcommand's flags."""
    flags.add(parser, "--host", default="0.0.0.0", help="address to listen on")
    flags.add(parser, "--port", type=int, default=8443, help="HTTPS port")
    flags.add(
        parser,
        "--tls-cert-file",
        default="/etc/peerpods/tls/tls.crt",
        help="serving certificate (PEM); re-read when its content changes",
    )
    flags.add(
        parser,
        "--tls-key-file",
        default="/etc/peerpods/tls/tls.key",
        help="private key of the serving certificate (PEM)",
    )
    flags.add(
        parser,
        "--seal-key-dir",
        default="/etc/peerpods/seal",
        help="the contract-seal keys, a mounted Secret: `current` seals, every other file is "
        "still accepted (rotation: docs/install.md); never derived from the TLS key",
    )
    flags.add(
        parser,
        "--provider",
        default="",
        choices=["", *CLOUDS],
        help="cloud whose catalog DRA selectors and impossible requests are checked "
        "against (empty: no catalog; pods with DRA claims are denied)",
    )
    flags.add(parser, "--region", default="", help="catalog region (default: the cloud's)")
    flags.add(
        parser,
        "--catalog-dir",
        default="",
        help="directory of catalog snapshots (default: the bundled snapshots)",
    )
    flags.add(
        parser,
        "--runtime-classes",
        type=_names,
        default=frozenset({"kata-remote"}),
        help="comma-separated runtimeClassNames that make a pod a peer pod",
    )
    flags.add(
        parser,
        "--allowed-machine-types",
        type=_names,
        default=frozenset(),
        help="comma-separated instance types users may pin with the machine_type "
        "annotation (empty: none)",
    )
    flags.add_default_capacity_type(
        parser,
        "capacity type of a pod without the peerpods.io/capacity-type annotation",
    )
    flags.add(
        parser,
        "--namespace-capacity-types",
        default="",
        help="capacity types each namespace's pods may ask for, NAMESPACE=TYPE|TYPE[,...] with * "
        "for every other namespace, e.g. 'ml=spot|spot-or-on-demand,*=on-demand'; a namespace's "
        "first type is its default when --default-capacity-type is not allowed there (empty: "
        "any type anywhere)",
    )
    flags.add(
        parser,
        "--impossible",
        default="deny",
        choices=["deny", "warn"],
        help="a GPU request no catalog type can serve: deny the pod, or admit it with a warning",
    )
    flags.add(
        parser,
        "--max-request-bytes",
        type=_positive,
        default=3 * 1024 * 1024,
        help="largest AdmissionReview body accepted, bytes",
    )
    flags.add(
        parser,
        "--tls-reload-seconds",
        type=flags.duration,
        default=10.0,
        help="how often the TLS files are checked for new content (duration)",
    )
    flags.add(
        parser,
        "--vm-image-namespaces",
        type=_names,
        default=frozenset(),
        help="comma-separated namespaces whose peer pods may choose their pod VM image and "
        "initdata (the image and cc_init_data annotations); elsewhere both are removed",
    )
    flags.add(
        parser,
        "--allowed-vm-images",
        type=_names,
        default=frozenset(),
        help="comma-separated pod VM images any peer pod may choose with the image annotation",
    )
    flags.add(
        parser,
        "--max-connections",
        type=_positive,
        default=256,
        help="open connections at most; one more is closed at once",
    )
    flags.add(
        parser,
        "--max-connections-per-source",
        type=_positive,
        default=64,
        help="open connections from one address at most (the API server's networks excepted)",
    )
    flags.add(
        parser,
        "--reserved-connections",
        type=int,
        default=32,
        help="connections of --max-connections only the API server's networks may use",
    )
    flags.add(
        parser,
        "--api-server-cidrs",
        type=_networks,
        default=(),
        help="comma-separated networks the API server connects from (e.g. the control plane's "
        "range): exempt from the per-address limit, and the reserve is theirs",
    )
    flags.add(
        parser,
        "--client-ca-file",
        default="",
        help="CA of the API server's client certificate (AdmissionConfiguration kubeConfig); "
        "set, /mutate answers only clients presenting a certificate it issued (empty: any)",
    )
    flags.add(
        parser,
        "--header-timeout",
        type=flags.duration,
        default=5.0,
        help="a connection must send complete request headers within this (duration)",
    )
    flags.add(
        parser,
        "--body-timeout",
        type=flags.duration,
        default=10.0,
        help="a request body must arrive within this once the headers have (duration; else 408)",
    )
    flags.add(
        parser,
        "--cel-timeout",
        type=flags.duration,
        default=5.0,
        help="wall-clock limit for all DRA selectors of one admission (duration); a pod whose "
        "selectors run longer is denied",
    )
    flags.add(
        parser,
        "--cel-workers",
        type=int,
        default=2,
        help="worker processes that evaluate DRA selectors (killed and replaced when one "
        "runs past --cel-timeout)",
    )
    flags.add(
        parser,
        "--cache-ttl",
        type=flags.duration,
        default=30.0,
        help="how long claims, templates and device classes read from the API are cached",
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from providers.core.capacity import CapacityType
    from providers.core.catalog import Catalog
    from providers.core.snapshots import load_catalog
    from webhook import (
        Admission,
        CapacityPolicy,
        KubeResolver,
        ServerConfig,
        Settings,
        VmChoices,
        WebhookServer,
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
    catalog_dir = Path(args.catalog_dir) if args.catalog_dir else None

    def catalog() -> Catalog | None:
        if not args.provider:
            return None
        return load_catalog(args.provider, args.region or None, catalog_dir=catalog_dir)

    catalog()  # fail at start, with one line, when the snapshot is missing
    admission = Admission(
        settings,
        catalog,
        KubeResolver(ttl_seconds=args.cache_ttl),
        cel_timeout_seconds=args.cel_timeout,
        vm_choices=VmChoices(
            namespaces=frozenset(args.vm_image_namespaces),
            images=frozenset(args.allowed_vm_images),
        ),
    )
    config = ServerConfig(
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

    async def main() -> None:
        server = WebhookServer(admission, config)
        await server.serve()

    asyncio.run(main())
    return 0
