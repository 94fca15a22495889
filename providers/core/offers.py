"""How each cloud sells an instance type: on demand, Spot, Flex-start, a capacity block or a
reservation, and whether it is a confidential VM size.

No cloud API says this per type (EC2 DescribeInstanceTypes lists `SupportedUsageClasses` but not
Capacity Blocks; GCP's machine types and Azure's resource SKUs say nothing), so the rules below
carry the clouds' published terms, and every loader applies them (docs/gpus.md, "How a type is
sold", names the source of each). A type no rule names is sold on demand and as Spot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from providers.core.catalog import DEFAULT_PROVISIONING, Cloud, InstanceType, Provisioning

__all__ = ["Offer", "apply_offer", "offer_for"]


@dataclass(frozen=True)
class Offer:
    """How one type is sold: in general, in zones where that differs, and if confidential."""

    provisioning: tuple[Provisioning, ...] = DEFAULT_PROVISIONING
    zones: tuple[tuple[str, tuple[Provisioning, ...]], ...] = ()
    confidential: bool = False


_RESERVED_SPOT_FLEX: tuple[Provisioning, ...] = ("spot", "flex-start", "reservation")

# (cloud, instance type pattern) -> offer; first match wins.
_RULES: tuple[tuple[str, re.Pattern[str], Offer], ...] = tuple(
    (cloud, re.compile(pattern, re.IGNORECASE), offer)
    for cloud, pattern, offer in (
        # P6e-GB200 UltraServers: EC2 Capacity Blocks for ML only (no on demand, no Spot)
        ("aws", r"^p6e-gb200\.", Offer(("capacity-block",))),
        # P5e: no On-Demand term in the EC2 Price List (Capacity Blocks for ML and Spot only)
        ("aws", r"^p5e\.", Offer(("spot", "capacity-block"))),
        # A4X (GB200): reservations only (AI Hypercomputer consumption options: Flex-start and
        # Spot take any GPU machine except A4X)
        ("gcp", r"^a4x-highgpu-", Offer(("reservation",))),
        # A4 (B200) and A3 Ultra (H200): reservations, Flex-start and Spot
        ("gcp", r"^a4-highgpu-", Offer(_RESERVED_SPOT_FLEX)),
        ("gcp", r"^a3-ultragpu-", Offer(_RESERVED_SPOT_FLEX)),
        # A3 High with 1, 2 or 4 GPUs: Spot and Flex-start only
        ("gcp", r"^a3-highgpu-[124]g$", Offer(("spot", "flex-start"))),
        # NCC H100 v5: confidential VMs (AMD SEV-SNP with the H100 in confidential mode)
        ("azure", r"^(Standard_)?NCC\d+ads_H100_v5$", Offer(confidential=True)),
    )
)


def offer_for(cloud: Cloud | str, instance_type: str) -> Offer:
    """How `instance_type` is sold on `cloud` (on demand and Spot when no rule names it)."""
    for rule_cloud, pattern, offer in _RULES:
        if rule_cloud == cloud and pattern.match(instance_type):
            return offer
    return Offer()


def apply_offer(cloud: Cloud | str, t: InstanceType) -> InstanceType:
    """The type with how its cloud sells it recorded."""
    offer = offer_for(cloud, t.name)
    zones = tuple((z, ways) for z, ways in offer.zones if not t.zones or z in t.zones)
    return t.model_copy(
        update={
            "provisioning": offer.provisioning,
            "zone_provisioning": zones,
            "confidential": offer.confidential,
        }
    )
