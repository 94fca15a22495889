"""Settings of `peerpods serve`, validated once at start so a bad flag fails before anything runs.

`ServeSettings` is the serve section: its own fields plus the lower layers' sections it inherits
(`adaptor.settings`), each field declared once with its flag (`providers.core.settings` says how
to add one). The CLI derives the flags and env twins from these fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError

from adaptor.settings import (
    AgentTls,
    PodNetworkSettings,
    ReclaimSettings,
    SandboxSettings,
    WarmPoolSettings,
)
from providers.clouds import registry
from providers.clouds.static import Endpoint, parse_endpoints
from providers.core.errors import InvalidRequest
from providers.core.settings import Flag, Section, describe, listed

__all__ = ["AgentTls", "ServeSettings"]


def _endpoints(value: object) -> object:
    if isinstance(value, str):
        return parse_endpoints(value)
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        return parse_endpoints(",".join(value))
    return value


def _quota(value: str) -> str:
    from providers.core.quota import parse_quota

    try:
        parse_quota(value)
    except InvalidRequest as exc:
        raise ValueError(str(exc)) from None
    return value


def _listen_address(value: str) -> str:
    """HOST:PORT (IPv6 as [::]:PORT), checked when the settings are read: a typo stops `serve`
    at once with one line, before it takes anything over."""
    if value:
        host, sep, port = value.rpartition(":")
        if not sep or not host.strip("[]") or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"want HOST:PORT, got {value!r}")
    return value


class ServeSettings(
    SandboxSettings, ReclaimSettings, PodNetworkSettings, WarmPoolSettings, Section
):
    """Everything the node daemon is configured with."""

    socket: Annotated[Path, Flag("--socket")] = Field(
        Path("/run/peerpod/hypervisor.sock"),
        description="unix socket of the hypervisor.Hypervisor service (mode 0600)",
    )
    state_dir: Annotated[Path, Flag("--state-dir")] = Field(
        Path("/var/lib/peerpods"), description="directory of the durable sandbox database"
    )
    provider: Annotated[str, Flag("--provider", choices=tuple(registry.names()))] = Field(
        "static", description="where pod VMs come from"
    )
    owner_id: Annotated[str, Flag("--owner-id")] = Field(
        "",
        description="owner tag value on this node's VMs; must differ per node, as orphan sweeps "
        "delete owned VMs this node does not know (default: peerpods-<hostname>)",
    )
    shutdown_grace_seconds: Annotated[float, Flag("--shutdown-grace", duration=True)] = Field(
        10.0, ge=0, description="how long in-flight calls may finish after SIGTERM"
    )
    shutdown_drain_seconds: Annotated[float, Flag("--shutdown-drain", duration=True)] = Field(
        15.0,
        ge=0,
        description="after SIGTERM the agent sockets close first (Kata's Go shim then stops its "
        "pod with one StopVM); how long the hypervisor socket stays to take those StopVMs and "
        "finish their teardowns",
    )
    take_over: Annotated[Literal["auto", "always", "never"], Flag("--take-over")] = Field(
        "auto",
        description="take the sockets over from a running serve (an upgrade its pods do not "
        "notice, docs/upgrade.md): auto: when one holds the same --state-dir; always: one must; "
        "never: refuse to start beside one",
    )
    after_hand_off: Annotated[Literal["exit", "wait"], Flag("--after-hand-off")] = Field(
        "exit",
        description="what a serve that handed its sockets over does: exit, or wait idle for "
        "SIGTERM (in a DaemonSet pod, so the kubelet does not restart it and it takes the "
        "sockets back)",
    )
    allowed_machine_types: Annotated[
        tuple[str, ...], Flag("--allowed-machine-types"), BeforeValidator(listed)
    ] = Field(
        (),
        description="comma-separated instance types a pod may pin with the machine_type "
        "annotation (empty: none; a pod pinning another is refused at CreateVM)",
    )
    allowed_images: Annotated[
        tuple[str, ...], Flag("--allowed-images"), BeforeValidator(listed)
    ] = Field(
        (),
        description="comma-separated pod VM images a pod may choose with the image annotation "
        "(empty: none; the node's image is used)",
    )
    static_endpoints: Annotated[
        tuple[Endpoint, ...], Flag("--static-endpoints"), BeforeValidator(_endpoints)
    ] = Field(
        (),
        description="the static provider's pod VMs, HOST:PORT[,...]; one sandbox each at a time",
    )
    metrics_address: Annotated[str, Flag("--metrics-address"), AfterValidator(_listen_address)] = (
        Field(
            "",
            description="HOST:PORT of a listener serving only GET /metrics, apart from the status "
            "API, for a PodMonitor (e.g. 0.0.0.0:8007); it shows no sandbox, checks Host, caps "
            "connections and times out slow requests; empty: off (metrics on the status API only)",
        )
    )
    status_address: Annotated[str, Flag("--status-address")] = Field(
        "127.0.0.1:8006",
        description="HOST:PORT of the status API (/v1/sandboxes, /healthz, /metrics); empty: off",
    )
    catalog_dir: Annotated[str, Flag("--catalog-dir")] = Field(
        "", description="directory of instance-type catalog snapshots (default: the bundled ones)"
    )
    gpu_quota: Annotated[str, Flag("--gpu-quota"), AfterValidator(_quota)] = Field(
        "",
        description="shared GPU quota pool of this node's sandboxes, KEY=LIMIT[,...]: a GPU "
        "model (h100=8), gpus:MODEL, gpus (any model), family:FAMILY (its GPUs), vcpus:FAMILY, "
        "vcpus; StartVM drops candidates over it and fails with 'quota for H100 exhausted "
        "(8/8)' when none is left (default: off)",
    )
    account_quota_refresh_seconds: float = Field(
        60.0, gt=0, description="how often the cloud account's quota is read again"
    )
    agent_tls: AgentTls = Field(default_factory=AgentTls)
    # This node's peer-pod capacity on its Node status (adaptor.node.advertise).
    node_name: Annotated[str, Flag("--node-name")] = Field(
        "",
        description="the Kubernetes Node this daemon runs on: its status gets "
        "kata.peerpods.io/vm (--vm-capacity), patched at start and restored whenever it differs "
        "(needs get on nodes and patch on nodes/status); empty: not advertised",
    )
    vm_capacity: Annotated[int, Flag("--vm-capacity")] = Field(
        10,
        ge=0,
        description="how many peer pods this node may run (kata.peerpods.io/vm on its Node)",
    )
    quota_capacity: Annotated[int, Flag("--quota-capacity")] = Field(
        4096,
        ge=0,
        description="kata.peerpods.io/gpu and kata.peerpods.io/mig on its Node: not a limit (the "
        "cloud's capacity and namespace ResourceQuotas are), only what lets the GPU peer pods "
        "that carry them schedule",
    )
    capacity_check_interval_seconds: float = Field(
        30.0, gt=0, description="how often the advertised capacity is checked and restored"
    )

    @classmethod
    def build(cls, **fields: object) -> ServeSettings:
        """Validate; a bad value raises InvalidRequest naming the setting."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise InvalidRequest(describe(cls, exc, by_flag=False)) from None
