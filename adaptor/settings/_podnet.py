"""The pod network's settings: CAA's networking flags, same names, defaults and meaning."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from providers.core.settings import Flag, Section, listed


def _ipv4_cidrs(items: tuple[str, ...]) -> tuple[str, ...]:
    cidrs = []
    for item in items:
        text = item.strip()
        if not text:
            continue
        try:
            ipaddress.IPv4Network(text)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not an IPv4 CIDR: {exc}") from None
        cidrs.append(text)
    return tuple(cidrs)


class PodNetworkSettings(Section):
    """The VXLAN tunnel between the pod's network namespace and its pod VM."""

    vxlan_min_id: Annotated[int, Flag("--vxlan-min-id")] = Field(
        555000,
        ge=1,
        le=(1 << 24) - 1,
        description="first VXLAN id (VNI) of pod tunnels; each sandbox holds its own until StopVM",
    )
    vxlan_port: Annotated[int, Flag("--vxlan-port")] = Field(
        4789, ge=1, le=65535, description="UDP port of pod tunnels"
    )
    pod_subnet_cidrs: Annotated[
        tuple[str, ...],
        Flag("--pod-subnet-cidrs"),
        BeforeValidator(listed),
        AfterValidator(_ipv4_cidrs),
    ] = Field(
        (),
        description="CIDR[,...] the pod VM routes via the pod's gateway (e.g. the service network)",
    )
    host_interface: Annotated[str, Flag("--host-interface")] = Field(
        "",
        description="worker interface the pod tunnels run over (default: the one of the default "
        "route); another one is a dedicated NIC, and the tunnel goes to the VM's second address",
    )
    ext_network_via_podvm: Annotated[bool, Flag("--ext-network-via-podvm")] = Field(
        False,
        description="tell pod VMs to reach external networks through their own secondary NIC "
        "(experimental in CAA's pod VM)",
    )
