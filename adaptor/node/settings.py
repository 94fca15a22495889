"""Settings of `peerpods serve`, validated once at start so a bad flag fails before anything runs.

Every field names its unit; the CLI fills them from flags (each with its PEERPODS_* env twin).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from providers.clouds.static import Endpoint, parse_endpoints
from providers.core.errors import InvalidRequest


class AgentTls(BaseModel):
    """Mutual TLS towards the pod VM forwarder (its CA, our client certificate and key).

    Without files, the adaptor's own CA under --state-dir signs both ends: each pod VM gets its
    server certificate in its user data, and the adaptor dials with its client certificate.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="after")
    def _files_when_enabled(self) -> Self:
        files = (
            ("--agent-tls-ca", self.ca_file),
            ("--agent-tls-cert", self.cert_file),
            ("--agent-tls-key", self.key_file),
        )
        given = [flag for flag, value in files if value is not None]
        if self.enabled and given and len(given) != len(files):
            missing = [flag for flag, value in files if value is None]
            raise ValueError(
                f"{', '.join(missing)} not set: give all three TLS files, or none to use the "
                "adaptor's own CA under --state-dir (or --no-agent-tls)"
            )
        if self.enabled:
            for path in (self.ca_file, self.cert_file, self.key_file):
                if path is not None and not path.is_file():
                    raise ValueError(f"agent TLS file {path} does not exist")
        return self


class ServeSettings(BaseModel):
    """Everything the node daemon is configured with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    socket: Path = Field(Path("/run/peerpod/hypervisor.sock"), description="hypervisor socket")
    pods_dir: Path = Field(Path("/run/peerpod/pods"), description="agent sockets, one dir each")
    state_dir: Path = Field(Path("/var/lib/peerpods"), description="the sandbox database")
    provider: str = "static"
    owner_id: str = Field("", description="this node's owner tag value on its VMs")
    forwarder_port: int = Field(15150, ge=1, le=65535)
    proxy_timeout_seconds: float = Field(300.0, gt=0, description="StartVM's forwarder wait")
    start_timeout_seconds: float = Field(900.0, gt=0, description="StartVM's own limit")
    stop_wait_seconds: float = Field(
        60.0, ge=0, description="StopVM's wait for the delete (no deadline given)"
    )
    reap_grace_seconds: float = Field(
        600.0, ge=0, description="failed/stopping sandboxes' VMs deleted after this; 0: off"
    )
    shutdown_grace_seconds: float = Field(10.0, ge=0, description="in-flight calls at exit")
    shutdown_drain_seconds: float = Field(
        15.0, ge=0, description="at exit, the wait for the StopVMs of the shims it disconnects"
    )
    reconnect_grace_seconds: float = Field(
        300.0, ge=0, description="a recovered sandbox's wait for its shim; 0: forever"
    )
    gc_interval_seconds: float = Field(300.0, ge=0, description="orphan VM sweeps; 0: off")
    preemption_check_interval_seconds: float = Field(
        30.0, ge=0, description="lost-VM sweeps of running sandboxes; 0: on connection loss only"
    )
    static_endpoints: tuple[Endpoint, ...] = ()
    status_address: str = Field("", description="status API HOST:PORT ('': off; CLI default on)")
    catalog_dir: str = Field("", description="catalog snapshots (default: the bundled ones)")
    gpu_quota: str = Field("", description="GPU quota pool, e.g. 'h100=8,vcpus:p5=192'; '': off")
    agent_tls: AgentTls = Field(default_factory=AgentTls)
    allowed_machine_types: tuple[str, ...] = Field((), description="types a pod may pin")
    allowed_images: tuple[str, ...] = Field((), description="pod VM images a pod may choose")
    # Pod networking, CAA's flags with CAA's defaults.
    vxlan_min_id: int = Field(555000, ge=1, le=(1 << 24) - 1, description="first VNI")
    vxlan_port: int = Field(4789, ge=1, le=65535, description="VXLAN UDP port")
    pod_subnet_cidrs: tuple[str, ...] = Field((), description="extra routes via the pod gateway")
    host_interface: str = Field("", description="worker NIC of the tunnel ('': primary)")
    ext_network_via_podvm: bool = False
    # This node's peer-pod capacity on its Node status (adaptor.node.advertise).
    node_name: str = Field("", description="the Node to advertise capacity on ('': off)")
    vm_capacity: int = Field(10, ge=0, description="kata.peerpods.io/vm advertised (peer pods)")
    capacity_check_interval_seconds: float = Field(
        30.0, gt=0, description="how often the advertised capacity is checked and restored"
    )

    @field_validator("pod_subnet_cidrs", mode="before")
    @classmethod
    def _cidrs(cls, value: object) -> object:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        cidrs = []
        for item in items:
            text = str(item).strip()
            if not text:
                continue
            try:
                ipaddress.IPv4Network(text)
            except ValueError as exc:
                raise ValueError(f"{text!r} is not an IPv4 CIDR: {exc}") from None
            cidrs.append(text)
        return tuple(cidrs)

    @field_validator("pods_dir")
    @classmethod
    def _no_colon(cls, value: Path) -> Path:
        # The shim splits "remote:<path>" on ":", so the agent socket path must not carry one.
        if ":" in str(value):
            raise ValueError("must not contain ':'")
        return value

    @field_validator("gpu_quota")
    @classmethod
    def _quota(cls, value: str) -> str:
        from providers.core.quota import parse_quota

        try:
            parse_quota(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("static_endpoints", mode="before")
    @classmethod
    def _endpoints(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_endpoints(value)
        return value

    @classmethod
    def build(cls, **fields: object) -> ServeSettings:
        """Validate; a bad value raises InvalidRequest naming the setting."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "settings"
            message = str(first["msg"]).removeprefix("Value error, ")
            raise InvalidRequest(f"{where}: {message}") from None
