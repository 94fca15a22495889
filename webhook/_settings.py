"""The webhook's settings, each declared once (`providers.core.settings`): the flag of
`peerpods webhook`, its `PEERPODS_*` twin, the help, the default and docs/configuration.md all
derive from these fields, and so do the defaults of the objects built from them (`ServerConfig`
is itself a section; `Settings`, `Admission`, `CapacityPolicy` and `KubeResolver` take theirs
from `POLICY`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, IPvAnyNetwork

from providers.core.capacity import CapacityType
from providers.core.settings import Flag, Names, Section, listed

__all__ = ["POLICY", "AdmissionPolicy", "NameSet", "ServerSettings", "WebhookPolicy"]

NameSet = Annotated[frozenset[str], BeforeValidator(listed)]


class AdmissionPolicy(Section):
    """What pods may ask for: the webhook enforces it, `peerpods plan` previews it."""

    allowed_machine_types: Annotated[
        Names, Flag("--allowed-machine-types", metavar="TYPE[,...]")
    ] = Field(
        (),
        description="comma-separated instance types users may pin with the machine_type "
        "annotation (empty: none)",
    )
    default_capacity_type: Annotated[CapacityType, Flag("--default-capacity-type")] = Field(
        CapacityType.ON_DEMAND,
        description="capacity type of a pod without the peerpods.io/capacity-type annotation",
    )
    namespace_capacity_types: Annotated[
        str, Flag("--namespace-capacity-types", metavar="NS=TYPE|TYPE[,...]")
    ] = Field(
        "",
        description="capacity types each namespace's pods may ask for, NAMESPACE=TYPE|TYPE[,...] "
        "with * for every other namespace, e.g. 'ml=spot|spot-or-on-demand,*=on-demand'; a "
        "namespace's first type is its default when --default-capacity-type is not allowed "
        "there (empty: any type anywhere)",
    )


class WebhookPolicy(AdmissionPolicy):
    """How the webhook decides: which pods are peer pods, what it refuses, its seal keys, its
    limits on DRA selectors and lookups."""

    seal_key_dir: Annotated[str, Flag("--seal-key-dir")] = Field(
        "/etc/peerpods/seal",
        description="the contract-seal keys, a mounted Secret: `current` seals, every other file "
        "is still accepted (rotation: docs/install.md); never derived from the TLS key",
    )
    runtime_classes: Annotated[NameSet, Flag("--runtime-classes")] = Field(
        frozenset({"kata-remote"}),
        description="comma-separated runtimeClassNames that make a pod a peer pod",
    )
    impossible: Annotated[Literal["deny", "warn"], Flag("--impossible")] = Field(
        "deny",
        description="a GPU request no catalog type can serve: deny the pod, or admit it with a "
        "warning",
    )
    vm_image_namespaces: Annotated[NameSet, Flag("--vm-image-namespaces")] = Field(
        frozenset(),
        description="comma-separated namespaces whose peer pods may choose their pod VM image "
        "and initdata (the image and cc_init_data annotations); elsewhere both are removed",
    )
    allowed_vm_images: Annotated[NameSet, Flag("--allowed-vm-images")] = Field(
        frozenset(),
        description="comma-separated pod VM images any peer pod may choose with the image "
        "annotation",
    )
    cel_timeout_seconds: Annotated[float, Flag("--cel-timeout", duration=True)] = Field(
        5.0,
        gt=0,
        description="wall-clock limit for all DRA selectors of one admission (duration); a pod "
        "whose selectors run longer is denied",
    )
    dra_driver: Annotated[bool, Flag("--dra-driver")] = Field(
        False,
        description="the DRA-driver mode (docs/dra.md): keep nvidia.com/gpu, containers' "
        "resources.claims and spec.resourceClaims for the scheduler to allocate from the pools "
        "of gpu.peerpods.io; claims are never evaluated here, the VM's GPUs come from the "
        "allocation",
    )
    cache_ttl_seconds: Annotated[float, Flag("--cache-ttl", duration=True)] = Field(
        30.0,
        ge=0,
        description="how long claims, templates and device classes read from the API are cached",
    )


POLICY = WebhookPolicy()  # the declared defaults, for objects built in code


class ServerSettings(Section):
    """Where and how the webhook server listens: address, TLS files, the connection and time
    bounds, the CEL worker processes. `webhook.ServerConfig` is this section."""

    host: Annotated[str, Flag("--host")] = Field("0.0.0.0", description="address to listen on")
    port: Annotated[int, Flag("--port")] = Field(
        8443, ge=0, le=65535, description="HTTPS port (0: any free one)"
    )
    cert_file: Annotated[Path, Flag("--tls-cert-file")] = Field(
        Path("/etc/peerpods/tls/tls.crt"),
        description="serving certificate (PEM); re-read when its content changes",
    )
    key_file: Annotated[Path, Flag("--tls-key-file")] = Field(
        Path("/etc/peerpods/tls/tls.key"),
        description="private key of the serving certificate (PEM)",
    )
    max_request_bytes: Annotated[int, Flag("--max-request-bytes")] = Field(
        3 << 20,  # the API server's own limit on an object is 3 MiB
        gt=0,
        description="largest AdmissionReview body accepted, bytes",
    )
    reload_seconds: Annotated[float, Flag("--tls-reload-seconds", duration=True)] = Field(
        10.0, gt=0, description="how often the TLS files are checked for new content (duration)"
    )
    max_connections: Annotated[int, Flag("--max-connections")] = Field(
        256, gt=0, description="open connections at most; one more is closed at once"
    )
    header_timeout_seconds: Annotated[float, Flag("--header-timeout", duration=True)] = Field(
        5.0,
        gt=0,
        description="a connection must send complete request headers within this (duration)",
    )
    body_timeout_seconds: Annotated[float, Flag("--body-timeout", duration=True)] = Field(
        10.0,
        gt=0,
        description="a request body must arrive within this once the headers have (duration; "
        "else 408)",
    )
    cel_workers: Annotated[int, Flag("--cel-workers")] = Field(
        2,
        ge=0,
        description="worker processes that evaluate DRA selectors (killed and replaced when one "
        "runs past --cel-timeout; 0: selectors run in the admission thread)",
    )
    max_connections_per_source: Annotated[int, Flag("--max-connections-per-source")] = Field(
        64,
        gt=0,
        description="open connections from one address at most (the API server's networks "
        "excepted)",
    )
    reserved_connections: Annotated[int, Flag("--reserved-connections")] = Field(
        32,
        ge=0,
        description="connections of --max-connections only the API server's networks may use",
    )
    api_server_networks: Annotated[
        tuple[IPvAnyNetwork, ...], Flag("--api-server-cidrs"), BeforeValidator(listed)
    ] = Field(
        (),
        description="comma-separated networks the API server connects from (e.g. the control "
        "plane's range): exempt from the per-address limit, and the reserve is theirs",
    )
    client_ca_file: Annotated[Path | None, Flag("--client-ca-file")] = Field(
        None,
        description="CA of the API server's client certificate (AdmissionConfiguration "
        "kubeConfig); set, /mutate answers only clients presenting a certificate it issued "
        "(empty: any)",
    )
    # not flags: how long a stop waits for requests in flight, and the start-up GC freeze
    shutdown_seconds: float = 10.0
    freeze_gc: bool = True
