"""The cloud providers' settings, one section each (`providers.core.settings` says how to add
one); `peerpods serve` derives their flags, and a provider is built from its typed section.

Light on purpose: the registry lists these sections without importing any cloud SDK.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from providers.core.settings import Flag, Names, Section

CONFIDENTIAL_TYPES = ("SEV", "SEV_SNP", "TDX")


def _confidential(value: str) -> str:
    upper = value.strip().upper()
    if upper and upper not in CONFIDENTIAL_TYPES:
        raise ValueError(
            f"not a confidential VM type (choose from {', '.join(CONFIDENTIAL_TYPES)})"
        )
    return upper


class CloudSettings(Section):
    """What every cloud provider takes (CAA's names)."""

    instance_type: Annotated[str, Flag("--instance-type")] = Field(
        "", description="instance type when selection gives none"
    )
    allowed_instance_types: Annotated[Names, Flag("--allowed-instance-types")] = Field(
        (),
        description="comma-separated instance type globs pod VMs may use, e.g. g6.*,p5.48xlarge "
        "(empty: any)",
    )
    pod_vm_image: Annotated[str, Flag("--pod-vm-image")] = Field(
        "", description="pod VM image (a pod annotation may override)"
    )
    instance_metadata: Annotated[bool, Flag("--instance-metadata", valued=True)] = Field(
        True,
        description="take the region, network and (AWS) subnet and security groups left unset "
        "from the node's instance metadata service (true/false)",
    )
    instance_metadata_url: Annotated[str, Flag("--instance-metadata-url")] = Field(
        "", description="the metadata service to ask (default: the cloud's own address)"
    )
    capacity_reservation: Annotated[str, Flag("--capacity-reservation")] = Field(
        "",
        max_length=256,
        description="a capacity reservation or block to launch into (AWS Capacity Block or "
        "capacity reservation id cr-..., GCP reservation name): types the cloud sells only that "
        "way (AWS P6e-GB200, GCP A4/A4X/A3 Ultra on demand) become candidates (empty: never)",
    )
    max_candidate_types: Annotated[int, Flag("--max-candidate-types")] = Field(
        8,
        ge=1,
        le=64,
        description="how many of selection's ranked instance types one StartVM may try, each in "
        "every zone, in each market pass (Spot, then on-demand)",
    )
    max_launches_per_pass: Annotated[int, Flag("--max-launches-per-pass")] = Field(
        0,
        ge=0,
        description="create calls one market pass may make; 0: one per candidate type and zone "
        "(types x zones, each with its transient retries), so every placement is tried",
    )


class AwsSettings(CloudSettings):
    """The aws provider (CAA-compatible names where CAA has one)."""

    aws_region: Annotated[str, Flag("--aws-region")] = Field(
        "", description="AWS region (default: the SDK's, e.g. AWS_REGION)"
    )
    aws_image_id: Annotated[str, Flag("--aws-image-id")] = Field(
        "", description="AMI of the pod VM (overrides --pod-vm-image)"
    )
    aws_subnet_id: Annotated[Names, Flag("--aws-subnet-id")] = Field(
        (), description="subnets, comma-separated: one zone each, in order"
    )
    aws_zones: Annotated[Names, Flag("--aws-zones")] = Field(
        (), description="availability zones to try when no subnet is given"
    )
    aws_security_group_ids: Annotated[Names, Flag("--aws-security-group-ids")] = Field(
        (), description="security groups, comma-separated"
    )
    aws_key_name: Annotated[str, Flag("--aws-key-name")] = Field(
        "", description="EC2 key pair for the pod VM (debugging only)"
    )
    aws_endpoint_url: Annotated[str, Flag("--aws-endpoint-url")] = Field(
        "", description="EC2 endpoint override (a local test server)"
    )
    aws_use_public_ip: Annotated[bool, Flag("--aws-use-public-ip", valued=True)] = Field(
        False, description="dial the pod VM's public address (true/false)"
    )
    aws_root_volume_gib: Annotated[int, Flag("--aws-root-volume-gib")] = Field(
        0,
        ge=0,
        le=16384,
        description="root volume of the pod VM in GiB, gp3 (CUDA images are large; 0: the AMI's)",
    )


class AzureSettings(CloudSettings):
    """The azure provider (CAA-compatible names)."""

    azure_subscription_id: Annotated[str, Flag("--azure-subscription-id")] = Field(
        "", description="subscription of the pod VMs"
    )
    azure_resource_group: Annotated[str, Flag("--azure-resource-group")] = Field(
        "", description="resource group of the pod VMs"
    )
    azure_region: Annotated[str, Flag("--azure-region")] = Field(
        "", description="location, e.g. eastus"
    )
    azure_subnet_id: Annotated[str, Flag("--azure-subnet-id")] = Field(
        "", description="subnet resource id for the pod VMs' NICs"
    )
    azure_image_id: Annotated[str, Flag("--azure-image-id")] = Field(
        "", description="pod VM image id (overrides --pod-vm-image)"
    )
    azure_ssh_key: Annotated[str, Flag("--azure-ssh-key")] = Field(
        "", description="SSH public key for the pod VM admin (debugging)"
    )
    azure_zones: Annotated[Names, Flag("--azure-zones")] = Field(
        (), description="availability zones to try, e.g. 1,2,3"
    )
    azure_os_disk_gib: Annotated[int, Flag("--azure-os-disk-gib")] = Field(
        0,
        ge=0,
        le=4095,
        description="OS disk of the pod VM in GiB (CUDA images are large; 0: the image's)",
    )


class GcpSettings(CloudSettings):
    """The gcp provider."""

    gcp_project: Annotated[str, Flag("--gcp-project")] = Field(
        "", description="project of the pod VMs"
    )
    gcp_zones: Annotated[Names, Flag("--gcp-zones")] = Field(
        (), description="zones, comma-separated, tried in order"
    )
    gcp_image: Annotated[str, Flag("--gcp-image")] = Field(
        "", description="pod VM image (overrides --pod-vm-image)"
    )
    gcp_network: Annotated[str, Flag("--gcp-network")] = Field(
        "global/networks/default", description="VPC network"
    )
    gcp_subnetwork: Annotated[str, Flag("--gcp-subnetwork")] = Field("", description="subnetwork")
    gcp_disk_type: Annotated[str, Flag("--gcp-disk-type")] = Field(
        "pd-balanced", description="boot disk type"
    )
    gcp_disk_gib: Annotated[int, Flag("--gcp-disk-gib")] = Field(
        20, ge=10, le=65536, description="boot disk of the pod VM in GiB"
    )
    gcp_confidential_type: Annotated[
        str, Flag("--gcp-confidential-type"), AfterValidator(_confidential)
    ] = Field("", description="SEV, SEV_SNP or TDX for confidential VMs")
    gcp_use_public_ip: Annotated[bool, Flag("--gcp-use-public-ip", valued=True)] = Field(
        False, description="dial the pod VM's external address (true/false)"
    )
