"""Where the node runs, from its cloud's instance metadata service, for settings left unset.

A pod VM belongs next to its node: same region, and on AWS the node's subnet and security
groups (so the node reaches the VM's forwarder on TCP 15150 and the VXLAN tunnel on UDP 4789,
docs/networking.md). When `serve` is not told, each cloud's provider asks the node's metadata
service (`--instance-metadata`, on by default; `AWS_EC2_METADATA_DISABLED=true` turns it off for
AWS as for its SDKs), as CAA does:

- AWS, IMDSv2 (a session token first, then every read with it): region, the primary
  interface's subnet, security groups and VPC.
- Azure IMDS (`Metadata: true`): subscription, resource group and location. It names no
  subnet, so `--azure-subnet-id` stays required.
- GCP's metadata server (`Metadata-Flavor: Google`): project, zone and network.

A provider whose settings still lack what it needs refuses to start, with the reason the
metadata service gave (pod VMs in a default VPC the node cannot reach would fail every pod
later). Calls block (urllib, short timeouts): the daemon builds its provider in a thread.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from providers.clouds.settings import AwsSettings, AzureSettings, CloudSettings, GcpSettings
from providers.core.errors import InvalidRequest, PeerpodsError

log = logging.getLogger(__name__)

AWS_ENDPOINT = "http://169.254.169.254"
AZURE_ENDPOINT = "http://169.254.169.254"
GCP_ENDPOINT = "http://metadata.google.internal"
TIMEOUT_SECONDS = 2.0
_MAX_BYTES = 1 << 20
# The metadata service is link-local: never through an HTTP(S)_PROXY of the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class MetadataUnavailable(PeerpodsError):
    """The instance metadata service did not answer, or not as expected."""


class AwsNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    region: str
    subnet_id: str
    security_group_ids: tuple[str, ...]
    vpc_id: str


class AzureNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    subscription_id: str
    resource_group: str
    location: str


class GcpNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    project: str
    zone: str
    network: str


def _fetch(
    url: str,
    headers: dict[str, str],
    method: str = "GET",
    timeout: float = TIMEOUT_SECONDS,
) -> str:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            body: bytes = response.read(_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise MetadataUnavailable(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MetadataUnavailable(f"{url}: {reason}") from None
    if len(body) > _MAX_BYTES:
        raise MetadataUnavailable(f"{url}: answer larger than {_MAX_BYTES} bytes")
    try:
        return body.decode().strip()
    except UnicodeDecodeError:
        raise MetadataUnavailable(f"{url}: answer is not text") from None


def _last(path: str) -> str:
    """`projects/123/zones/us-central1-a` -> `us-central1-a`."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def aws_node(endpoint: str = AWS_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> AwsNode:
    """The node's region, subnet, security groups and VPC from IMDSv2."""
    base = endpoint.rstrip("/")
    token = _fetch(
        f"{base}/latest/api/token",
        {"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        method="PUT",
        timeout=timeout,
    )
    headers = {"X-aws-ec2-metadata-token": token}

    def read(path: str) -> str:
        return _fetch(f"{base}/latest/meta-data/{path}", headers, timeout=timeout)

    mac = read("mac")
    interface = f"network/interfaces/macs/{mac}"
    node = AwsNode(
        region=read("placement/region"),
        subnet_id=read(f"{interface}/subnet-id"),
        security_group_ids=tuple(read(f"{interface}/security-group-ids").split()),
        vpc_id=read(f"{interface}/vpc-id"),
    )
    if not (node.region and node.subnet_id and node.security_group_ids):
        raise MetadataUnavailable(f"{base}: IMDS named no region, subnet or security group")
    return node


def azure_node(endpoint: str = AZURE_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> AzureNode:
    """The node's subscription, resource group and location from Azure IMDS."""
    url = f"{endpoint.rstrip('/')}/metadata/instance/compute?api-version=2021-02-01"
    text = _fetch(url, {"Metadata": "true"}, timeout=timeout)
    try:
        compute: Any = json.loads(text)
        node = AzureNode(
            subscription_id=str(compute["subscriptionId"]),
            resource_group=str(compute["resourceGroupName"]),
            location=str(compute["location"]),
        )
    except (ValueError, KeyError, TypeError):
        raise MetadataUnavailable(f"{url}: not an instance's compute metadata") from None
    return node


def gcp_node(endpoint: str = GCP_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> GcpNode:
    """The node's project, zone and network from GCP's metadata server."""
    base = f"{endpoint.rstrip('/')}/computeMetadata/v1"
    headers = {"Metadata-Flavor": "Google"}

    def read(path: str) -> str:
        return _fetch(f"{base}/{path}", headers, timeout=timeout)

    return GcpNode(
        project=read("project/project-id"),
        zone=_last(read("instance/zone")),
        network=_last(read("instance/network-interfaces/0/network")),
    )


def _use(settings: CloudSettings) -> bool:
    aws_off = os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"
    return settings.instance_metadata and not (aws_off and isinstance(settings, AwsSettings))


def _unset(settings: BaseModel, found: Mapping[str, Any]) -> dict[str, Any]:
    """What the node's metadata gives for the settings the operator left unset."""
    return {name: value for name, value in found.items() if not getattr(settings, name)}


def complete_aws(settings: AwsSettings) -> AwsSettings:
    """Region, subnet and security groups from IMDSv2 where unset; InvalidRequest when the
    subnet or the security groups are still unknown."""
    import boto3  # noqa: F401 - the provider needs its SDK first (a missing one is the hint)

    if settings.aws_subnet_id and settings.aws_security_group_ids and settings.aws_region:
        return settings
    why = "the instance metadata service is off (--instance-metadata)"
    if _use(settings):
        try:
            node = aws_node(settings.instance_metadata_url or AWS_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"the instance metadata service (IMDSv2) did not answer: {exc}"
        else:
            update = _unset(
                settings,
                {
                    "aws_region": node.region,
                    "aws_subnet_id": (node.subnet_id,),
                    "aws_security_group_ids": node.security_group_ids,
                },
            )
            log.info(
                "aws provider: %s from the node's metadata (VPC %s)",
                ", ".join(f"{k}={v}" for k, v in update.items()),
                node.vpc_id,
            )
            return settings.model_copy(update=update)
    missing = [
        flag
        for flag, value in (
            ("--aws-region", settings.aws_region or _sdk_region()),
            ("--aws-subnet-id", settings.aws_subnet_id),
            ("--aws-security-group-ids", settings.aws_security_group_ids),
        )
        if not value
    ]
    if missing:
        raise InvalidRequest(
            f"aws provider: no {', '.join(missing)} and {why}; set them (pod VMs must share "
            "the node's VPC: docs/networking.md)"
        )
    return settings


def _sdk_region() -> str:
    """The AWS SDK's own region (AWS_REGION, its config files)."""
    import boto3

    return str(boto3.session.Session().region_name or "")


def complete_azure(settings: AzureSettings) -> AzureSettings:
    """Subscription, resource group and location from Azure IMDS where unset; InvalidRequest
    when one of them or the subnet is still unknown."""
    fields = (
        ("--azure-subscription-id", "azure_subscription_id", "subscription_id"),
        ("--azure-resource-group", "azure_resource_group", "resource_group"),
        ("--azure-region", "azure_region", "location"),
    )
    why = "the instance metadata service is off (--instance-metadata)"
    if any(not getattr(settings, name) for _, name, _ in fields) and _use(settings):
        try:
            node = azure_node(settings.instance_metadata_url or AZURE_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"Azure's instance metadata service did not answer: {exc}"
        else:
            update = _unset(settings, {name: getattr(node, attr) for _, name, attr in fields})
            log.info("azure provider: %s from the node's metadata", update)
            settings = settings.model_copy(update=update)
    missing = [flag for flag, name, _ in fields if not getattr(settings, name)]
    if missing:
        raise InvalidRequest(f"azure provider: no {', '.join(missing)} and {why}")
    if not settings.azure_subnet_id:
        raise InvalidRequest(
            "azure provider: no --azure-subnet-id (Azure's metadata service does not name the "
            "node's subnet; give the node's, docs/networking.md)"
        )
    return settings


def complete_gcp(settings: GcpSettings) -> GcpSettings:
    """Project, zone and network from GCP's metadata server where unset."""
    if settings.gcp_project and settings.gcp_zones and settings.gcp_network:
        return settings
    why = "the instance metadata service is off (--instance-metadata)"
    if _use(settings):
        try:
            node = gcp_node(settings.instance_metadata_url or GCP_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"GCP's metadata server did not answer: {exc}"
        else:
            update = _unset(
                settings,
                {
                    "gcp_project": node.project,
                    "gcp_zones": (node.zone,),
                    "gcp_network": node.network,
                },
            )
            log.info("gcp provider: %s from the node's metadata", update)
            return settings.model_copy(update=update)
    if not settings.gcp_project or not settings.gcp_zones:
        raise InvalidRequest(f"gcp provider: --gcp-project and --gcp-zones are required ({why})")
    return settings
